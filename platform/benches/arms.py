"""``lumotree bench arms``: step cost of every decoding arm, and of tree verification against tree shape.

A random-weight model (``bench decode``'s shapes plus one MTP layer; a random EAGLE head of the same shapes),
batch 1, one request with a ``--prompt-len`` prefix. Part 1 times whole engine steps of AR (CUDA-graph decode
where the engine captures it), MTP-5, EAGLE (7 steps) and LumoTree (hydra27, all 32 rows verified) and splits
them into the engine's device-timed spans (drafting, target forward, sampling, commit); the arms take turns
in ``--rounds`` blocks of steps, so that they share the machine's slow drifts. Random weights accept
nothing; a step's cost does not depend on acceptance except through the commit, which part 2 times for an
accepted length of 1 and for the full spine. Part 2 verifies forced trees (every row active) through the
engine's verifier: chains and bushy trees of 8, 16, 32 and 64 nodes and hydra27, timing the tree forward,
the walk and the commit - the break-even of tree size and depth against one decode step.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lumotree.platform.benches import emit

ARM_RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "ar": ("ar", {}),
    "mtp5": ("mtp", {"mtp_k": 5}),
    "eagle": ("eagle", {}),
    "lumotree": ("lumotree", {"tree": "hydra27", "mtp_k": 5}),
}
SIZES = (8, 16, 32, 64)


def _ms(xs: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(xs), "min_ms": min(xs), "max_ms": max(xs), "n": len(xs)}


def bushy_parents(n: int, fanout: int) -> list[int]:
    """A complete tree in breadth-first order: node i's parent is (i - 1) // fanout."""
    return [-1] + [(i - 1) // fanout for i in range(1, n)]


def tree_shapes() -> dict[str, list[int]]:
    from lumotree.serving.tree import hydra27

    shapes: dict[str, list[int]] = {}
    for n in SIZES:
        shapes[f"chain{n}"] = [-1, *range(n - 1)]
        shapes[f"bushy{n}"] = bushy_parents(n, 4)
    shapes["hydra27"] = list(hydra27().parents)
    return shapes


class _Sync:
    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch

    def time(self, fn: Any) -> tuple[float, Any]:
        """(milliseconds, result) of one call, bracketed by device syncs."""
        if self.cuda:
            self.torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if self.cuda:
            self.torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3, out


def arm_runs(draft_vocab: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """The arms to time; with ``draft_vocab``, the speculative ones again drafting among that many ids."""
    runs = dict(ARM_RUNS)
    if draft_vocab > 0:
        for name, (arm, opts) in ARM_RUNS.items():
            if arm != "ar":
                runs[f"{name}_dv"] = (arm, {**opts, "draft_vocab": draft_vocab})
    return runs


def time_arms(model: Any, eagle_head: Any, prompt_len: int, steps: int, warmup: int, graphs: bool,
              draft_vocab: int = 0, rounds: int = 1) -> dict:  # fmt: skip
    """Median engine step and per-span means of every arm (batch 1). Every arm's engine is built and warmed
    up first; the timed steps then run in ``rounds`` blocks, taken by the arms in turn, so that a drift of
    the machine's speed during the run reaches every arm alike (the ratios compare the same minutes)."""
    assert 1 <= rounds <= steps, (rounds, steps)
    device = model.embed_tokens.weight.device
    sync = _Sync(device)
    vocab = model.config.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(prompt_len)]
    out: dict[str, Any] = {}
    timers: dict[str, _ArmTimer] = {}
    for name, (arm, opts) in arm_runs(draft_vocab).items():
        try:
            timers[name] = _ArmTimer(model, arm, opts, eagle_head, prompt, steps, warmup, graphs)
        except Exception as e:  # one failing arm must not hide the others' numbers
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            _collect(device)
    for i in range(rounds):
        for name, t in list(timers.items()):
            try:
                t.run(steps // rounds + (i < steps % rounds), sync)
            except Exception as e:
                out[name] = {"error": f"{type(e).__name__}: {e}"}
                del timers[name]
                _collect(device)
    for name, t in timers.items():
        out[name] = t.result()
        t.close()
    _collect(device)
    return {name: out[name] for name in arm_runs(draft_vocab) if name in out}


MAX_STEP_TOKENS = 65
"""Most tokens one step can commit: the largest tree the benches verify (64 nodes) plus the bonus token."""


def arm_engine(model: Any, arm: str, opts: dict[str, Any], eagle_head: Any, prompt: list[int], steps: int,
               graphs: bool) -> tuple[Any, Any]:  # fmt: skip
    """A batch-1 engine of ``arm`` over ``model`` with ``prompt`` prefilled and room for ``steps`` more steps
    (greedy, EOS ignored) even if every step accepts a whole tree: (engine, request)."""
    from lumotree.serving.engine import Engine, EngineConfig
    from lumotree.serving.sampler import SamplingParams

    if arm == "eagle":
        opts = {**opts, "eagle_head": eagle_head}
    room = steps * MAX_STEP_TOKENS
    cfg = EngineConfig(arm=arm, arm_options=opts, device=str(model.embed_tokens.weight.device),
                       max_seqs=1, max_model_len=len(prompt) + room + 80, cuda_graphs=graphs,
                       graph_batch_sizes=(1,), max_prefill_tokens=len(prompt))  # fmt: skip
    eng = Engine(model, None, cfg, model_name="random")
    req = eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=room + 8, ignore_eos=True))
    eng.step()  # prefill
    return eng, req


