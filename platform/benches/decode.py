"""``lumotree bench decode``: one AR decode step of a random-weight model against the weight-read floor.

The model is the serving ``HybridModel`` with random weights initialised directly on the device
(``--shapes 27b`` is the paper's target: 64 layers = 16 x (3 GDN + 1 gated attention), hidden 5120,
FFN 17408, vocab 248320).
The floor is the bytes of the weights a decode step reads (every linear layer and the lm_head) divided by the
measured device copy bandwidth; the step is timed eagerly and as a CUDA graph replay.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import typer

from lumotree.platform.benches import emit

SHAPES: dict[str, dict[str, Any]] = {
    "27b": dict(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 16,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48,
        linear_key_head_dim=128, linear_value_head_dim=128, partial_rotary_factor=0.25,
    ),
    "tiny": dict(
        vocab_size=300, hidden_size=64, intermediate_size=128,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        partial_rotary_factor=0.25,
    ),
}  # fmt: skip


def _stats(ms: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) > 1 else [ms[0]] * 9
    return {"median_ms": statistics.median(ms), "p10_ms": qs[0], "p90_ms": qs[-1], "n": len(ms)}


def _timer(device: Any) -> Any:
    """Returns time_fn(fn) -> milliseconds of one call, with CUDA events on a GPU, perf_counter elsewhere."""
    import torch

    if device.type == "cuda":

        def timed(fn: Any) -> float:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return float(a.elapsed_time(b))

        return timed

    def timed_cpu(fn: Any) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    return timed_cpu


def copy_bandwidth(device: Any, nbytes: int, repeats: int = 20) -> float:
    """Device copy bandwidth in bytes/s (bytes read + bytes written per second, median of ``repeats``)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timed = _timer(device)
    for _ in range(3):
        dst.copy_(src)
    ms = statistics.median(timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * nbytes / (ms / 1e3)


def random_model(shapes: str, device: Any, dtype: Any, mtp: bool = False) -> Any:
    """A ``HybridModel`` with the named shapes, random weights made directly on ``device``; ``mtp`` adds one
    MTP layer (``model.mtp``, the drafter of the mtp and lumotree arms)."""
    import torch

    from lumotree.serving.config import ModelConfig
    from lumotree.serving.loader import build_empty

    shape = {**SHAPES[shapes], "mtp_num_hidden_layers": int(mtp)}
    cfg = ModelConfig(**{**shape, "layer_types": tuple(shape["layer_types"])})
    model = build_empty(cfg, device, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=device).uniform_(1, 16, generator=gen).log())
            elif name.endswith(("dt_bias", "linear_attn.norm.weight")):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()  # zero-centred RMSNorm weights: scale 1
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def weight_read_bytes(model: Any) -> int:
    """Bytes a decode step streams: every matrix except the embedding table (one row is read) and the MTP
    head; a tied lm_head counts once."""
    seen, total = set(), 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if name.startswith("mtp.") or p.dim() < 2 or id(p) in seen:
            continue
        if name == "embed_tokens.weight" and not model.config.tie_word_embeddings:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


VARIANTS = {
    "fused": {"LUMOTREE_FUSED": "1", "LUMOTREE_GDN_BACKEND": "auto"},
    "unfused": {"LUMOTREE_FUSED": "0", "LUMOTREE_GDN_BACKEND": "auto"},
    "ref": {"LUMOTREE_FUSED": "0", "LUMOTREE_GDN_BACKEND": "ref"},
    "gather": {"LUMOTREE_FUSED": "1", "LUMOTREE_GDN_BACKEND": "auto", "LUMOTREE_GDN_STATE": "gather"},
}
"""Kernel choices: the default (fused Triton row kernels, fla, the recurrent state decoded in place from its
pool rows by ``kernels.gdn_decode``), fla only, PyTorch references only, and fused with the state rows
gathered around fla's decode kernel (the earlier default)."""


def _time_variant(
    model: Any, batch: int, context: int, warmup: int, iters: int, graph: bool
) -> dict[str, Any]:
    """Fresh caches, a 64-token prefill (exercises the chunked path), then the decode step eager + graphed."""
    import torch

    from lumotree.serving.cache import CacheConfig, StateCaches

    device, dtype = model.embed_tokens.weight.device, model.dtype
    block = 16
    blocks_per_seq = (context + 1 + block - 1) // block
    cache_cfg = CacheConfig(
        max_seqs=batch + 1, num_blocks=blocks_per_seq * batch + 4, block_size=block, mtp_kv=False
    )
    caches = StateCaches(model.config, cache_cfg, device, dtype)
    for s in range(batch):
        caches.allocate(s, context + 1)
    out: dict[str, Any] = {}
    t = time.perf_counter()
    caches.allocate("prefill", 64)
    model(caches.make_batch("prefill", ["prefill"], [list(range(64))], [0]), caches)
    if device.type == "cuda":
        torch.cuda.synchronize()
    out["prefill64_s"] = time.perf_counter() - t
    caches.free("prefill")
    # Decode at position `context` over a KV prefix of `context` tokens; every timed step rewrites that slot.
    decode = caches.make_batch(
        "decode", list(range(batch)), [[1 + s] for s in range(batch)], [context] * batch
    )

    def step() -> Any:
        return model.compute_logits(model(decode, caches))

    out["first_logits"] = step().float().cpu()  # compared across variants (same inputs, other kernels)
    timed = _timer(device)
    for _ in range(warmup):
        step()
    out["eager"] = _stats([timed(step) for _ in range(iters)])
    out["graph"] = None
    if graph and device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for _ in range(warmup):
            g.replay()
        out["graph"] = _stats([timed(g.replay) for _ in range(iters)])
        del g
    elif graph:
        out["graph_skipped"] = "CUDA graphs need a CUDA device"
    return out


