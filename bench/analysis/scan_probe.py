"""Analysis (CUDA): what one node of the GDN tree scan costs, taken apart with a stripped-down chain kernel.

Run 7's profile puts a node of the served scan at about 1 µs (BENCHMARKS.md), about ten times its dependent
instruction chain. This probe walks a chain of T nodes per (value head, value tile) program with the served
scan's tile (BV 8, one warp) and per-node arithmetic (``tree_scan._step``), 48 layers of the 27B GDN shapes
with a state and operands of their own each (so memory traffic is the bench's), and switches one thing at a
time:

- ``indirect``: each node's row read from a node table, the next row one node ahead (as the scan's plan
  does), against rows computed from the loop index;
- ``prefetch``: a node's operands loaded one node ahead (as the scan does), against loaded where used;
- ``qk2d``: q and k loaded as [K, 1] columns, against 1-D rows broadcast in the tile (the scan's form,
  which moves them through shared memory);
- ``store``/``out``: the node's output stored / computed at all;
- ``touch``: every node's operands loaded once at program start (all in flight together, results kept
  only by an impossible store), so the walk's own loads find them in cache.

Per variant: µs per launch at T = 1 and T = 12 (CUDA-graph medians of 48 launches) and the difference per
node. The served scan over the same chains is timed beside them, and ``scan_like`` and the served scan are
timed once more with every layer reading layer 0's operands (``*_hot``): in the model the operands were
written by the kernel just before the scan, so they sit in L2, while the bench's per-layer operands are
evicted by the 144 MiB of states streaming through. Not a product kernel: the test
``tests/kernels/test_scan_probe.py`` checks every variant against the per-node reference on CPU.

    python bench/analysis/scan_probe.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import triton
import triton.language as tl

from lumotree.kernels.tree_scan import _step

_BASE = dict(INDIRECT=0, PREFETCH=1, QK2D=0, STORE=1, OUT=1, TOUCH=0)
VARIANTS: dict[str, dict[str, int]] = {
    "scan_like": {**_BASE, "INDIRECT": 1},
    "touch": {**_BASE, "INDIRECT": 1, "TOUCH": 1},
    "direct_rows": _BASE,
    "no_prefetch": {**_BASE, "PREFETCH": 0},
    "qk_columns": {**_BASE, "QK2D": 1},
    "no_store": {**_BASE, "STORE": 0},
    "no_output": {**_BASE, "STORE": 0, "OUT": 0},
}
"""Probe name -> switches (see the module docstring)."""


@triton.jit
def _row(nodes, t, INDIRECT: tl.constexpr):
    if INDIRECT:
        return tl.load(nodes + t)
    return t


@triton.jit
def _load(q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
          V: tl.constexpr, QK2D: tl.constexpr):  # fmt: skip
    if QK2D:
        b_q = tl.load(q + (n * H + i_h) * K + o_k[:, None])
        b_k = tl.load(k + (n * H + i_h) * K + o_k[:, None])
    else:
        b_q = tl.load(q + (n * H + i_h) * K + o_k)
        b_k = tl.load(k + (n * H + i_h) * K + o_k)
    b_v = tl.load(v + (n * HV + i_hv) * V + o_v)
    return b_q, b_k, b_v, tl.load(g + n * HV + i_hv), tl.load(beta + n * HV + i_hv)


@triton.jit
def probe_chain_kernel(q, k, v, g, beta, o, h0, nodes, scale, T, H: tl.constexpr, HV: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, INDIRECT: tl.constexpr,
                       PREFETCH: tl.constexpr, QK2D: tl.constexpr, STORE: tl.constexpr, OUT: tl.constexpr,
                       TOUCH: tl.constexpr, MAX_T: tl.constexpr = 16):  # fmt: skip
    """Chain rows ``nodes[0..T-1]`` (or 0..T-1) from state h0 [HV, K, V], which receives the final state."""
    pid = tl.program_id(0)
    NT: tl.constexpr = V // BV
    i_t, i_hv = pid % NT, pid // NT
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, K)
    o_v = i_t * BV + tl.arange(0, BV)
    p_h = h0 + i_hv * K * V + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(p_h)
    if TOUCH:  # unrolled, so that every load is issued before any result is waited for
        acc_q = tl.zeros([K], dtype=tl.float32)
        acc_v = tl.zeros([BV], dtype=tl.float32)
        for t in tl.static_range(MAX_T):
            n_t = _row(nodes, tl.minimum(t, T - 1), INDIRECT)
            tq, tk, tv, tg, tb = _load(q, k, v, g, beta, n_t, i_h, i_hv, o_k, o_v, H, HV, K, V, 0)
            acc_q += tq + tk
            acc_v += tv + tg + tb
        if tl.sum(acc_q) + tl.sum(acc_v) == -1.2345e30:  # never true: keeps the loads
            tl.store(o + o_v, acc_v)
    n_cur = _row(nodes, tl.minimum(0, T - 1), INDIRECT)
    n_nxt = _row(nodes, tl.minimum(1, T - 1), INDIRECT)
    nb = _load(q, k, v, g, beta, n_cur, i_h, i_hv, o_k, o_v, H, HV, K, V, QK2D)
    for t in range(0, T):
        if PREFETCH:  # the scan's form: this node's operands came one node ago, the next row two
            n = n_cur
            cur = nb
            n_after = _row(nodes, tl.minimum(t + 2, T - 1), INDIRECT)
            nb = _load(q, k, v, g, beta, n_nxt, i_h, i_hv, o_k, o_v, H, HV, K, V, QK2D)
            n_cur, n_nxt = n_nxt, n_after
        else:
            n = _row(nodes, t, INDIRECT)
            cur = _load(q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, H, HV, K, V, QK2D)
        b_q, b_k, b_v, b_g, b_beta = cur
        if QK2D:  # _step broadcasts 1-D q and k over the tile; the column form is already [K, 1]
            b_h *= tl.exp(b_g)
            b_u = b_beta * (b_v - tl.sum(b_h * b_k, 0))
            b_h += b_k * b_u[None, :]
            b_o = tl.sum(b_h * (b_q * scale), 0)
        elif OUT:
            b_h, b_o = _step(b_h, b_k, b_q * scale, b_v, b_g, b_beta)
        else:
            b_h *= tl.exp(b_g)
            b_h += b_k[:, None] * (b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0)))[None, :]
            b_o = b_v
        if STORE:
            tl.store(o + (n * HV + i_hv) * V + o_v, b_o)
    tl.store(p_h, b_h)


def launch(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor, o: torch.Tensor, h0: torch.Tensor, nodes: torch.Tensor,
           scale: float) -> None:  # fmt: skip
    """One chain over rows ``nodes`` of q, k [R, H, K], v, o [R, HV, V], g, beta [R, HV] from h0 [HV, K,
    V], in place."""
    T = nodes.numel()
    H, K = q.shape[1:]
    HV, V = v.shape[1:]
    BV = min(8, V)
    grid = (HV * (V // BV),)
    switches = VARIANTS[variant]
    probe_chain_kernel[grid](q, k, v, g, beta, o, h0, nodes, scale, T, H=H, HV=HV, K=K, V=V, BV=BV,
                             num_warps=1, **switches)  # fmt: skip


def main(
    layers: int = 48, hv: int = 48, hk: int = 16, d: int = 128, lengths: tuple[int, ...] = (1, 12),
    device: str = "cuda", warmup: int = 5, iters: int = 30,
) -> dict[str, Any]:  # fmt: skip
    from lumotree.kernels import tree_scan
    from lumotree.kernels.tree_plan import plan_paths
    from lumotree.platform.benches.gdn import time_call

    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    R = max(lengths)
    l2 = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = l2(torch.randn(layers, R, hk, d, device=dev, generator=gen))
    k = l2(torch.randn(layers, R, hk, d, device=dev, generator=gen))
    v = torch.randn(layers, R, hv, d, device=dev, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(layers, R, hv, device=dev, generator=gen) + 3.0)
    beta = torch.sigmoid(torch.randn(layers, R, hv, device=dev, generator=gen))
    h0 = 0.1 * torch.randn(layers, hv, d, d, device=dev, generator=gen)
    o = torch.empty_like(v)
    scale = d**-0.5
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    out: dict[str, Any] = {"gpu": gpu, "layers": layers, "lengths": list(lengths)}
    for name in (*VARIANTS, "served_scan", "scan_like_hot", "served_scan_hot"):
        per: dict[int, float] = {}
        hot = name.endswith("_hot")
        variant = name.removesuffix("_hot")
        for n in lengths:
            nodes = torch.arange(n, device=dev, dtype=torch.int32)
            plan = plan_paths([-1, *range(n - 1)], mode=tree_scan.DEFAULT_CONFIG.plan_mode)

            def fn(variant: str = variant, hot: bool = hot, n: int = n, nodes: torch.Tensor = nodes,
                   plan: Any = plan) -> None:  # fmt: skip
                for li in range(layers):
                    x = 0 if hot else li  # whose operands (the state is always the layer's own)
                    if variant == "served_scan":
                        tree_scan.tree_gdn(q[x, :n], k[x, :n], v[x, :n], g[x, :n], beta[x, :n], None, h0[li],
                                           scale, plan, out=o[x, :n])  # fmt: skip
                    else:
                        launch(variant, q[x], k[x], v[x], g[x], beta[x], o[x], h0[li], nodes, scale)

            # CUDA-graph replays of the 48 launches (wall time on CPU), per launch
            per[n] = time_call(fn, torch, dev, warmup, iters, graph=True)["median_ms"] * 1e3 / layers
        lo, hi = min(lengths), max(lengths)
        out[name] = {"us_per_launch": per, "us_per_node": (per[hi] - per[lo]) / (hi - lo)}
        print(f"{name:16s} " + " ".join(f"T={n}: {t:7.2f} us" for n, t in per.items())
              + f"   per node {out[name]['us_per_node']:.3f} us", flush=True)  # fmt: skip
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    text = json.dumps(main(), indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
