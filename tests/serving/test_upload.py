"""``to_device``: host lists reach the device with their values, and on CUDA without a stream sync."""

from __future__ import annotations

import pytest
import torch

from lumotree.serving.upload import Readback, Staging, to_device


def test_values_and_dtype_on_cpu() -> None:
    t = to_device([3, -1, 7], "cpu")
    assert t.dtype == torch.long and t.tolist() == [3, -1, 7]
    assert to_device([1, 0], "cpu", torch.bool).tolist() == [True, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copy_is_queued_not_synchronized() -> None:
    x = torch.randn(4096, 4096, device="cuda")
    y = x @ x  # keep the stream busy while the host uploads
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing copy raises here
    try:
        t = to_device(list(range(1000)), "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.is_cuda and t.tolist() == list(range(1000)) and y.isfinite().all()


def test_readback_on_cpu() -> None:
    rb = Readback()
    rb.start(torch.arange(6).view(2, 3))
    assert rb.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_readback_waits_for_its_copy_only() -> None:
    rb = Readback()
    for i in range(3):  # the pinned buffer is reused
        src = torch.arange(30, device="cuda").view(5, 3, 2) * (i + 1)
        rb.start(src)
        x = torch.randn(4096, 4096, device="cuda")
        y = x @ x  # queued after the copy
        assert rb.tolist() == (src.cpu()).tolist()
        assert y.isfinite().all()


def test_staging_on_cpu() -> None:
    out = torch.zeros(4, dtype=torch.long)
    assert Staging().upload([5, -2, 7, 9], out) is out and out.tolist() == [5, -2, 7, 9]
    with pytest.raises(AssertionError):
        Staging().upload([1, 2], out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_staging_reuses_its_buffer_without_a_sync() -> None:
    st = Staging()
    for n, base in ((32, 0), (5, 100), (32, 7), (80, 3)):  # lengths change; 80 outgrows the first buffer
        out = torch.zeros(n, dtype=torch.long, device="cuda")
        vals = [base + 3 * i for i in range(n)]
        x = torch.randn(4096, 4096, device="cuda")
        y = x @ x  # keep the stream busy while the host uploads
        torch.cuda.set_sync_debug_mode("error")  # a synchronizing copy raises here
        try:
            st.upload(vals, out)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert out.tolist() == vals and y.isfinite().all()  # tolist waits for the copy
