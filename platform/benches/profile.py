"""``lumotree bench profile``: where an arm's step spends its device time, kernel by kernel.

The arms of ``bench arms`` on the same random-weight model, batch 1: after warm-up steps, ``--steps`` engine
steps run under ``torch.profiler``. On CUDA every kernel's device time is summed by name and by group (GEMM,
tree scan, native GDN, attention, norms, elementwise and copies, other), per step; on CPU the operators' own
CPU time stands in, so the command can be tried anywhere. Steps run eagerly by default (``--cuda-graphs``
to profile graph replays): kernels inside a captured graph keep their device time either way, but eager
launches are what shows the host gaps between them.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lumotree.platform.benches import emit

GROUPS: tuple[tuple[str, str], ...] = (
    ("tree_scan", r"tree_scan"),
    ("gdn_native", r"fused_recurrent|gated_delta|chunk_"),
    ("attention", r"attention|attn|_attend|paged"),
    ("gemm", r"gemm|gemv|cutlass|cublas|nvjet|xmma|matmul|addmm|\bmm\b|linear"),
    ("norm", r"norm|rms"),
    (
        "elementwise_copy",
        r"elementwise|vectorized|copy|fill|index|gather|scatter|cat|reduce|softmax|topk|sort",
    ),
    ("torch_ops", r"^aten::"),
)
"""Kernel-name patterns, tried in order (the first that matches names the group)."""


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, pat in GROUPS if re.search(pat, low)), "other")


def summarize(events: list[tuple[str, int, float]], steps: int, top: int) -> dict[str, Any]:
    """(name, calls, microseconds) per kernel or operator -> per-step totals, groups and the top entries."""
    per = sorted(((n, c / steps, us / steps / 1e3) for n, c, us in events if us > 0), key=lambda e: -e[2])
    groups: dict[str, float] = {}
    for name, _, ms in per:
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + ms
    return {
        "ms_per_step": sum(ms for _, _, ms in per),
        "groups_ms_per_step": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "top": [{"name": n[:160], "calls_per_step": c, "ms_per_step": ms, "group": group_of(n)}
                for n, c, ms in per[:top]],
    }  # fmt: skip


def device_gaps(kernels: list[tuple[float, float, str]], steps: int, top: int) -> dict[str, Any]:
    """Where the device waits: kernels (start us, end us, name) -> busy and idle time per step between the
    first kernel's start and the last one's end, and the idle gaps grouped by the kernels on either side
    (the one that finished last before the gap, the one that starts it), largest total first. A gap between
    a drafting kernel and the verify forward's first is host work the step cannot hide."""
    if not kernels:
        return {"busy_ms_per_step": 0.0, "idle_ms_per_step": 0.0, "gaps": []}
    ks = sorted(kernels)
    lo, hi, before = ks[0][0], ks[0][1], ks[0][2]
    busy, first = 0.0, lo
    gaps: dict[tuple[str, str], list[float]] = {}
    for start, end, name in ks[1:]:
        if start > hi:
            gaps.setdefault((before, name), []).append(start - hi)
            busy += hi - lo
            lo, hi, before = start, end, name
        elif end >= hi:
            hi, before = end, name
    busy += hi - lo
    rows = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "busy_ms_per_step": busy / steps / 1e3,
        "idle_ms_per_step": (hi - first - busy) / steps / 1e3,
        "gaps": [{"after": a[:100], "before": b[:100], "per_step": len(g) / steps,
                  "ms_per_step": sum(g) / steps / 1e3, "max_us": max(g)} for (a, b), g in rows],
    }  # fmt: skip


def profile_arm(model: Any, arm: str, opts: dict[str, Any], eagle: Any, prompt: list[int], steps: int,
                warmup: int, graphs: bool, top: int) -> dict[str, Any]:  # fmt: skip
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lumotree.platform.benches.arms import arm_engine

    eng, req = arm_engine(model, arm, opts, eagle, prompt, warmup + steps, graphs)
    for _ in range(warmup):
        eng.step()
    cuda = model.embed_tokens.weight.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            eng.step()
        if cuda:
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    if req.finished:
        raise RuntimeError(f"{arm}: the request finished before the profiled steps ended")
    eng.abort(req.req_id)
    gaps = None
    if cuda:
        gaps = device_gaps(
            [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
             if str(e.device_type).endswith("CUDA") and e.time_range.end > e.time_range.start],
            steps, top,
        )  # fmt: skip
    events = []
    for e in prof.key_averages():
        on_device = str(e.device_type).endswith("CUDA")
        if cuda and on_device:
            events.append((e.key, e.count, e.self_device_time_total))
        elif not cuda and not on_device:
            events.append((e.key, e.count, e.self_cpu_time_total))
    return {"wall_ms_per_step": wall, "timing": "device" if cuda else "cpu_self",
            **summarize(events, steps, top), "device_gaps": gaps}  # fmt: skip


