"""``SpanTimer``: phase times accumulate per span name; on CUDA they come from events that are reused only
once read."""

from __future__ import annotations

import time

import pytest
import torch

from lumotree.serving.metrics import EngineCounters, SpanTimer


def test_wall_clock_spans_on_cpu() -> None:
    timer, c = SpanTimer(torch.device("cpu")), EngineCounters()
    for _ in range(2):
        with timer.span("drafting", c):
            time.sleep(0.01)
    timer.collect(c)
    assert 0.02 <= c.span_seconds["drafting"] < 1.0 and c.span_seconds["commit"] == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_spans_reuse_read_events_only() -> None:
    timer, c = SpanTimer(torch.device("cuda")), EngineCounters()
    x = torch.randn(4096, 4096, device="cuda")
    with timer.span("target_forward", c):
        y = x @ x
    first = {id(e) for _, *events in timer._pending for e in events}
    with timer.span("sampling", c):  # the first span is unread: new events
        y = y @ x
    second = {id(e) for name, *events in timer._pending if name == "sampling" for e in events}
    assert not first & second
    torch.cuda.synchronize()
    timer.collect(c)
    assert c.span_seconds["target_forward"] > 0 and c.span_seconds["sampling"] > 0 and not timer._pending
    with timer.span("commit", c):  # now read: recorded again
        y = y @ x
    third = {id(e) for _, *events in timer._pending for e in events}
    assert third <= first | second and len(third) == 2
    torch.cuda.synchronize()
    timer.collect(c)
    assert c.span_seconds["commit"] > 0 and y.isfinite().all()
