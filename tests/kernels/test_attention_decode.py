"""Fused attention decode kernels (norm + RoPE, paged gated decode attention) vs their PyTorch twins,
under TRITON_INTERPRET=1."""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated: set before any import of it

import torch


def _fresh(name: str):
    mod = sys.modules.get(name)
    return importlib.reload(mod) if mod is not None else importlib.import_module(name)


def test_norm_rope_on_a_strided_head_view() -> None:
    ad = _fresh("lumotree.kernels.attention_decode")
    gen = torch.Generator().manual_seed(0)
    R, H, D, rd = 3, 2, 16, 4
    qg = torch.randn(R, H, 2 * D, generator=gen)
    x = qg[..., :D]  # the query half of [query | gate] heads
    w = torch.randn(D, generator=gen) * 0.3
    ang = torch.randn(R, rd // 2, generator=gen)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    torch.testing.assert_close(
        ad.norm_rope_triton(x, w, cos, sin, 1e-6),
        ad.norm_rope_ref(x, w, cos, sin, 1e-6),
        rtol=1e-5,
        atol=1e-5,
    )


def test_gated_decode_attention_matches_twin() -> None:
    ad = _fresh("lumotree.kernels.attention_decode")
    gen = torch.Generator().manual_seed(1)
    S, Hq, Hkv, D, bs, nb = 3, 4, 2, 16, 4, 12
    kc = torch.randn(nb, bs, Hkv, D, generator=gen)
    vc = torch.randn(nb, bs, Hkv, D, generator=gen)
    tables = torch.tensor([[3, 7, 1, 0, 0], [2, 5, 9, 11, 4], [6, 0, 0, 0, 0]])
    lens = torch.tensor([9, 20, 1])  # crosses blocks, fills the table, a single position
    qg = torch.randn(S, Hq, 2 * D, generator=gen)
    q, gate = qg[..., :D], qg[..., D:]
    got = ad.gated_decode_attention_triton(q, gate, kc, vc, tables, lens, D**-0.5)
    ref = ad.gated_decode_attention_ref(q, gate, kc, vc, tables, lens, D**-0.5)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # Positions at or beyond seq_lens are invisible: poisoning them changes nothing.
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[6, 1:] = 1e4  # sequence 2 sees only position 0 of its block 6
    vc2[6, 1:] = 1e4
    kc2[0] = 1e4  # table padding points at block 0
    got2 = ad.gated_decode_attention_triton(q, gate, kc2, vc2, tables, lens, D**-0.5)
    torch.testing.assert_close(got2, got, rtol=0, atol=0)


def test_gated_tree_attention_matches_the_paged_reference() -> None:
    """Two trees over different prefixes: each row sees its prefix and its ancestors-or-self only; the root
    row is bitwise the decode kernel's row over the prefix plus itself."""
    ad = _fresh("lumotree.kernels.attention_decode")
    from lumotree.kernels.attention import paged_attention_ref
    from lumotree.serving.model.context import _tree_tables

    gen = torch.Generator().manual_seed(2)
    Hq, Hkv, D, bs, nb = 4, 2, 16, 4, 16
    parents = ((-1, 0, 0, 1, 3, 2), (-1, 0, 1))
    ctxs = [7, 2]
    tables = torch.tensor([[3, 7, 1, 9], [2, 5, 0, 0]])
    slots = []
    for s, par in enumerate(parents):
        for j in range(len(par)):
            pos = ctxs[s] + j
            slots.append(int(tables[s, pos // bs]) * bs + pos % bs)
    kc = torch.randn(nb, bs, Hkv, D, generator=gen)
    vc = torch.randn(nb, bs, Hkv, D, generator=gen)
    R = sum(len(p) for p in parents)
    qg = torch.randn(R, Hq, 2 * D, generator=gen)
    q, gate = qg[..., :D], qg[..., D:]
    _, vis, (row_seq, row_j, anc) = _tree_tables(parents, 3, "cpu")
    got = ad.gated_tree_attention_triton(
        q, gate, kc, vc, tables, torch.tensor(ctxs), row_seq, row_j, anc, D**-0.5
    )
    bounds = [(0, 6, ctxs[0]), (6, 9, ctxs[1])]
    ref = paged_attention_ref(q, kc, vc, tables, torch.tensor(slots), bounds, vis, D**-0.5)
    ref = ref.reshape(R, -1) * torch.sigmoid(gate.reshape(R, -1))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # Root rows: bitwise the decode kernel over context_len + 1 positions.
    roots = torch.tensor([0, 6])
    dec = ad.gated_decode_attention_triton(
        q[roots], gate[roots], kc, vc, tables, torch.tensor(ctxs) + 1, D**-0.5
    )
    assert torch.equal(got[roots], dec)
    # A sibling's K/V is invisible: poisoning row 2 (child of the root, not an ancestor of rows 1, 3, 4)
    # changes nothing for them.
    kc2, vc2 = kc.clone(), vc.clone()
    s2 = slots[2]
    kc2.view(-1, Hkv, D)[s2] = 1e4
    vc2.view(-1, Hkv, D)[s2] = 1e4
    got2 = ad.gated_tree_attention_triton(
        q, gate, kc2, vc2, tables, torch.tensor(ctxs), row_seq, row_j, anc, D**-0.5
    )
    keep = torch.tensor([0, 1, 3, 4, 6, 7, 8])
    assert torch.equal(got2[keep], got[keep])
    assert not torch.equal(got2[2], got[2])