class _ArmTimer:
    """One arm's engine with its request, warmed up, timed block by block (``time_arms``)."""

    def __init__(self, model: Any, arm: str, opts: dict[str, Any], eagle_head: Any, prompt: list[int],
                 steps: int, warmup: int, graphs: bool) -> None:  # fmt: skip
        from lumotree.serving.metrics import SPANS

        def start() -> tuple[Any, Any]:
            eng, req = arm_engine(model, arm, opts, eagle_head, prompt, warmup + steps, graphs)
            for _ in range(warmup):
                eng.step()
            return eng, req

        self.eng, self.req = start()
        self.retried: str | None = None
        if self.eng.runner.graph_error:  # a failed capture would time eager steps: once more, fresh engine
            self.retried = self.eng.runner.graph_error
            self.close()
            self.eng, self.req = start()
        self.ms: list[float] = []
        self.spans = dict.fromkeys(SPANS, 0.0)
        self.steps = self.tokens = 0

    def run(self, n: int, sync: _Sync) -> None:
        """Time ``n`` more engine steps (each between device syncs)."""
        c = self.eng.counters
        self.eng.timer.collect(c)  # the previous block ended synced: all of its spans are in
        before, n0, g0 = dict(c.span_seconds), c.decode_steps, c.generation_tokens
        self.ms += [sync.time(self.eng.step)[0] for _ in range(n)]
        self.eng.timer.collect(c)
        for s in self.spans:
            self.spans[s] += c.span_seconds[s] - before[s]
        self.steps += c.decode_steps - n0
        self.tokens += c.generation_tokens - g0

    def result(self) -> dict[str, Any]:
        eng, n = self.eng, self.steps
        fn = eng.runner.fn_graphs
        # tokens per step say how much of the tree the random model's text accepts (host work follows it)
        res = {"step": _ms(self.ms), "spans_mean_ms": {s: v * 1e3 / n for s, v in self.spans.items()},
               "tokens_per_step": self.tokens / n, "verify_rows": eng.arm.max_tree_rows(),
               "cuda_graph_decode": bool(eng.runner.graphs),
               "cuda_graph_verify": sum(t.graph is not None for t in eng.runner.tree_graphs.values()),
               "cuda_graph_commit": sum(t.commit_graph is not None for t in eng.runner.tree_graphs.values()),
               "cuda_graph_draft": sum(e is not None and e.graph is not None for e in fn.entries.values())
               if fn is not None else 0, "graph_error": eng.runner.graph_error}  # fmt: skip
        if self.retried:
            res["failed_capture_retried"] = self.retried
        return res

    def close(self) -> None:
        self.eng.abort(self.req.req_id)


