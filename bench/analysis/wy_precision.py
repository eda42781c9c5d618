"""Analysis (CPU): which parts of a matrix-form (WY) tree verifier need fp64 to stay within the paired rule.

Emulates the verifier in PyTorch with each part's precision chosen (segment decays, S0 products, the k.k and
q.k products, the triangular solve) on the GDN audit's own operands and trees, 27B head dims, and counts
(case, value head) cells outside E_tree <= 1.10 E_native + 2^-24 M64 against the float64 recurrence, with
the fp32 per-node recurrence as the native envelope. Prints one line per variant.

    python bench/analysis/wy_precision.py
"""

from __future__ import annotations

import random

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


def main() -> None:
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    bad = dict.fromkeys(VARIANTS, 0)
    worst = dict.fromkeys(VARIANTS, 0.0)
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
        for name, dts in VARIANTS.items():
            e = (wy(ops, parents, h0, scale, dts).double() - o64).abs().amax(dim=(0, 2))
            bad[name] += int((e > 1.10 * e_nat + 2**-24 * m64 + 2**-149).sum())
            worst[name] = max(worst[name], float((e / e_nat).max()))
    print("cells", cells)
    for name in VARIANTS:
        print(f"{name:12s} outside {bad[name]:4d} worst E_tree/E_native {worst[name]:.2f}")


if __name__ == "__main__":
    main()
