"""Small host lists onto the device without draining the stream.

``torch.tensor(values, device="cuda")`` copies from pageable memory and then waits for the stream: every
queued kernel (a draft graph, a verify graph) must finish before the host goes on, so host work and device
work stop overlapping. Staging through pinned memory (torch's caching host allocator keeps each block until
its copy is done) lets the copy queue behind that work instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def to_device(
    values: Sequence[int], device: torch.device | str, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``; on CUDA the copy is queued, the host does not wait."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class Staging:
    """A pinned host buffer reused for one small upload per engine step straight into a device tensor.

    Each reuse happens a whole step after the previous upload, whose copy the step's own host read has
    completed by then, so the buffer needs no allocation and no event bookkeeping. The values are written
    through the buffer's numpy view and the view of each length is kept, so an upload is one list
    assignment and one copy call: on a host where every torch call costs microseconds and every CUDA call
    tens of them, that is what stands between a step's drafts reaching the host and its verify graph
    starting."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None
        self._array: Any = None
        """numpy view of ``_host`` (the same memory)."""
        self._views: dict[int, torch.Tensor] = {}
        """``_host[:n]`` per length n uploaded."""

    def upload(self, values: Sequence[int], out: torch.Tensor) -> torch.Tensor:
        """``values`` into ``out`` (1-D, ``len(values)`` elements); returns ``out``."""
        n = len(values)
        assert out.dim() == 1 and out.numel() == n, (tuple(out.shape), n)
        if out.device.type != "cuda":
            return out.copy_(torch.tensor(values, dtype=out.dtype))
        if self._host is None or self._host.numel() < n or self._host.dtype != out.dtype:
            self._host = torch.empty(max(n, 64), dtype=out.dtype, pin_memory=True)
            self._array, self._views = self._host.numpy(), {}
        self._array[:n] = values
        view = self._views.get(n)
        if view is None:
            view = self._views[n] = self._host[:n]
        return out.copy_(view, non_blocking=True)


class Readback:
    """A device tensor read into a reused pinned host buffer: the copy is queued at ``start`` and waited
    for at ``tolist``, so work queued on the stream in between (a fixed tree's staging copies) does not
    delay the read, and the host waits on one event instead of on the whole stream."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._view: torch.Tensor | None = None
        """What ``tolist`` reads: the pinned copy (CUDA) or the tensor itself."""

    def start(self, x: torch.Tensor) -> None:
        if x.device.type != "cuda":
            self._view = x
            return
        n = x.numel()
        if self._host is None or self._host.numel() < n or self._host.dtype != x.dtype:
            self._host = torch.empty(max(n, 64), dtype=x.dtype, pin_memory=True)
        self._event = self._event or torch.cuda.Event()
        self._view = self._host[:n].view(x.shape)
        self._view.copy_(x, non_blocking=True)
        self._event.record()

    def tolist(self) -> list:
        """The values of the tensor given to ``start``, as nested lists."""
        assert self._view is not None, "start() first"
        if self._view.device.type == "cpu" and self._event is not None:
            self._event.synchronize()
        return self._view.tolist()  # type: ignore[no-any-return]