def time_trees(model: Any, prompt_len: int, iters: int, warmup: int, graphs: bool = True) -> dict:
    """Forced full trees through the engine's verifier: forward, walk, commit (root only / deepest path).

    A failed capture turns an engine's later captures off, so the shape whose capture failed is timed
    once more in a fresh engine (the first error kept as ``failed_capture_retried``) and the sweep goes on
    there."""
    import torch

    device = model.embed_tokens.weight.device
    sync = _Sync(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    bench = _TreeEngine(model, prompt_len, graphs)
    out: dict[str, Any] = {}
    for name, parents in tree_shapes().items():
        try:
            res = bench.time(parents, gen, sync, iters, warmup)
            if res["graph_error"]:
                bench.close()
                bench = _TreeEngine(model, prompt_len, graphs)
                first = res["graph_error"]
                res = bench.time(parents, gen, sync, iters, warmup)
                res["failed_capture_retried"] = first
            out[name] = res
        except Exception as e:  # one failing shape must not hide the others' numbers
            out[name] = {"error": f"{type(e).__name__}: {e}", "nodes": len(parents)}
            if device.type == "cuda":
                torch.cuda.synchronize()
    bench.close()
    return out


class _TreeEngine:
    """A batch-1 greedy engine with one prefilled request whose verifier times forced trees."""

    def __init__(self, model: Any, prompt_len: int, graphs: bool) -> None:
        import torch

        from lumotree.serving.engine import Engine, EngineConfig
        from lumotree.serving.sampler import SamplingParams

        device = model.embed_tokens.weight.device
        vocab = model.config.vocab_size
        cfg = EngineConfig(device=str(device), max_seqs=1, max_model_len=prompt_len + 160, cuda_graphs=graphs)
        self.eng = eng = Engine(model, None, cfg, model_name="random")
        prompt = [(7 * i + 3) % vocab for i in range(prompt_len)]
        self.req = req = eng.add_request(
            prompt, SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
        )
        eng.step()  # prefill; the request now has a pending token at position prompt_len
        self.device = device
        self.params = [req.params]
        self.seeds = torch.tensor([req.seed], device=device)
        self.pos = torch.tensor([1], device=device)
        self.hist = eng.history.rows(torch.tensor([req.state_row], device=device))

    def time(self, parents: list[int], gen: Any, sync: _Sync, iters: int, warmup: int) -> dict[str, Any]:
        res = _time_tree(self.eng.verifier, self.req, parents, gen, self.device, sync, self.params,
                         self.seeds, self.pos, self.hist, iters, warmup)  # fmt: skip
        res["graph_error"] = self.eng.runner.graph_error  # set: this shape's capture failed
        return res

    def close(self) -> None:
        self.eng.abort(self.req.req_id)
        _collect(self.device)


def _collect(device: Any) -> None:
    """Free a finished engine's graphs and buffers here, between measurements, rather than whenever the
    collector next runs (which may be in the middle of another engine's capture)."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_tree(ver: Any, req: Any, parents: list[int], gen: Any, device: Any, sync: _Sync, params: Any,
               seeds: Any, pos: Any, hist: Any, iters: int, warmup: int) -> dict[str, Any]:  # fmt: skip
    import torch

    from lumotree.serving.sampling.walk import WalkResult
    from lumotree.serving.tree import TreeDescriptor

    vocab = ver.model.config.vocab_size
    toks = torch.randint(0, vocab, (len(parents),), generator=gen)
    toks[0] = req.pending_token
    d = TreeDescriptor.build(toks, parents, req.context_len, device=device)
    deepest = max(range(d.num_rows), key=lambda r: (d.depth[r], -r))
    path = [deepest]
    while d.parents[path[-1]] >= 0:
        path.append(d.parents[path[-1]])
    accepted = {"commit_root_only": torch.tensor([[0]], device=device),
                "commit_deepest_path": torch.tensor([path[::-1]], device=device)}  # fmt: skip
    rows: dict[str, list[float]] = {k: [] for k in ("verify_forward", "walk", *accepted)}
    for i in range(warmup + iters):
        t_fwd, res = sync.time(lambda: ver.verify([req.req_id], [d]))  # noqa: B023
        t_walk, _ = sync.time(lambda: ver.select(res, params, seeds, pos, hist))  # noqa: B023
        times = {"verify_forward": t_fwd, "walk": t_walk}
        for k, acc in accepted.items():
            w = WalkResult(acc, (acc >= 0).sum(-1), acc[:, 0], acc[0])
            times[k] = sync.time(lambda: ver.commit(res, w))[0]  # noqa: B023
        if i >= warmup:
            for k, v in times.items():
                rows[k].append(v)
    med = {k: statistics.median(v) for k, v in rows.items()}
    base = med["verify_forward"] + med["walk"]
    return {"nodes": d.num_rows, "max_depth": d.topology.max_depth,
            **{f"{k}_ms": v for k, v in med.items()},
            "step_ms_root_only": base + med["commit_root_only"],
            "step_ms_full_path": base + med["commit_deepest_path"]}  # fmt: skip


def run(shapes: str, device_name: str, dtype_name: str | None, prompt_len: int, steps: int, warmup: int,
        iters: int, graphs: bool, draft_vocab: int = 0, rounds: int = 1) -> dict[str, Any]:  # fmt: skip
    import torch

    from lumotree.platform.benches import decode
    from lumotree.serving.drafters.eagle import random_eagle_layer

    device = torch.device(device_name)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        dtype_name or ("bf16" if device.type == "cuda" else "fp32")
    ]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = decode.random_model(shapes, device, dtype, mtp=True)
    eagle = random_eagle_layer(model.config, device, dtype)
    report: dict[str, Any] = {
        "bench": "arms", "shapes": shapes, "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "dtype": str(dtype).removeprefix("torch."), "batch": 1,
        "prompt_len": prompt_len, "steps": steps, "iters": iters, "build_s": time.perf_counter() - t0,
        "draft_vocab": draft_vocab, "cuda_graphs": graphs, "rounds": rounds,
    }  # fmt: skip
    arms = time_arms(model, eagle, prompt_len, steps, warmup, graphs, draft_vocab, rounds)
    report["arms"] = arms
    med = {k: a["step"]["median_ms"] for k, a in arms.items() if "step" in a}
    ar = med.get("ar", float("nan"))
    nan = float("nan")
    report["ratios"] = {"goals": {"lumotree_over_ar": 1.35, "lumotree_over_mtp5": 1.05}}
    for sfx in ("", "_dv") if draft_vocab > 0 else ("",):
        report["ratios"].update({f"lumotree{sfx}_over_ar": med.get(f"lumotree{sfx}", nan) / ar,
                                 f"lumotree{sfx}_over_mtp5{sfx}": med.get(f"lumotree{sfx}", nan)
                                 / med.get(f"mtp5{sfx}", nan),
                                 f"eagle{sfx}_over_ar": med.get(f"eagle{sfx}", nan) / ar,
                                 f"mtp5{sfx}_over_ar": med.get(f"mtp5{sfx}", nan) / ar})  # fmt: skip
    report["trees"] = time_trees(model, prompt_len, iters, warmup, graphs)
    report["trees_over_ar_step"] = {
        k: v["step_ms_root_only"] / ar for k, v in report["trees"].items() if "error" not in v
    }
    report["total_s"] = time.perf_counter() - t0
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"arms, {report['shapes']} shapes, {report['dtype']}, batch 1 ({report['device']})")
    for c in ("arm", "rows", "tok/step", "step ms", "drafting", "target fwd", "sampling", "commit"):
        t.add_column(c, justify="right")
    for name, a in report["arms"].items():
        if "error" in a:
            t.add_row(name, "-", a["error"][:60])
            continue
        s = a["spans_mean_ms"]
        t.add_row(name, str(a["verify_rows"]), f"{a['tokens_per_step']:.2f}", f"{a['step']['median_ms']:.3f}",
                  *(f"{s[k]:.3f}" for k in ("drafting", "target_forward", "sampling", "commit")))  # fmt: skip
    con.print(t)
    for name, a in report["arms"].items():
        if a.get("graph_error") or a.get("failed_capture_retried"):
            con.print(f"[yellow]{name}: a CUDA graph capture failed"
                      f"{', retried in a fresh engine' if a.get('failed_capture_retried') else ''}: "
                      f"{(a.get('graph_error') or a['failed_capture_retried'])[:100]}[/]")  # fmt: skip
    r = report["ratios"]
    for sfx in ("", "_dv") if report.get("draft_vocab") else ("",):
        over_ar, over_mtp = r[f"lumotree{sfx}_over_ar"], r[f"lumotree{sfx}_over_mtp5{sfx}"]
        con.print(f"LumoTree{sfx}/AR {over_ar:.3f} (goal <= 1.35), "
                  f"LumoTree{sfx}/MTP-5{sfx} {over_mtp:.3f} (goal <= 1.05)")  # fmt: skip
    t = Table(title="forced full trees through the verifier (ms)")
    for c in ("tree", "nodes", "depth", "forward", "walk", "commit 1", "commit path", "step/AR"):
        t.add_column(c, justify="right")
    for name, v in report["trees"].items():
        if "error" in v:
            t.add_row(name, str(v["nodes"]), "-", v["error"][:60])
            continue
        cells = (v["verify_forward_ms"], v["walk_ms"], v["commit_root_only_ms"], v["commit_deepest_path_ms"],
                 report["trees_over_ar_step"][name])  # fmt: skip
        t.add_row(name, str(v["nodes"]), str(v["max_depth"]), *(f"{x:.3f}" for x in cells))
    con.print(t)
    eager = [k for k, v in report["trees"].items() if v.get("graph_error")]
    if eager:
        con.print(f"[yellow]trees {', '.join(eager)} verified eagerly after a failed capture[/]")
    retried = [k for k, v in report["trees"].items() if v.get("failed_capture_retried")]
    if retried:
        con.print(f"[yellow]trees {', '.join(retried)} retried in a fresh engine after a failed capture[/]")


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("arms")
    def arms(
        shapes: Annotated[
            str, typer.Option("--shapes", help="Model shapes (bench decode's): 27b | tiny.")
        ] = "27b",
        device: Annotated[
            str | None, typer.Option(help="cuda or cpu (default: cuda when available).")
        ] = None,
        dtype: Annotated[str | None, typer.Option(help="bf16 | fp16 | fp32 (default: bf16 on cuda).")] = None,
        prompt_len: Annotated[int, typer.Option(help="Committed prefix before timing.")] = 256,
        steps: Annotated[int, typer.Option(help="Timed engine steps per arm.")] = 30,
        rounds: Annotated[
            int, typer.Option(help="Blocks the timed steps are split into, the arms taking turns per block.")
        ] = 3,
        warmup: Annotated[int, typer.Option(help="Untimed steps / iterations first.")] = 5,
        iters: Annotated[int, typer.Option(help="Timed iterations per tree shape.")] = 20,
        cuda_graphs: Annotated[
            bool, typer.Option(help="CUDA graphs for decode, verify, commit and drafting.")
        ] = True,
        draft_vocab: Annotated[
            int, typer.Option(help="Also time the speculative arms drafting among the first N token ids.")
        ] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report.")] = False,
        out: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    ) -> None:
        """Per-step cost of AR, MTP-5, EAGLE and LumoTree, and tree-verify cost vs tree size and depth."""
        import torch

        from lumotree.platform.benches.decode import SHAPES

        if shapes not in SHAPES:
            raise typer.BadParameter(f"unknown shapes {shapes!r}; choose {', '.join(SHAPES)}")
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise typer.BadParameter("--device cuda: no CUDA device is available")
        if not 1 <= rounds <= steps:
            raise typer.BadParameter(f"--rounds must be between 1 and --steps ({steps}), got {rounds}")
        started = time.time()
        report = run(shapes, dev, dtype, prompt_len, steps, warmup, iters, cuda_graphs, draft_vocab, rounds)
        emit(report, dev, started, out, as_json, print_table)
