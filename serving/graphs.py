"""CUDA-graph capture shared by the runner (decode, tree verify, commit) and the drafters.

``capture`` warms a function up on a side stream (allocator, lazy kernel compilation, cached index tables)
and records it. ``StaticGraphs`` keeps one graph per structural key over static copies of a function's
tensor inputs: a call copies the new inputs in and replays. Without capture (CPU, or graphs off) it still
runs the function on the static copies, so CPU tests exercise exactly the buffers a graph would read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


def capture(fn: Callable[[], Any], pool: Any = None, warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, outputs) of ``fn`` recorded into ``pool``; ``fn`` runs ``warmup`` times for real first.

    The last warm-up run treats any host synchronisation as an error: an op that syncs would invalidate
    the capture (and leave the pool unusable), so it fails here, before capture, naming the op."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(warmup):
            if i == warmup - 1:
                torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


@dataclass
class _Entry:
    inputs: list[torch.Tensor]
    graph: torch.cuda.CUDAGraph | None
    out: Any = None


class StaticGraphs:
    """One graph per key of ``fn(static_inputs)``; the key must determine every input's shape and dtype."""

    def __init__(
        self, capture_graphs: bool, pool: Callable[[], Any], on_failure: Callable[[str], None],
        max_entries: int = 16,
    ) -> None:  # fmt: skip
        self.capture_graphs = capture_graphs
        self.pool = pool
        """Returns the memory pool graphs share (the runner's)."""
        self.on_failure = on_failure
        """Called with the error after a failed capture (the runner then stops capturing anywhere)."""
        self.max_entries = max_entries
        self.entries: dict[Hashable, _Entry | None] = {}
        """None marks a key whose capture failed (it runs eagerly)."""

    def __call__(
        self, key: Hashable, fn: Callable[[list[torch.Tensor]], Any], inputs: Sequence[torch.Tensor]
    ) -> Any:
        if key not in self.entries:
            if len(self.entries) >= self.max_entries:
                return fn(list(inputs))
            self.entries[key] = self._new(fn, inputs)
        e = self.entries[key]
        if e is None:
            return fn(list(inputs))
        for dst, src in zip(e.inputs, inputs, strict=True):
            assert dst.shape == src.shape and dst.dtype == src.dtype, (key, dst.shape, src.shape)
            dst.copy_(src, non_blocking=True)
        if e.graph is None:
            return fn(e.inputs)
        e.graph.replay()
        return e.out

    def _new(self, fn: Callable[[list[torch.Tensor]], Any], inputs: Sequence[torch.Tensor]) -> _Entry | None:
        static = [x.clone() for x in inputs]
        if not self.capture_graphs:
            return _Entry(static, None)
        try:
            graph, out = capture(lambda: fn(static), self.pool())
        except Exception as e:  # this key runs eagerly; a failed capture leaves its pool recording
            log.warning(
                "CUDA graph capture failed, running eagerly: %s: %s", type(e).__name__, e, exc_info=True
            )
            self.capture_graphs = False
            self.on_failure(f"{type(e).__name__}: {e}")
            return None
        return _Entry(static, graph, out)
