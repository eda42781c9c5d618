"""Fused decode-path Triton kernels (norms, SwiGLU product, GDN operand prep) vs their PyTorch twins, and
the whole model through them or through the in-place rows decode, under TRITON_INTERPRET=1."""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated: set before any import of it

import pytest
import torch

from lumotree.kernels.conv import chain_window_index


def _fresh(name: str):
    mod = sys.modules.get(name)
    return importlib.reload(mod) if mod is not None else importlib.import_module(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernels_match_twins(dtype: torch.dtype) -> None:
    norm = _fresh("lumotree.kernels.norm")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, generator=gen).to(dtype)
    r = torch.randn(3, 40, generator=gen).to(dtype)
    w = (torch.randn(40, generator=gen) * 0.3).to(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for res in (None, r):
        y, h = norm.rms_norm_triton(x, w, 1e-6, res)
        y_ref, h_ref = norm.rms_norm_ref(x, w, 1e-6, res)
        # (the interpreter's bf16 casts truncate where GPUs round to nearest: exact only in fp32 here)
        torch.testing.assert_close(h, h_ref, **({"rtol": 0, "atol": 0} if dtype == torch.float32 else tol))
        torch.testing.assert_close(y, y_ref, **tol)
    z = torch.randn(3, 40, generator=gen).to(dtype)
    torch.testing.assert_close(
        norm.gated_rms_norm_triton(x, z, w, 1e-6), norm.gated_rms_norm_ref(x, z, w, 1e-6), **tol
    )
    torch.testing.assert_close(norm.silu_mul_triton(x, z), norm.silu_mul_ref(x, z), **tol)
    # the GDN kernels' fp32 output read directly, rounded to the activation dtype inside the kernel
    o32 = torch.randn(3, 40, generator=gen) * 3
    got = norm.gated_rms_norm_triton(o32, z, w, 1e-6, dtype)
    assert got.dtype == dtype
    torch.testing.assert_close(got, norm.gated_rms_norm_ref(o32.to(dtype), z, w, 1e-6), **tol)
    if dtype == torch.float32:  # the interpreter truncates in-kernel bf16 casts: exactness on CUDA only
        assert torch.equal(got, norm.gated_rms_norm_triton(o32.to(dtype), z, w, 1e-6))
    # column slices of one fused projection output (strided rows), read in place
    fused = torch.randn(3, 3 * 40, generator=gen).to(dtype)
    gate, up, zs = fused[:, :40], fused[:, 40:80], fused[:, 80:].view(3, 2, 20)
    assert not gate.is_contiguous() and not zs.is_contiguous()
    torch.testing.assert_close(norm.silu_mul_triton(gate, up), norm.silu_mul_ref(gate, up), **tol)
    o3 = x.view(3, 2, 20)
    torch.testing.assert_close(
        norm.gated_rms_norm_triton(o3, zs, w[:20], 1e-6), norm.gated_rms_norm_ref(o3, zs, w[:20], 1e-6), **tol
    )


def test_gdn_prep_matches_twin() -> None:
    prep = _fresh("lumotree.kernels.gdn_prep")
    hk, dk, hv, dv, W = 2, 8, 4, 16, 4
    C = 2 * hk * dk + hv * dv
    gen = torch.Generator().manual_seed(1)
    lens = [3, 1, 5]
    win, _ = chain_window_index(lens, W - 1)
    src = torch.randn(len(lens) * (W - 1) + sum(lens), C, generator=gen)
    R = win.shape[0]
    conv_w = torch.randn(C, W, generator=gen) * 0.5
    ab = torch.randn(R, 3 * hv, generator=gen)  # a and b as column slices of one projection output
    a, b = ab[:, :hv] * 3, ab[:, 2 * hv :]
    assert not b.is_contiguous()
    args = (src, win, conv_w, a, b, torch.randn(hv, generator=gen), torch.randn(hv, generator=gen))
    got = prep.gdn_prep_triton(*args, hk, dk, hv, dv)
    ref = prep.gdn_prep_ref(*args, hk, dk, hv, dv)
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got[0].norm(dim=-1), torch.ones(R, hk), atol=1e-4)


@pytest.mark.parametrize("switch", ["LUMOTREE_FUSED", "LUMOTREE_GDN_STATE"])
def test_model_through_triton_kernels_matches_default(switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole model (prefill, decode over out-of-order pool rows, a tree forward, its commit, decode
    after it) through the fused row kernels, or through the in-place rows decode (``kernels.gdn_decode``),
    equals the default path."""
    for name in ("norm", "gdn_prep", "tree_scan", "gdn_decode"):
        _fresh(f"lumotree.kernels.{name}")
    from lumotree.serving.cache import CacheConfig, StateCaches
    from lumotree.serving.config import ModelConfig
    from lumotree.serving.model import HybridModel

    cfg = ModelConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48,
        layer_types=("linear_attention", "full_attention", "linear_attention"),
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    model = HybridModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)

    def run() -> list[torch.Tensor]:
        caches = StateCaches(cfg, CacheConfig(max_seqs=3, num_blocks=12, block_size=4))
        for s in range(3):
            caches.allocate(s, 0)
        seqs = [2, 0]  # pool rows out of order, row 1 idle
        outs = [model(caches.make_batch("prefill", seqs, [[1, 2, 3], [4, 5]], [0, 0]), caches)]
        outs.append(model(caches.make_batch("decode", seqs, [[6], [7]], [3, 2]), caches))
        batch = caches.make_batch("tree", seqs, [[8, 9, 10], [11, 12]], [4, 3], [[-1, 0, 1], [-1, 0]])
        outs.append(model(batch, caches))
        outs.append(model.commit(model.tree_record, torch.tensor([[0, 1, 2], [0, -1, -1]]), caches))
        outs.append(model(caches.make_batch("decode", seqs, [[13], [14]], [7, 4]), caches))
        return outs + [caches.recurrent.state.clone(), caches.conv.state.clone()]

    ref = run()
    monkeypatch.setenv(switch, "force")
    got = run()
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gdn_prep_decode_advances_conv_history_in_place_like_twin() -> None:
    prep = _fresh("lumotree.kernels.gdn_prep")
    hk, dk, hv, dv, W = 2, 8, 4, 16, 4
    C = 2 * hk * dk + hv * dv
    gen = torch.Generator().manual_seed(2)
    pool = torch.randn(5, C, W - 1, generator=gen)
    rows = torch.tensor([3, 0])
    qkv = torch.randn(2, C, generator=gen)
    shapes = [(C, W), (2, hv), (2, hv), (hv,), (hv,)]
    rest = [torch.randn(sh, generator=gen) for sh in shapes]
    rest[2] = torch.randn(2, 2 * hv, generator=gen)[:, hv:]  # b strided, as sliced from the projection
    pool_ref = pool.clone()
    got = prep.gdn_prep_decode_triton(qkv, pool, rows, rest[0], *rest[1:], hk, dk, hv, dv)
    ref = prep.gdn_prep_decode_ref(qkv, pool_ref, rows, rest[0], *rest[1:], hk, dk, hv, dv)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(pool, pool_ref)
    assert torch.equal(pool[3, :, -1], qkv[0]) and torch.equal(pool[0, :, -1], qkv[1])
