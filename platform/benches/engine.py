"""``lumotree bench engine``: AR decode step time of the engine (CUDA graphs) against the weight-read floor.

Builds a random-weight model of the chosen shapes (default: the paper's 27B layout, bf16), runs ``--batch``
requests through the real engine, and times (a) the runner's decode forward alone (graph replay) and (b)
whole engine steps (forward + walk + bookkeeping + the step's one device sync). The floor is the bytes of
weights one decode step reads (``bench decode``'s ``weight_read_bytes``: every matrix but the embedding
table, the MTP head excluded) over the measured device copy bandwidth. Prints and writes one JSON object.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lumotree.platform.benches import emit
from lumotree.platform.benches.decode import SHAPES, copy_bandwidth, random_model, weight_read_bytes


def _ms(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median_ms": 1000 * statistics.median(s), "p10_ms": 1000 * s[len(s) // 10],
            "p90_ms": 1000 * s[min(len(s) - 1, 9 * len(s) // 10)], "n": len(s)}  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command("engine")
    def engine_bench(
        shape: Annotated[str, typer.Option(help="Model shapes: 27b | tiny.")] = "27b",
        batch: Annotated[str, typer.Option(help="Comma-separated decode batch sizes.")] = "1",
        steps: Annotated[int, typer.Option(help="Timed decode steps per batch size.")] = 50,
        prompt_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 128,
        device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda if available).")] = None,
        dtype: Annotated[str, typer.Option(help="bfloat16 | float16 | float32.")] = "bfloat16",
        cuda_graphs: Annotated[bool, typer.Option(help="Capture decode as CUDA graphs.")] = True,
        out: Annotated[Path | None, typer.Option(help="Write the JSON here too.")] = None,
    ) -> None:
        """Decode step time of the AR engine vs the weight-read floor."""
        started = time.time()
        import torch

        from lumotree.serving.engine import Engine, EngineConfig
        from lumotree.serving.sampler import SamplingParams

        if shape not in SHAPES:
            raise typer.BadParameter(f"unknown shape {shape!r}; choose {', '.join(SHAPES)}")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dt = getattr(torch, dtype)
        sizes = [int(b) for b in batch.split(",")]
        model = random_model(shape, dev, dt)
        weight_bytes = weight_read_bytes(model)
        bandwidth = copy_bandwidth(dev, 1 << 30) if dev.type == "cuda" else None
        floor_ms = 1000 * weight_bytes / bandwidth if bandwidth else None
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        results = []
        for b in sizes:
            cfg = EngineConfig(
                device=str(dev), max_seqs=b, max_model_len=prompt_len + steps + 16, cuda_graphs=cuda_graphs,
                graph_batch_sizes=(b,), max_prefill_tokens=prompt_len * b,
            )  # fmt: skip
            eng = Engine(model, None, cfg, model_name=f"random-{shape}")
            params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
            prompt = [(7 * i + 3) % model.config.vocab_size for i in range(prompt_len)]
            reqs = [eng.add_request(prompt, params) for _ in range(b)]
            eng.step()  # prefill all
            for _ in range(3):
                eng.step()
            forward, step = [], []
            # The runner's decode forward alone (graph replay when captured). It re-decodes the same pending
            # tokens, advancing state the engine does not book: harmless for timing random weights.
            for _ in range(steps // 2):
                sync()
                t = time.perf_counter()
                eng.runner.decode(reqs)
                sync()
                forward.append(time.perf_counter() - t)
            for _ in range(steps // 2):  # whole engine steps
                sync()
                t = time.perf_counter()
                eng.step()
                sync()
                step.append(time.perf_counter() - t)
            for r in reqs:
                eng.abort(r.req_id)
            row: dict[str, Any] = {"batch": b, "forward": _ms(forward), "engine_step": _ms(step),
                   "cuda_graphs": bool(eng.runner.graphs), "graph_error": eng.runner.graph_error}  # fmt: skip
            if floor_ms:
                row["forward_over_floor"] = row["forward"]["median_ms"] / floor_ms
                row["step_over_floor"] = row["engine_step"]["median_ms"] / floor_ms
            results.append(row)
            del eng
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        report = {
            "bench": "engine", "shape": shape, "dtype": dtype, "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "weight_bytes": weight_bytes, "copy_bandwidth_Bps": bandwidth, "floor_ms": floor_ms,
            "prompt_len": prompt_len, "results": results,
        }  # fmt: skip
        emit(report, str(dev), started, out)
