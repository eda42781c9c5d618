"""CUDA only (compiled, not interpreted): the gated norm reading the GDN kernels' fp32 output rounds it to
the activation dtype exactly as a separate cast would (round to nearest even), so skipping that cast kernel
changes no bit of the model."""

from __future__ import annotations

import pytest
import torch

from lumotree.kernels import norm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gated_norm_on_fp32_input_equals_norm_after_a_cast(dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    o = torch.randn(96, 128, generator=gen, device="cuda") * 3
    z = torch.randn(96, 128, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(128, generator=gen, device="cuda") * 0.3).to(dtype)
    got = norm.gated_rms_norm_triton(o, z, w, 1e-6, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, norm.gated_rms_norm_triton(o.to(dtype), z, w, 1e-6))
