"""Analysis (CPU): which parts of a matrix-form (WY) tree verifier need fp64 to stay within the paired rule.

Emulates the verifier in PyTorch with each part's precision chosen (segment decays, S0 products, the k.k and
q.k products, the triangular solve) on the GDN audit's own operands and trees, 27B head dims, and counts
(case, value head) cells outside E_tree <= 1.10 E_native + 2^-24 M64 against the float64 recurrence, with
the fp32 per-node recurrence as the native envelope. Prints one line per variant.

A second table emulates the kernel's own form (``kernels.tree_wy``: key products in fp64, W = P (I + A)^-1
as the product (I - A)(I + A^2)... in fp64, fp32 or tf32x3, the decays' exponentials in fp64 or fp32, the
state products in fp64 or as fp32 fma chains over key chunks) and prints each variant's worst cell error over
its paired-rule bound. Two of these were kernel knobs for a while and were removed after a GPU run
(BENCHMARKS.md): ``exp32`` with ``W tf32x3`` (H100 run 16: 0.680 ms against 0.647, 8 cells outside the rule on
the bench's operands) and the state products as 16-key fma chains (``s0_fma``, H100 run 22: 1.00 to 1.25 ms
against 0.611, 2 cells outside where this emulation saw none).

    python bench/analysis/wy_precision.py [--bench-operands LAYERS]

``--bench-operands`` prints a third table instead: the kernel forms on the GPU bench's own operands, with
its per-node cells (``bench_operands``).
"""

from __future__ import annotations

import random
import sys

import torch

from lumotree.kernels.tree_scan_ref import tree_gdn_float64, tree_gdn_ref
from lumotree.platform.audits import gdn as audit

H, HV, K, V = 16, 48, 128, 128  # the 27B GDN heads
F32, F64 = torch.float32, torch.float64
VARIANTS = {  # precision of (segment decays, S0 products, k.k and q.k, solve)
    "all32": (F32, F32, F32, F32),
    "seg64": (F64, F32, F32, F32),
    "seg64_s064": (F64, F64, F32, F32),
    "s0_32": (F64, F32, F64, F64),
    "kk32": (F64, F64, F32, F64),
    "solve32": (F64, F64, F64, F32),
    "all64": (F64, F64, F64, F64),
}


