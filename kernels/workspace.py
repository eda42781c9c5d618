"""Per-device scratch buffers that kernels reuse across layers and calls, grown on demand.

A CUDA graph records the buffer's address, so a grown buffer never frees the one it replaces (a captured graph
may still point at it), and under capture the buffer must already be large enough: warm up once outside it.
"""

from __future__ import annotations

import torch

_buffers: dict[tuple[str, str], torch.Tensor] = {}
_retired: list[torch.Tensor] = []


def workspace(device: torch.device | str, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The buffer ``name`` on ``device``: at least ``numel`` elements of ``dtype`` (contents kept between
    calls)."""
    key = (str(device), name)
    buf = _buffers.get(key)
    if buf is None or buf.numel() < numel or buf.dtype != dtype:
        if buf is not None:
            _retired.append(buf)
        buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
        _buffers[key] = buf
    return buf
