"""``lumotree bench engine``: AR decode step time of the engine (CUDA graphs) against the weight-read floor.

Builds a random-weight model of the chosen shapes (default: the paper's 27B layout, bf16), runs ``--batch``
requests through the real engine, and times (a) the runner's decode forward alone (graph replay) and (b)
whole engine steps (forward + walk + bookkeeping + the step's one device sync). The floor is the bytes of
weights one decode step reads (linear layers + embeddings row + lm_head; the MTP head is not read by AR)
over the measured device copy bandwidth. Prints and writes one JSON object.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer

SHAPES: dict[str, dict[str, Any]] = {
    # The paper's model: 64 layers = 16 x (3 GDN + 1 gated attention).
    "27b": {
        "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "max_position_embeddings": 32768,
    },
    "tiny": {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 4096,
    },
}  # fmt: skip


def _copy_bandwidth(torch: Any, device: Any) -> float | None:
    """Bytes per second of a large device-to-device copy (read + write counted); None off CUDA."""
    if device.type != "cuda":
        return None
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    return 2 * n / statistics.median(times)


def _random_model(shape: str, device: Any, dtype: Any) -> Any:
    import torch

    from lumotree.serving.config import ModelConfig
    from lumotree.serving.model import HybridModel

    config = ModelConfig.from_dict({"model_type": "qwen3_5_text", **SHAPES[shape]}, source=f"shape {shape}")
    with torch.device("meta"):
        model = HybridModel(config)
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(0.0, 1.0, generator=gen)
            elif p.dim() == 1:
                p.normal_(0.0, 0.1, generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def _decode_weight_bytes(model: Any) -> int:
    """Bytes one AR decode step must read: every parameter except the embedding table (one row is read)."""
    total = 0
    for name, p in model.named_parameters():
        if name.startswith("mtp."):
            continue
        if name.startswith("embed_tokens") and not model.config.tie_word_embeddings:
            total += p.shape[1] * p.element_size()
            continue
        total += p.numel() * p.element_size()
    return total


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
        import torch

        from lumotree.serving.engine import Engine, EngineConfig
        from lumotree.serving.sampler import SamplingParams

        if shape not in SHAPES:
            raise typer.BadParameter(f"unknown shape {shape!r}; choose {', '.join(SHAPES)}")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dt = getattr(torch, dtype)
        sizes = [int(b) for b in batch.split(",")]
        model = _random_model(shape, dev, dt)
        weight_bytes = _decode_weight_bytes(model)
        bandwidth = _copy_bandwidth(torch, dev)
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
        text = json.dumps(report, indent=2)
        print(text)
        if out is not None:
            out.write_text(text + "\n")