def run(shapes: str, device_name: str, arms: list[str], prompt_len: int, steps: int, warmup: int,
        graphs: bool, top: int, draft_vocab: int,
        model_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    import torch

    from lumotree.platform.benches.arms import arm_runs

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model, eagle, prompt = (
        _checkpoint(model_path, device, prompt_len)
        if model_path
        else _random(shapes, device, dtype, prompt_len)
    )
    runs = arm_runs(draft_vocab)
    unknown = [a for a in arms if a not in runs]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {', '.join(runs)}")
    report: dict[str, Any] = {"bench": "profile", "shapes": None if model_path else shapes,
                              "model": model_path, "device": device_name, "steps": steps,
                              "prompt_len": prompt_len, "cuda_graphs": graphs, "draft_vocab": draft_vocab,
                              "arms": {}}  # fmt: skip
    for name in arms:
        arm, opts = runs[name]
        report["arms"][name] = profile_arm(model, arm, opts, eagle, prompt, steps, warmup, graphs, top)
    return report


def _random(shapes: str, device: Any, dtype: Any, prompt_len: int) -> tuple[Any, Any, list[int]]:
    """Random weights of the named shapes, a random EAGLE layer and an arithmetic prompt."""
    from lumotree.platform.benches import decode
    from lumotree.serving.drafters.eagle import random_eagle_layer

    model = decode.random_model(shapes, device, dtype, mtp=True)
    eagle = random_eagle_layer(model.config, device, dtype)
    return model, eagle, [(7 * i + 3) % model.config.vocab_size for i in range(prompt_len)]


def _checkpoint(name: str, device: Any, prompt_len: int) -> tuple[Any, Any, list[int]]:
    """A real checkpoint (``tiny`` = the built-in model) in the dtype the engine would load it in, its EAGLE
    head's folder and the tail of its first held-out prompt, so drafts are accepted as in use (random
    weights accept nothing)."""
    from lumotree.platform.benches.acceptance import PROMPTS_FILE, load_prompts
    from lumotree.serving.builtin import resolve_model
    from lumotree.serving.drafters.eagle import EAGLE_DIR
    from lumotree.serving.loader import device_dtype, load_model
    from lumotree.serving.tokenizer import Tokenizer

    path = resolve_model(name)
    model = load_model(path, device, device_dtype(None, device))[0]
    prompts = load_prompts(path / PROMPTS_FILE, Tokenizer.from_pretrained(path), 1)
    if not prompts:
        raise ValueError(f"{path / PROMPTS_FILE} holds no prompt")
    return model, path / EAGLE_DIR, prompts[0].token_ids[-prompt_len:]


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    for name, r in report["arms"].items():
        t = Table(title=f"{name}: {r['ms_per_step']:.3f} ms of {r['timing']} time per step "
                        f"(wall {r['wall_ms_per_step']:.2f} ms)", title_justify="left")  # fmt: skip
        for col in ("group / kernel", "calls per step", "ms per step"):
            t.add_column(col, justify="left" if col.startswith("group") else "right")
        for g, ms in r["groups_ms_per_step"].items():
            t.add_row(f"[bold]{g}[/]", "", f"{ms:.3f}")
        for k in r["top"][:15]:
            t.add_row(f"  {k['name'][:90]}", f"{k['calls_per_step']:.1f}", f"{k['ms_per_step']:.3f}")
        gaps = r.get("device_gaps")
        if gaps:
            t.add_row(f"[bold]device idle between kernels[/] (busy {gaps['busy_ms_per_step']:.3f})", "",
                      f"{gaps['idle_ms_per_step']:.3f}")  # fmt: skip
            for gp in gaps["gaps"][:8]:
                t.add_row(f"  after {gp['after'][:40]} / before {gp['before'][:40]}", f"{gp['per_step']:.1f}",
                          f"{gp['ms_per_step']:.3f}")  # fmt: skip
        Console().print(t)


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("profile")
    def profile_cmd(
        shapes: Annotated[str, typer.Option(help="Model shapes (bench decode's): 27b | tiny.")] = "27b",
        model: Annotated[
            str | None, typer.Option(help="Profile this checkpoint instead (tiny = the built-in model).")
        ] = None,
        device: Annotated[
            str | None, typer.Option(help="cuda or cpu (default: cuda when available).")
        ] = None,
        arms: Annotated[str, typer.Option(help="Arms of bench arms, comma-separated.")] = "ar,mtp5,lumotree",
        prompt_len: Annotated[int, typer.Option(help="Committed prefix before profiling.")] = 256,
        steps: Annotated[int, typer.Option(help="Profiled engine steps per arm.")] = 10,
        warmup: Annotated[int, typer.Option(help="Unprofiled steps first.")] = 5,
        cuda_graphs: Annotated[bool, typer.Option(help="Profile CUDA-graph replays.")] = False,
        top: Annotated[int, typer.Option(help="Kernels kept per arm, by time.")] = 40,
        draft_vocab: Annotated[int, typer.Option(help="Also offer the *_dv arms of bench arms.")] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report.")] = False,
        out: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    ) -> None:
        """Device time per step of each arm, by kernel and kernel group (torch.profiler)."""
        import torch

        from lumotree.platform.benches.decode import SHAPES

        if shapes not in SHAPES:
            raise typer.BadParameter(f"unknown shapes {shapes!r}; choose {', '.join(SHAPES)}")
        if steps < 1:
            raise typer.BadParameter("--steps must be at least 1")
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise typer.BadParameter("--device cuda: no CUDA device is available")
        started = time.time()
        try:
            report = run(shapes, dev, [a.strip() for a in arms.split(",") if a.strip()], prompt_len, steps,
                         warmup, cuda_graphs, top, draft_vocab, model)  # fmt: skip
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        emit(report, dev, started, out, as_json, print_table)