def ancestors(parents: list[int]) -> torch.Tensor:
    """[R, R] bool: j is i or an ancestor of i."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        p = i
        while p >= 0:
            anc[i, p] = True
            p = parents[p]
    return anc


def wy(ops: dict[str, torch.Tensor], parents: list[int], h0: torch.Tensor, scale: float,
       dts: tuple[torch.dtype, ...]) -> torch.Tensor:  # fmt: skip
    seg, s0, kk, solve = dts
    anc = ancestors(parents)
    n = len(parents)
    rep = HV // H
    kf = ops["k"].repeat_interleave(rep, 1).transpose(0, 1)
    qf = (ops["q"] * scale).repeat_interleave(rep, 1).transpose(0, 1)
    vf, gt, bt = ops["v"].transpose(0, 1), ops["g"].t(), ops["beta"].t().to(solve)
    # decay from j to i as the sum of g over anc(i) minus anc(j), not a difference of cumulative sums
    seg_mask = (anc[:, None, :] & ~anc[None, :, :]).to(seg)
    d = torch.einsum("ijm,hm->hij", seg_mask, gt.to(seg))
    big_g = torch.einsum("im,hm->hi", anc.to(seg), gt.to(seg))
    zero = torch.zeros((), dtype=seg)
    dec = torch.where(anc, torch.exp(torch.where(anc, d, zero)), zero).to(solve)
    e_g = torch.exp(big_g).to(solve)
    k_k = (kf.to(kk) @ kf.to(kk).transpose(1, 2)).to(solve)
    q_k = (qf.to(kk) @ kf.to(kk).transpose(1, 2)).to(solve)
    k_s = (kf.to(s0) @ h0.to(s0)).to(solve)
    q_s = (qf.to(s0) @ h0.to(s0)).to(solve)
    strict = anc & ~torch.eye(n, dtype=torch.bool)
    a = torch.where(strict, bt[:, :, None] * dec * k_k, torch.zeros((), dtype=solve))
    b = bt[:, :, None] * (vf.to(solve) - e_g[:, :, None] * k_s)
    u = torch.zeros_like(b)
    for i in range(n):  # forward substitution
        u[:, i] = b[:, i] - (a[:, i, :i, None] * u[:, :i]).sum(1)
    p = torch.where(anc, dec * q_k, torch.zeros((), dtype=solve))
    return (e_g[:, :, None] * q_s + p @ u).transpose(0, 1).float()


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to tf32 (10 mantissa bits, nearest with ties away, as cvt.rna.tf32.f32)."""
    i = x.contiguous().view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32x3(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Triton's tf32x3 product: hi x hi plus the two cross terms, each exact in fp32, summed in fp32."""
    xh, yh = tf32(x), tf32(y)
    xl, yl = tf32(x - xh), tf32(y - yh)
    return (xh @ yl + xl @ yh) + xh @ yh


def fma_chunks(a: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] as the removed ``s0_fma`` kernel knob formed it: per key chunk
    a chain of fp32 fma (each step's exact product added in fp64, rounded to fp32); chunk sums in fp64."""
    a, b = a.float(), b.float()
    total = torch.zeros((*a.shape[:-1], b.shape[-1]), dtype=F64)
    for c0 in range(0, a.shape[-1], chunk):
        acc = torch.zeros_like(total, dtype=F32)
        for j in range(c0, min(a.shape[-1], c0 + chunk)):
            acc = (acc.double() + a[..., :, j : j + 1].double() * b[..., j : j + 1, :].double()).float()
        total = total + acc.double()
    return total


def kernel_form(ops: dict[str, torch.Tensor], parents: list[int], h0: torch.Tensor, scale: float, w_dt: str,
                exp_dt: torch.dtype, s0_chunk: int = 0) -> torch.Tensor:  # fmt: skip
    """The kernel's arithmetic: fp64 key products, W by squarings in ``w_dt``, exponentials in ``exp_dt``;
    with ``s0_chunk`` the state products K S0 and Q S0 as ``fma_chunks`` of that many keys."""
    anc = ancestors(parents)
    n = len(parents)
    depth = [0] * n
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    squarings = max(0, max(depth).bit_length() - 1)  # the least s with 2^(s+1) > depth
    rep = HV // H
    kf, qf = (ops[x].repeat_interleave(rep, 1).transpose(0, 1).double() for x in ("k", "q"))
    vf, gt, bt = (ops["v"].transpose(0, 1).double(), ops["g"].t().double(), ops["beta"].t().double())
    zero = torch.zeros((), dtype=F64)
    big_g = torch.einsum("im,hm->hi", anc.double(), gt)
    gap = torch.where(anc, big_g[:, :, None] - big_g[:, None, :], zero)
    dec = torch.where(anc, torch.exp(gap.to(exp_dt)).double(), zero)
    strict = anc & ~torch.eye(n, dtype=torch.bool)
    a = torch.where(strict, bt[:, :, None] * dec * (kf @ kf.transpose(1, 2)), zero)
    w = scale * dec * (qf @ kf.transpose(1, 2))
    mm = tf32x3 if w_dt == "tf32x3" else torch.matmul
    a, w = (x.to(F64 if w_dt == "fp64" else F32) for x in (a, w))
    w = w - mm(w, a)
    for _ in range(squarings):
        a = mm(a, a)
        w = w + mm(w, a)
    e_g = torch.exp(big_g.to(exp_dt)).double()
    state = (lambda x: fma_chunks(x, h0, s0_chunk)) if s0_chunk else (lambda x: x @ h0.double())
    b = bt[:, :, None] * (vf - e_g[:, :, None] * state(kf))
    o = (e_g * scale)[:, :, None] * state(qf) + w.double() @ b
    return o.transpose(0, 1).float()


KERNEL_VARIANTS = {  # (W products, exponentials, key chunk of fp32 state products: 0 = fp64)
    "fp64": ("fp64", F64, 0),
    "W fp32": ("fp32", F64, 0),
    "exp32": ("fp64", F32, 0),
    "exp32 W fp32": ("fp32", F32, 0),
    "exp32 W tf32x3": ("tf32x3", F32, 0),
    "S0 fma 16": ("fp64", F64, 16),
    "S0 fma 32": ("fp64", F64, 32),
    "S0 fma 128": ("fp64", F64, 128),
}


def main() -> None:
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    bad = dict.fromkeys(VARIANTS, 0)
    worst = dict.fromkeys(VARIANTS, 0.0)
    margin = dict.fromkeys(KERNEL_VARIANTS, 0.0)
    kernel_bad = dict.fromkeys(KERNEL_VARIANTS, 0)
    cells = 0
    for _name, parents in audit.tree_schedule(32, rng, 64):
        ops = audit.gdn_inputs(len(parents), H, HV, K, V, gen, "cpu")
        h0 = torch.randn(HV, K, V, generator=gen) * 0.1
        scale = K**-0.5
        q, k, v, g, beta = (ops[x][None] for x in ("q", "k", "v", "g", "beta"))
        o_nat = tree_gdn_ref(q, k, v, g, beta, parents, h0[None], scale)[0][0]
        o64 = tree_gdn_float64(q, k, v, g, beta, parents, h0[None], scale)[0][0]
        e_nat = (o_nat.double() - o64).abs().amax(dim=(0, 2))
        m64 = o64.abs().amax(dim=(0, 2))
        cells += HV
        bound = 1.10 * e_nat + 2**-24 * m64 + 2**-149
        for name, dts in VARIANTS.items():
            e = (wy(ops, parents, h0, scale, dts).double() - o64).abs().amax(dim=(0, 2))
            bad[name] += int((e > bound).sum())
            worst[name] = max(worst[name], float((e / e_nat).max()))
        for name, (w_dt, exp_dt, chunk) in KERNEL_VARIANTS.items():
            o = kernel_form(ops, parents, h0, scale, w_dt, exp_dt, chunk)
            e = (o.double() - o64).abs().amax(dim=(0, 2))
            kernel_bad[name] += int((e > bound).sum())
            margin[name] = max(margin[name], float((e / bound).max()))
    print("cells", cells)
    for name in VARIANTS:
        print(f"{name:12s} outside {bad[name]:4d} worst E_tree/E_native {worst[name]:.2f}")
    print("kernel form")
    for name in KERNEL_VARIANTS:
        print(f"{name:16s} outside {kernel_bad[name]:4d} worst E_tree/bound {margin[name]:.3f}")


def bench_operands(layers: int) -> None:
    """The kernel forms on ``lumotree bench gdn``'s own operands (hydra27, 27B heads, its random q, k, v,
    decays and states) with its per-node cells: one (layer, active node, value head) each, the stricter
    count (a node's native error can be far below its head's largest). The GPU bench's native envelope is
    fla's decode kernel; this one is the fp32 per-node recurrence."""
    from lumotree.serving.tree import hydra27

    topo = hydra27()
    parents, scale = list(topo.parents), K**-0.5
    act = [r for r in range(len(parents)) if topo.default_active[r]]
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    def l2(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    bad = dict.fromkeys(KERNEL_VARIANTS, 0)
    margin = dict.fromkeys(KERNEL_VARIANTS, 0.0)
    n = len(parents)
    for _ in range(layers):  # the bench's operand recipe, one layer at a time
        q, k = l2(rnd(1, n, H, K)), l2(rnd(1, n, H, K))
        v = rnd(1, n, HV, V)
        g = torch.nn.functional.logsigmoid(rnd(1, n, HV) + 3.0)
        beta = torch.sigmoid(rnd(1, n, HV))
        h0 = rnd(1, HV, K, V) * 0.1
        o_nat = tree_gdn_ref(q, k, v, g, beta, parents, h0, scale)[0][0]
        o64 = tree_gdn_float64(q, k, v, g, beta, parents, h0, scale)[0][0]
        bound = 1.10 * (o_nat.double() - o64).abs().amax(-1)[act] + 2**-24 * o64.abs().amax(-1)[act] + 2**-149
        ops = {"q": q[0], "k": k[0], "v": v[0], "g": g[0], "beta": beta[0]}
        for name, (w_dt, exp_dt, chunk) in KERNEL_VARIANTS.items():
            o = kernel_form(ops, parents, h0[0], scale, w_dt, exp_dt, chunk)
            e = (o.double() - o64).abs().amax(-1)[act]
            bad[name] += int((e > bound).sum())
            margin[name] = max(margin[name], float((e / bound).max()))
    print(f"kernel form on the bench's operands, {layers} layers x {len(act)} nodes x {HV} heads (cells)")
    for name in KERNEL_VARIANTS:
        print(f"{name:16s} outside {bad[name]:4d} worst E_tree/bound {margin[name]:.3f}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--bench-operands":
        bench_operands(int(sys.argv[2]))
    else:
        main()
