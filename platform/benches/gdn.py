"""``lumotree bench gdn``: the GDN component of tree verification (verify + publish) against its baselines.

Shapes default to the 27B model's GDN (48 layers, 48 value / 16 key heads, K = V = 128, fp32 state) and the
hydra27 bucket. Operands are what the model records: q, k l2-normalised fp32, v, g, beta fp32. Methods:

- lumotree: verify = path-parallel tree scan per layer (launch configs swept; the served default reported),
  publish = the engine's commit (``serving.model.commit.publish_recurrent``): native replay of the accepted
  path (the spine to ``--accept-depth``) through fla's fused-recurrent kernel, all layers folded into its
  batch dimension, from gathered pre-tree states, scattered back (variants: per layer; on CUDA in place);
- pytorch_node: the per-node PyTorch recurrence storing every node's state (eager only);
- native_path: fla decode steps over the tree depth by depth, every node's full state stored, publish = copy
  of the accepted node's state;
- fla_paths: fla over every root-to-leaf path (prefixes recomputed) + the same replay publish;
- floor: bytes (read the state to verify, read + write it to publish) over the measured copy bandwidth;
- chain sweep: the served scan over chains of 1 to 16 nodes, whose slope is the scan's per-node latency.
Accuracy: per (layer, head, active node) cell, E = max |o - o_float64|; the tree scan is compared with fla's
native decoding of the node's root path by the paired rule E_tree <= 1.10 E_native + 2^-24 M64 + 2^-149.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import typer

from lumotree.platform.benches import emit


def _stats(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    pick = lambda f: s[min(len(s) - 1, int(f * len(s)))]
    return {"median_ms": statistics.median(s), "p10_ms": pick(0.1), "p90_ms": pick(0.9), "n": len(s)}


def time_call(fn: Any, torch: Any, device: Any, warmup: int, iters: int, graph: bool) -> dict[str, float]:
    """Per-call wall time (CUDA events around each call, or a graph replay of one call)."""
    run = fn
    if device.type == "cuda":
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            cg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cg):
                fn()
            run = cg.replay
        for _ in range(warmup):
            run()
        torch.cuda.synchronize()
        out = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return _stats(out)
    for _ in range(warmup):
        run()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        out.append((time.perf_counter() - t0) * 1e3)
    return _stats(out)


SWEPT_PLANS = ("levels", "flat", "side", "sidecar", "split", "wy")
"""Plan modes the verify sweep times by default (the served one is always among them); ``wy`` is the
matrix-form verifier, swept over ``--wy-configs`` instead of ``--configs``."""


def _chain_sweep(
    verify_rows: Any, rows: int, cfg: Any, torch: Any, device: Any, warmup: int, iters: int, graph: bool
) -> dict[str, Any]:
    """The served verify over chains of 1 .. 16 nodes, all layers, and each one's plan mode. Where one mode
    serves them all, the least-squares slope and intercept: for the scan, a path's nodes are sequential, so
    the slope is its per-node latency and a tree's verify cannot beat its deepest path times that slope plus
    the intercept (launch and state load)."""
    lengths = [n for n in (1, 2, 4, 8, 12, 16) if n <= rows]
    runs = [verify_rows(n, cfg) for n in lengths]
    ms = [time_call(fn, torch, device, warmup, iters, graph)["median_ms"] for fn, _ in runs]
    out: dict[str, Any] = {"lengths": lengths, "verify_ms": ms, "mode": "graph" if graph else "eager"}
    out["plans"] = [plan for _, plan in runs]  # auto scans short chains (TreeScanConfig.scan_max_chain)
    if len(lengths) > 1 and len(set(out["plans"])) == 1:
        out["per_node_ms"], out["intercept_ms"] = statistics.linear_regression(lengths, ms)
    return out


def run_gdn_bench(
    device_name: str,
    layers: int,
    hv: int,
    hk: int,
    dk: int,
    dv: int,
    tree: str,
    accept_depth: int,
    warmup: int,
    iters: int,
    configs: list[dict[str, float]],
    log: Any = print,
    plan_modes: tuple[str, ...] = SWEPT_PLANS,
    wy_configs: tuple[dict[str, int], ...] = (),
) -> dict[str, Any]:
    if device_name == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first imported
    import torch

    from lumotree.kernels import dispatch, gdn_decode, tree_scan
    from lumotree.kernels.tree_plan import plan_tree
    from lumotree.kernels.tree_scan_ref import paired_rule_ok, states_of, tree_gdn_float64, tree_gdn_ref
    from lumotree.serving.model.commit import publish_recurrent
    from lumotree.serving.model.record import ReplayStack
    from lumotree.serving.tree import chain, load_builtin

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    topo = load_builtin(tree) if not tree.startswith("chain") else chain(int(tree[5:]))
    R, parents = topo.num_rows, list(topo.parents)
    active = [r for r in range(R) if topo.default_active[r]]
    spine = topo.spine
    accept_depth = min(accept_depth, len(spine) - 1)
    acc_rows = torch.tensor(spine[: accept_depth + 1], device=device)
    D, L, scale = accept_depth + 1, layers, dk**-0.5
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device=device)

    l2 = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    q, k = l2(rnd(L, 1, R, hk, dk)), l2(rnd(L, 1, R, hk, dk))
    v = rnd(L, 1, R, hv, dv)
    g = torch.nn.functional.logsigmoid(rnd(L, 1, R, hv) + 3.0)  # decays near 1, as trained models have
    beta = torch.sigmoid(rnd(L, 1, R, hv))
    pool0 = rnd(L, 1, hv, dk, dv) * 0.1
    pool = pool0.clone()
    state_mib = L * hv * dk * dv * 4 / 2**20
    log(f"device {device}, tree {topo.name} ({R} rows, {len(active)} active), {L} layers")

    def native_chain(*args: Any, cu: Any = None) -> Any:
        """Native decoding of (q, k, v, g, beta, h0): the engine's decode entry point; with packed sequences
        ``cu`` fla's varlen form on CUDA and on CPU the per-node reference (fla's kernel under the Triton
        interpreter is not reliable here)."""
        ql, kl, vl, gl, bl, h0 = args
        if cu is None:
            return dispatch.gdn_decode(ql, kl, vl, gl, bl, scale, h0)
        if cuda:
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla

            return fla(ql, kl, vl, g=gl, beta=bl, scale=scale, initial_state=h0, output_final_state=True,
                       cu_seqlens=cu)  # fmt: skip
        cu_l = cu.tolist()
        par = [j - cu_l[s] - 1 for s in range(len(cu_l) - 1) for j in range(cu_l[s], cu_l[s + 1])]
        res = tree_gdn_ref(ql, kl, vl, gl, bl, par, h0, scale, cu_seqlens=cu_l, output_node_states=True)
        return res[0], states_of(res)[torch.tensor(cu_l[1:]) - 1]

    results: dict[str, Any] = {"device": str(device), "tree": topo.name, "rows": R, "active": len(active)}
    results["shapes"] = {"layers": L, "hv": hv, "hk": hk, "dk": dk, "dv": dv, "accept_depth": accept_depth}
    if cuda:
        results["gpu"] = torch.cuda.get_device_name(device)

    # ---- publish variants (native replay of the accepted path) --------------------------------------
    qa, ka, va, ga, ba = (x[:, 0, acc_rows] for x in (q, k, v, g, beta))  # [L, D, ...]
    flat_pool = pool.view(L, hv, dk, dv)

    def publish_per_layer() -> None:
        for li in range(L):
            _, fin = native_chain(*(x[li : li + 1] for x in (qa, ka, va, ga, ba)), flat_pool[li : li + 1])
            flat_pool[li].copy_(fin[0])

    # What the engine's commit runs, on this bench's one-sequence pool (rows = the accepted spine).
    stack = ReplayStack(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], q.new_empty(L, 0, 1), 0)
    acc_packed, acc_valid = acc_rows[None, :], torch.ones(1, D, dtype=torch.bool, device=device)
    seq_rows = torch.zeros(1, dtype=torch.long, device=device)

    def publish_served() -> None:
        publish_recurrent(stack, acc_packed, acc_valid, seq_rows, pool, scale)

    def publish_inplace() -> None:
        tree_scan.native_replay_(qa, ka, va, ga, ba, flat_pool, scale)

    def publish_rows() -> None:
        gdn_decode.decode_rows_(qa, ka, va, ga, ba, scale, flat_pool, layer_rows)

    layer_rows = torch.arange(L, device=device)
    publishers = {"served": publish_served, "per_layer": publish_per_layer}
    # CUDA only: fla's kernel with its final state aliased to the pool, and the rows kernel
    if cuda:
        publishers["inplace"] = publish_inplace
        publishers["rows"] = publish_rows

    # ---- verify variants -------------------------------------------------------------------------
    dc = tree_scan.DEFAULT_CONFIG
    # "auto": the mode it picks for this tree
    served_plan = topo.plan(dc.plan_mode, dc.wy_max_rows, dc.scan_max_chain).mode
    # the headline is the served config, so its plan mode is always swept
    plans = {m: topo.plan(m) for m in dict.fromkeys((*plan_modes, served_plan))}
    outs = torch.empty(L, 1, R, hv, dv, device=device)

    def verify_fn(mode: str, cfg: Any) -> Any:
        plan = plans[mode]

        def fn() -> None:
            for li in range(L):
                tree_scan.tree_gdn(q[li], k[li], v[li], g[li], beta[li], None, pool[li], scale, plan,
                                   config=cfg, out=outs[li])  # fmt: skip

        return fn

    def verify_rows(n: int, cfg: Any) -> tuple[Any, str]:
        """The verify of a chain of the first ``n`` rows' operands, every layer, and its plan's mode (as
        served)."""
        chain = [-1, *range(n - 1)]
        plan = plan_tree(chain, None, cfg.plan_mode, (), cfg.wy_max_rows, cfg.scan_max_chain)

        def fn() -> None:
            for li in range(L):
                tree_scan.tree_gdn(q[li][:, :n], k[li][:, :n], v[li][:, :n], g[li][:, :n], beta[li][:, :n],
                                   None, pool[li], scale, plan, config=cfg, out=outs[li][:, :n])  # fmt: skip

        return fn, plan.mode

    modes_graph = [False, True] if cuda else [False]
    knobs = ("plan", *SCAN_KNOBS, *WY_KNOBS)
    sweep = []
    sweep_outs = []  # each config's outputs, checked against native decoding below
    for mode in plans:
        for knob_values in wy_configs if mode == "wy" else configs:
            cfg = tree_scan.TreeScanConfig(plan_mode=mode, **knob_values)  # type: ignore[arg-type]
            row: dict[str, Any] = {k_: getattr(cfg, "plan_mode" if k_ == "plan" else k_) for k_ in knobs}
            row["levels"] = list(plans[mode].path_counts)
            for gm in modes_graph:
                row["graph" if gm else "eager"] = time_call(
                    verify_fn(mode, cfg), torch, device, warmup, iters, gm
                )
            verify_fn(mode, cfg)()
            sweep_outs.append(outs.clone())
            sweep.append(row)
            t = row.get("graph", row["eager"])["median_ms"]
            log(f"  verify {mode:7s} {_config_text(knob_values)}: {t:.4f} ms")
    key = "graph" if cuda else "eager"
    results["verify_sweep"] = sweep
    # The headline is what the model serves (the default config), not the sweep's fastest.
    served = tuple(served_plan if k_ == "plan" else getattr(dc, k_) for k_ in knobs)
    best = next((r for r in sweep if tuple(r[k_] for k_ in knobs) == served), None)
    if best is None:
        raise ValueError(f"--configs must include the served config {dc}")
    verify = verify_fn(best["plan"], dc)

    pub_times = {}
    for name, fn in publishers.items():
        pub_times[name] = {("graph" if gm else "eager"): time_call(fn, torch, device, warmup, iters, gm)
                           for gm in modes_graph}  # fmt: skip
    results["publish_variants"] = pub_times
    best_pub = "served"  # the headline is the engine's commit, like the verify config above
    publish = publishers[best_pub]

    def total() -> None:
        verify()
        publish()

    lumo: dict[str, Any] = {"verify_config": {k_: best[k_] for k_ in knobs}}
    lumo["publish_variant"] = best_pub
    for gm in modes_graph:
        tag = "graph" if gm else "eager"
        lumo[tag] = {
            "verify": best[tag],
            "publish": pub_times[best_pub][tag],
            "total": time_call(total, torch, device, warmup, iters, gm),
        }
    plan = plans[best["plan"]]
    cut_mib = plan.cut_buffer_bytes(hv, dk, dv) / 2**20
    out_mib = R * hv * dv * 4 / 2**20
    # publish_recurrent's padded operands, gathered and final states, all layers at once (none in place)
    padded_mib = L * D * (2 * hk * dk + hv * dv + 2 * hv) * 4 / 2**20
    pub_tmp = 0.0 if dispatch.decodes_in_place(q) else 2 * state_mib + padded_mib
    lumo["named_buffers_mib"] = {
        "cut_states": cut_mib,
        "tree_outputs_per_layer": out_mib,
        "publish_temp": pub_tmp,
    }
    lumo["named_buffers_mib"]["total"] = sum(lumo["named_buffers_mib"].values())
    results["lumotree"] = lumo
    results["chain_sweep"] = _chain_sweep(verify_rows, R, dc, torch, device, warmup, iters, modes_graph[-1])

    # ---- accuracy against float64 ----------------------------------------------------------------
    pool.copy_(pool0)
    verify()
    o_tree = outs.clone()
    o64 = torch.stack([tree_gdn_float64(q[li], k[li], v[li], g[li], beta[li], parents, pool[li], scale)[0]
                       for li in range(L)])  # fmt: skip
    # native: decode every root-to-leaf path (each node's root path is a prefix of one of them)
    leaves = [r for r in range(R) if not topo.children[r]]
    routes = []
    for leaf in leaves:
        rt = [leaf]
        while parents[rt[-1]] >= 0:
            rt.append(parents[rt[-1]])
        routes.append(rt[::-1])
    idx = torch.tensor([r for rt in routes for r in rt], device=device)
    cu = torch.tensor([0] + [sum(len(r) for r in routes[: i + 1]) for i in range(len(routes))], device=device)
    owner: dict[int, int] = {}
    for i, rt in enumerate(routes):
        for j, r in enumerate(rt):
            owner.setdefault(r, int(cu[i]) + j)
    pick = torch.tensor([owner[r] for r in range(R)], device=device)
    o_nat = torch.empty_like(o_tree)
    for li in range(L):
        h0 = pool[li].expand(len(routes), -1, -1, -1).contiguous()
        o_p, _ = native_chain(*(x[li][:, idx] for x in (q, k, v, g, beta)), h0, cu=cu)
        o_nat[li] = o_p[:, pick]
    act = torch.tensor(active, device=device)
    e_tree = (o_tree.double() - o64).abs().amax(-1)[:, 0, act]  # [L, active, HV]
    e_nat = (o_nat.double() - o64).abs().amax(-1)[:, 0, act]
    m64 = o64.abs().amax(-1)[:, 0, act]
    bound = 1.10 * e_nat + 2.0**-24 * m64 + 2.0**-149
    bitwise = (o_tree[:, 0, act] == o_nat[:, 0, act]).all(-1)
    assert paired_rule_ok(0.0, 0.0, 0.0)
    for row, o_cfg in zip(sweep, sweep_outs, strict=True):  # every swept config, not only the served one
        row["cells_bitwise_vs_native"] = int((o_cfg[:, 0, act] == o_nat[:, 0, act]).all(-1).sum())
        e_cfg = (o_cfg.double() - o64).abs().amax(-1)[:, 0, act]
        row["cells_outside_paired_bound"] = int((e_cfg > bound).sum())

    def fastest_within_rule(rows: list[dict[str, Any]]) -> dict[str, Any]:
        exact = [r for r in rows if r["cells_outside_paired_bound"] == 0]
        best = min(exact or rows, key=lambda r: r[key]["median_ms"])
        return {k_: best[k_] for k_ in (*knobs, "cells_bitwise_vs_native", "cells_outside_paired_bound")}

    results["verify_fastest_within_rule"] = fastest_within_rule(sweep)
    # per plan mode too: scripts/gpu-bench.sh serves the arms with the fastest wy config found here
    results["verify_fastest_within_rule_per_plan"] = {
        mode: fastest_within_rule([r for r in sweep if r["plan"] == mode]) for mode in plans
    }
    # published state after replaying the accepted path vs float64 and vs the per-layer fla replay
    pool.copy_(pool0)
    publish()
    chain_par = list(range(-1, D - 1))
    st64 = torch.stack([
        states_of(tree_gdn_float64(*(x[li : li + 1] for x in (qa, ka, va, ga, ba)), chain_par, pool0[li],
                                   scale, output_node_states=True))[-1]
        for li in range(L)
    ])  # fmt: skip
    published = flat_pool.clone()
    pool.copy_(pool0)
    publish_per_layer()
    results["accuracy"] = {
        "cells": int(e_tree.numel()),
        "cells_bitwise_vs_native": int(bitwise.sum()),
        "cells_outside_paired_bound": int((e_tree > bound).sum()),
        "max_err_tree_vs_f64": float(e_tree.max()),
        "max_err_native_vs_f64": float(e_nat.max()),
        "state_cells": L * hv,
        "state_bitwise_vs_per_layer_replay": bool(torch.equal(published, flat_pool)),
        "max_err_state_vs_f64": float((published.double() - st64).abs().max()),
    }
    pool.copy_(pool0)

    # ---- baselines -------------------------------------------------------------------------------
    depth = topo.depth
    by_depth = [[r for r in range(R) if depth[r] == d] for d in range(max(depth) + 1)]
    node_states = torch.empty(L, R, hv, dk, dv, device=device)
    acc_leaf = int(acc_rows[-1])

    depth_rows = [torch.tensor(rows, device=device) for rows in by_depth]  # built before any graph capture
    depth_pars = [torch.tensor([max(parents[r], 0) for r in rows], device=device) for rows in by_depth]

    def native_path() -> None:
        for li in range(L):
            for d, rt in enumerate(depth_rows):
                h0 = pool[li] if d == 0 else node_states[li, depth_pars[d]]
                ops = [x[li][0, rt][:, None] for x in (q, k, v, g, beta)]
                _, fin = native_chain(*ops, h0.contiguous())
                node_states[li, rt] = fin
        flat_pool.copy_(node_states[:, acc_leaf])

    def pytorch_node() -> None:
        for li in range(L):
            res = tree_gdn_ref(q[li], k[li], v[li], g[li], beta[li], parents, pool[li], scale,
                               output_node_states=True)  # fmt: skip
            flat_pool[li].copy_(states_of(res)[acc_leaf])

    def fla_paths() -> None:
        for li in range(L):
            h0 = pool[li].expand(len(routes), -1, -1, -1).contiguous()
            o_p, _ = native_chain(*(x[li][:, idx] for x in (q, k, v, g, beta)), h0, cu=cu)
            outs[li].copy_(o_p[:, pick])
        publish()

    base: dict[str, Any] = {}
    small = max(1, iters // 10)
    base["pytorch_node"] = {"eager": time_call(pytorch_node, torch, device, min(warmup, 2), small, False),
                            "named_buffers_mib": L * R * hv * dk * dv * 4 / 2**20}  # fmt: skip
    for name, fn, mib in (
        ("native_path", native_path, L * R * hv * dk * dv * 4 / 2**20),
        ("fla_paths_replay", fla_paths, len(routes) * hv * dk * dv * 4 / 2**20),
    ):
        base[name] = {
            ("graph" if gm else "eager"): time_call(fn, torch, device, warmup, iters, gm)
            for gm in modes_graph
        }
        base[name]["named_buffers_mib"] = mib
    # byte floor: the state read once to verify, read + written once to publish
    big = torch.empty(int(256 * 2**20), dtype=torch.uint8, device=device)
    dst = torch.empty_like(big)
    cp = time_call(lambda: dst.copy_(big), torch, device, warmup, iters, cuda)
    bw = 2 * big.numel() / (cp["median_ms"] * 1e-3)
    state_bytes = L * hv * dk * dv * 4
    base["floor"] = {
        "copy_bandwidth_GBps": bw / 1e9,
        "bytes": 3 * state_bytes,
        "ms": 3 * state_bytes / bw * 1e3,
    }
    results["baselines"] = base
    results["goal"] = {"total_graph_ms_max": 0.5, "named_buffers_mib_max": 64}
    return results


def _table(res: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    tab = Table(title=f"GDN tree verification: {res['tree']} on {res.get('gpu', res['device'])}")
    for col in ("method", "mode", "verify ms", "publish ms", "total ms (p10-p90)", "named MiB"):
        tab.add_column(col)
    lumo = res["lumotree"]
    for mode in ("eager", "graph"):
        if mode in lumo:
            t = lumo[mode]
            tot = t["total"]
            tab.add_row(
                "lumotree", mode, f"{t['verify']['median_ms']:.4f}", f"{t['publish']['median_ms']:.4f}",
                f"{tot['median_ms']:.4f} ({tot['p10_ms']:.4f}-{tot['p90_ms']:.4f})",
                f"{lumo['named_buffers_mib']['total']:.1f}",
            )  # fmt: skip
    for name, b in res["baselines"].items():
        for mode in ("eager", "graph"):
            if isinstance(b.get(mode), dict):
                tab.add_row(
                    name, mode, "", "", f"{b[mode]['median_ms']:.4f}", f"{b.get('named_buffers_mib', 0):.1f}"
                )
        if name == "floor":
            tab.add_row("byte floor", "-", "", "", f"{b['ms']:.4f}", f"{b['copy_bandwidth_GBps']:.0f} GB/s")
    console.print(tab)
    chains = res.get("chain_sweep", {})
    if chains:
        cells = zip(chains["lengths"], chains["plans"], chains["verify_ms"], strict=True)
        console.print("served verify over chains: " + ", ".join(f"{n} {p} {t:.4f} ms" for n, p, t in cells))
    if "per_node_ms" in chains:
        layers = res["shapes"]["layers"]
        console.print(
            f"served scan over chains {chains['lengths']}: {chains['per_node_ms'] / layers * 1e3:.3f} us per "
            f"node and layer + {chains['intercept_ms'] / layers * 1e3:.3f} us per layer ({chains['mode']})"
        )
    console.print(res["accuracy"])


SCAN_KNOBS = ("block_v", "num_warps", "tiles", "maxnreg", "num_stages", "pack")
"""The numeric fields of ``TreeScanConfig`` a ``--configs`` item sets (the plan mode is swept apart)."""
WY_KNOBS = ("wy_block_v", "wy_num_warps", "wy_block_k", "wy_num_stages", "wy_group_rows")
"""The fields of ``TreeScanConfig`` a ``--wy-configs`` item (``BV:warps[:BK[:stages[:group]]]``) sets."""
_HEAD = SCAN_KNOBS[:3]
"""The knobs a ``--configs`` item names by position (``BV:warps[:tiles]``)."""


def _parse_config(text: str) -> dict[str, float]:
    """``BV:warps[:tiles][/knob=value...]`` -> every knob of ``SCAN_KNOBS`` (the rest at
    ``TreeScanConfig``'s defaults), e.g. ``8:1:2/maxnreg=128``."""
    from lumotree.kernels.tree_scan import TreeScanConfig

    head, *extra = text.split("/")
    parts = head.split(":")
    if not 2 <= len(parts) <= 3:
        raise ValueError(f"{text!r} is not BV:warps[:tiles][/knob=value...]")
    base = TreeScanConfig()
    values = {k: getattr(base, k) for k in SCAN_KNOBS}
    items = [
        *zip(_HEAD, parts, strict=False),
        *(e.partition("=")[::2] for e in extra),
    ]
    for key, val in items:
        if key not in SCAN_KNOBS:
            raise ValueError(f"{text!r}: unknown knob {key!r}; knobs are {SCAN_KNOBS}")
        try:
            values[key] = type(getattr(base, key))(val)
        except ValueError:
            raise ValueError(
                f"{text!r}: {key} must be a number like {getattr(base, key)}, not {val!r}"
            ) from None
    if values["block_v"] < 1 or values["num_warps"] < 1 or values["tiles"] not in (1, 2):
        raise ValueError(f"{text!r}: BV and warps must be positive, tiles 1 or 2")
    if values["maxnreg"] and not 24 <= values["maxnreg"] <= 255:
        raise ValueError(f"{text!r}: maxnreg must be 0 (none) or 24..255")
    return values


def _parse_wy_config(text: str) -> dict[str, int]:
    """``BV:warps[:BK[:stages[:group]]]`` -> the ``wy`` knobs (those left out at the served defaults),
    e.g. ``32:4`` or ``64:4:16:4:16``."""
    from lumotree.kernels.tree_scan import TreeScanConfig
    from lumotree.kernels.tree_wy import TreeWyConfig

    try:
        values = [int(x) for x in text.split(":")]
    except ValueError:
        values = []
    if not 2 <= len(values) <= len(WY_KNOBS):
        raise ValueError(f"{text!r} is not BV:warps[:BK[:stages[:group]]] (two to five integers)")
    base = TreeScanConfig()
    values += [int(getattr(base, k)) for k in WY_KNOBS[len(values) :]]
    try:  # the kernel config's own checks
        TreeWyConfig(*values)
    except ValueError as e:
        raise ValueError(f"{text!r}: {e}") from None
    return dict(zip(WY_KNOBS, values, strict=True))


def _config_text(values: dict[str, int] | dict[str, float]) -> str:
    """The ``--configs`` item of a knob set (defaults left out)."""
    from lumotree.kernels.tree_scan import TreeScanConfig

    base = TreeScanConfig()
    if set(values) == set(WY_KNOBS):
        return ":".join(str(values[k]) for k in WY_KNOBS)
    head = ":".join(str(values[k]) for k in _HEAD)
    rest = [f"{k}={v}" for k, v in values.items() if k not in _HEAD and v != getattr(base, k)]
    return "/".join([head, *rest])


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("gdn")
    def gdn(
        device: str = typer.Option("cuda", "--device", help="cuda, or cpu for a tiny smoke run."),
        layers: int = typer.Option(48, "--layers"),
        hv: int = typer.Option(48, "--hv", help="Value heads."),
        hk: int = typer.Option(16, "--hk", help="Key heads."),
        dk: int = typer.Option(128, "--dk"),
        dv: int = typer.Option(128, "--dv"),
        tree: str = typer.Option("hydra27_fixed32", "--tree", help="Built-in tree name, hydra27, or chainN."),
        accept_depth: int = typer.Option(5, "--accept-depth", help="Publish the spine down to this depth."),
        warmup: int = typer.Option(20, "--warmup"),
        iters: int = typer.Option(100, "--iters"),
        configs: str = typer.Option(
            "8:1:1,8:1:2,16:1:1,16:1:2,32:2:1",
            "--configs",
            help="Scan configs BV:warps[:tiles][/knob=value...] (knobs: TreeScanConfig's integer fields), "
            "each run with every swept plan mode.",
        ),
        wy_configs: str = typer.Option(
            "64:4:16:4:0,64:4:16:4:16,128:4:16:4:16,32:4:16:4:16",
            "--wy-configs",
            help="Launch configs BV:warps[:BK[:stages[:group]]] of the wy plan mode (BK: key-chunk width; "
            "group: TreeWyConfig.group_rows); registers and spills per config on sm_90: "
            "bench/analysis/wy_registers.py.",
        ),
        plans: str = typer.Option(
            ",".join(SWEPT_PLANS), "--plans", help="Plan modes to sweep (the served one is always added)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print only the JSON result."),
        out: Path = typer.Option(None, "--out", help="Also write the JSON result to this file."),
    ) -> None:
        """Time the GDN tree-verify and publish path against its baselines (one process; table + JSON)."""
        from rich.console import Console

        console = Console(stderr=True, quiet=as_json)
        name = "hydra27_fixed32" if tree == "hydra27" else tree
        if device == "cpu":  # before the kernels are first imported (the configs below import them)
            os.environ.setdefault("TRITON_INTERPRET", "1")
        try:
            cfgs = [_parse_config(c) for c in configs.split(",")]
        except ValueError as e:
            raise typer.BadParameter(f"--configs: {e}") from e
        from lumotree.kernels.tree_scan import DEFAULT_CONFIG as dc

        try:
            wy_cfgs = [_parse_wy_config(c) for c in wy_configs.split(",")]
        except ValueError as e:
            raise typer.BadParameter(f"--wy-configs: {e}") from e
        # the headline is the served config, so it is always timed
        served, served_wy = ({k: getattr(dc, k) for k in ks} for ks in (SCAN_KNOBS, WY_KNOBS))
        for pool, one in ((cfgs, served), (wy_cfgs, served_wy)):
            if one not in pool:
                pool.append(one)
        modes = [m.strip() for m in plans.split(",") if m.strip()]
        if unknown := sorted(set(modes) - set(SWEPT_PLANS)):
            raise typer.BadParameter(f"--plans: {unknown} not among {SWEPT_PLANS}")
        started = time.time()
        try:
            res = run_gdn_bench(device, layers, hv, hk, dk, dv, name, accept_depth, warmup, iters, cfgs,
                                log=console.print, plan_modes=tuple(modes),
                                wy_configs=tuple(wy_cfgs))  # fmt: skip
        except (RuntimeError, ValueError, AssertionError) as e:
            Console(stderr=True).print(f"[red]gdn bench failed: {e}[/]")  # even under --json
            raise typer.Exit(1) from e
        emit(res, device, started, out, as_json, lambda r: _table(r, console))