def run(
    shapes: str,
    batch: int,
    context: int,
    device_name: str,
    dtype_name: str,
    warmup: int,
    iters: int,
    graph: bool,
    variants: tuple[str, ...] = ("fused", "unfused"),
) -> dict[str, Any]:
    """Time every variant (a failing one records its error and the others still run); the headline ratio is
    the best graph (else eager) median over the floor."""
    import os
    import traceback

    import torch

    device = torch.device(device_name)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    torch.manual_seed(0)
    model = random_model(shapes, device, dtype)
    out: dict[str, Any] = {
        "bench": "decode", "shapes": shapes, "batch": batch, "context": context, "dtype": dtype_name,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "layers": model.config.num_layers,
        "params": sum(p.numel() for p in model.parameters()), "warmup": warmup, "iters": iters,
    }  # fmt: skip
    wbytes = weight_read_bytes(model)
    bw = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 24)
    floor_ms = wbytes / bw * 1e3
    out.update(weight_bytes=wbytes, copy_bandwidth_GBps=bw / 1e9, floor_ms=floor_ms, variants={})
    saved = {k: os.environ.get(k) for k in {k for env in VARIANTS.values() for k in env}}
    best: tuple[float, str, str] | None = None
    ref_logits, ref_name = None, ""
    for name in variants:
        for k in saved:  # a variant names only what it sets; the rest is the default
            os.environ.pop(k, None)
        os.environ.update(VARIANTS[name])
        try:
            res = _time_variant(model, batch, context, warmup, iters, graph)
        except Exception as e:  # one broken kernel path must not hide the others' numbers
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
            if device.type == "cuda":
                torch.cuda.synchronize()
        first = res.pop("first_logits", None)
        if first is not None:
            if ref_logits is None:
                ref_logits, ref_name = first, name
            res[f"logits_rel_diff_vs_{ref_name}"] = float(
                (first - ref_logits).abs().max() / ref_logits.abs().max().clamp_min(1e-30)
            )
            res["logits_finite"] = bool(first.isfinite().all())
        out["variants"][name] = res
        for mode in ("graph", "eager"):
            if res.get(mode):
                res[f"{mode}_ratio_to_floor"] = res[mode]["median_ms"] / floor_ms
        mode = "graph" if res.get("graph") else "eager"
        if res.get(mode) and (best is None or res[mode]["median_ms"] < best[0]):
            best = (res[mode]["median_ms"], name, mode)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if best is not None:
        out.update(
            best_ms=best[0], best_variant=best[1], best_mode=best[2], ratio_to_floor=best[0] / floor_ms
        )
    return out


def _print_summary(result: dict[str, Any], console: Any) -> None:
    """The floor and each variant's eager and graph times, one line each."""
    console.print(
        f"floor {result['floor_ms']:.3f} ms ({result['weight_bytes'] / 1e9:.2f} GB at "
        f"{result['copy_bandwidth_GBps']:.0f} GB/s)"
    )
    for name, res in result["variants"].items():
        if "error" in res:
            console.print(f"  {name}: [red]{res['error']}[/]")
            continue
        line = f"  {name}: eager {res['eager']['median_ms']:.3f} ms"
        if res.get("graph"):
            ratio = res["graph_ratio_to_floor"]
            line += f", graph {res['graph']['median_ms']:.3f} ms = {ratio:.2f} x floor"
        console.print(line)


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("decode")
    def decode(
        shapes: str = typer.Option("27b", "--shapes", help=f"Model shapes: {', '.join(SHAPES)}."),
        batch: int = typer.Option(1, "--batch", min=1, help="Sequences decoded per step."),
        context: int = typer.Option(1024, "--context", min=0, help="Tokens already in each sequence's KV."),
        device: str = typer.Option(None, "--device", help="cuda or cpu (default: cuda when available)."),
        dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
        warmup: int = typer.Option(20, "--warmup", min=0),
        iters: int = typer.Option(100, "--iters", min=1),
        graph: bool = typer.Option(True, "--graph/--no-graph", help="Also time a CUDA graph of the step."),
        variants: str = typer.Option(
            "fused,unfused", "--variants", help=f"Comma-separated kernel variants: {', '.join(VARIANTS)}."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print only the JSON result."),
        out: Path = typer.Option(None, "--out", help="Also write the JSON result to this file."),
    ) -> None:
        """Time one decode step (forward + logits) of a random-weight model against the weight-read floor."""
        import torch
        from rich.console import Console

        console = Console(stderr=True, quiet=as_json)
        if shapes not in SHAPES:
            console.print(f"[red]--shapes must be one of {', '.join(SHAPES)}[/]")
            raise typer.Exit(2)
        if dtype not in ("bf16", "fp16", "fp32"):
            console.print("[red]--dtype must be bf16, fp16 or fp32[/]")
            raise typer.Exit(2)
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev.startswith("cuda") and not torch.cuda.is_available():
            console.print("[red]no CUDA device here; pass --device cpu (with --shapes tiny)[/]")
            raise typer.Exit(2)
        started = time.time()
        names = tuple(v.strip() for v in variants.split(",") if v.strip())
        if not names or any(v not in VARIANTS for v in names):
            console.print(f"[red]--variants must name some of {', '.join(VARIANTS)}[/]")
            raise typer.Exit(2)
        with console.status(f"decode bench: {shapes} shapes, batch {batch}, context {context} on {dev}"):
            result = run(shapes, batch, context, dev, dtype, warmup, iters, graph, names)
        emit(result, dev, started, out, as_json, lambda r: _print_summary(r, console))
        if "best_ms" not in result:
            raise typer.Exit(1)
