"""Small host lists onto the device without draining the stream.

``torch.tensor(values, device="cuda")`` copies from pageable memory and then waits for the stream: every
queued kernel (a draft graph, a verify graph) must finish before the host goes on, so host work and device
work stop overlapping. Staging through pinned memory (torch's caching host allocator keeps each block until
its copy is done) lets the copy queue behind that work instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(
    values: Sequence[int], device: torch.device | str, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``; on CUDA the copy is queued, the host does not wait."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
