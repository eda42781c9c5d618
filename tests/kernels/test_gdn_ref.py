"""The GDN references agree: naive recurrent vs chunked vs float64, packed vs batched, and tree chains."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lumotree.kernels.gdn_ref import (
    chunk_gdn_ref,
    float64_gdn_ref,
    naive_tree_gdn,
    recurrent_gdn_ref,
)


def _inputs(B: int, T: int, H: int = 2, HV: int = 4, K: int = 16, V: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -F.softplus(torch.randn(B, T, HV, generator=gen)) * 0.5
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen) * 0.1
    return q, k, v, g, beta, h0


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("T", [1, 7, 70, 130])
def test_recurrent_and_chunked_match_float64(T: int) -> None:
    q, k, v, g, beta, h0 = _inputs(2, T)
    o64, s64 = float64_gdn_ref(q, k, v, g, beta, None, h0, True)
    o_r, s_r = recurrent_gdn_ref(q, k, v, g, beta, None, h0, True)
    o_c, s_c = chunk_gdn_ref(q, k, v, g, beta, None, h0, True, chunk_size=32)
    assert o_r.dtype == torch.float32 and s_r.dtype == torch.float32
    for o, s in ((o_r, s_r), (o_c, s_c)):
        assert _rel(o, o64) < 1e-5 and _rel(s, s64) < 1e-5


def test_wrong_decay_is_detected() -> None:
    q, k, v, g, beta, h0 = _inputs(1, 20)
    o64, _ = float64_gdn_ref(q, k, v, g, beta, None, h0, True)
    o_bad, _ = chunk_gdn_ref(q, k, v, g * 0.9, beta, None, h0, True)
    assert _rel(o_bad, o64) > 1e-3


def test_packed_varlen_equals_separate_sequences() -> None:
    q, k, v, g, beta, h0 = _inputs(1, 50)
    cu = torch.tensor([0, 13, 13, 50])
    h0s = torch.randn(3, 4, 16, 8) * 0.1
    for fn in (recurrent_gdn_ref, chunk_gdn_ref):
        o, s = fn(q, k, v, g, beta, None, h0s, True, cu_seqlens=cu)
        for n, (a, b) in enumerate([(0, 13), (13, 13), (13, 50)]):
            o1, s1 = fn(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], None, h0s[n : n + 1], True)
            torch.testing.assert_close(o[:, a:b], o1, rtol=0, atol=0)
            torch.testing.assert_close(s[n : n + 1], s1, rtol=0, atol=0)


def test_recurrent_is_batch_invariant_and_split_invariant() -> None:
    """Decoding T tokens in one call, T calls, or inside a batch gives bitwise the same state."""
    q, k, v, g, beta, h0 = _inputs(3, 6)
    o_all, s_all = recurrent_gdn_ref(q, k, v, g, beta, None, h0, True)
    s = h0[1:2]
    for t in range(6):
        o_t, s = recurrent_gdn_ref(
            q[1:2, t : t + 1], k[1:2, t : t + 1], v[1:2, t : t + 1], g[1:2, t : t + 1], beta[1:2, t : t + 1],
            None, s, True,
        )  # fmt: skip
        assert torch.equal(o_t[0, 0], o_all[1, t])
    assert torch.equal(s[0], s_all[1])


def test_tree_chain_equals_recurrent_and_branches_restart_from_parent() -> None:
    q, k, v, g, beta, h0 = _inputs(1, 5)
    o_chain, _ = recurrent_gdn_ref(q, k, v, g, beta, None, h0, False)
    o_tree, _ = naive_tree_gdn(q[0], k[0], v[0], g[0], beta[0], [-1, 0, 1, 2, 3], h0[0])
    assert torch.equal(o_tree, o_chain[0])
    # node 4 hangs off node 1: its output equals decoding tokens 0, 1, 4.
    o_tree, _ = naive_tree_gdn(q[0], k[0], v[0], g[0], beta[0], [-1, 0, 1, 2, 1], h0[0])
    idx = torch.tensor([0, 1, 4])
    o_path, _ = recurrent_gdn_ref(q[:, idx], k[:, idx], v[:, idx], g[:, idx], beta[:, idx], None, h0, False)
    assert torch.equal(o_tree[4], o_path[0, 2])
    assert not torch.allclose(o_tree[4], o_chain[0, 4])
