"""Engine counters, device-timed spans, and their Prometheus text (vLLM's metric names where they exist).

Acceptance is computed as vLLM does: rate = accepted / draft tokens, mean length = 1 + accepted / drafts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

SPANS = ("target_forward", "drafting", "sampling", "commit")


@dataclass
class EngineCounters:
    """Monotonic totals since the engine started."""

    prompt_tokens: int = 0
    """Prompt tokens prefilled."""
    generation_tokens: int = 0
    """Output tokens emitted (after stop handling)."""
    steps: int = 0
    """Engine steps that ran a forward (prefill or verify)."""
    prefill_steps: int = 0
    decode_steps: int = 0
    """Verify steps (AR decode or speculative tree/chain)."""
    decode_seconds: float = 0.0
    """Wall time spent in verify steps (the decode busy time)."""
    prefill_seconds: float = 0.0
    requests_finished: int = 0
    drafts: int = 0
    """Per request and step: proposals with at least one draft token (vLLM num_drafts)."""
    draft_tokens: int = 0
    """Draft tokens offered (active non-root tree nodes)."""
    accepted_tokens: int = 0
    """Draft tokens the walk accepted."""
    accepted_per_pos: list[int] = field(default_factory=list)
    """accepted_per_pos[d] = acceptances at tree depth d + 1."""
    span_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SPANS, 0.0))
    """Device-timed seconds per step phase."""

    def add_accepted_depths(self, depth: int) -> None:
        """One request accepted drafts at depths 1..depth."""
        while len(self.accepted_per_pos) < depth:
            self.accepted_per_pos.append(0)
        for d in range(depth):
            self.accepted_per_pos[d] += 1

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["acceptance_rate"] = self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
        d["mean_acceptance_length"] = 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0
        return d


class SpanTimer:
    """Times step phases on the device timeline (CUDA events, read after the step's sync), else wall clock.

    Events are reused once read: a fresh one is created by the driver at its first record, a call that a
    speculative step would otherwise make on its critical path (between the drafts' host read and the
    verify launch, where the device idles)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[str, Any, Any]] = []
        self._free: list[Any] = []
        """Read events, ready to record again."""

    def _event(self) -> Any:
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    @contextmanager
    def span(self, name: str, counters: EngineCounters) -> Iterator[None]:
        if self.cuda:
            start, end = self._event(), self._event()
            start.record()
            yield
            end.record()
            self._pending.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            counters.span_seconds[name] += time.perf_counter() - t0

    def collect(self, counters: EngineCounters) -> None:
        """Add finished spans (call after a device sync)."""
        keep = []
        for name, start, end in self._pending:
            if end.query():
                counters.span_seconds[name] += start.elapsed_time(end) / 1000.0
                self._free += [start, end]
            else:
                keep.append((name, start, end))
        self._pending = keep


def prometheus_text(
    c: EngineCounters, model_name: str, arm: str, running: int, waiting: int, graph_failed: bool = False
) -> str:
    """Prometheus exposition text of the counters; ``graph_failed``: a CUDA graph capture failed (the
    engine then runs new shapes eagerly, much slower on a GPU)."""
    labels = f'model_name="{model_name}",arm="{arm}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, value: float, extra: str = "") -> None:
        if not any(line.startswith(f"# HELP {name} ") for line in out):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
        lab = labels + ("," + extra if extra else "")
        out.append(f"{name}{{{lab}}} {value}")

    metric("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.", c.prompt_tokens)
    metric("vllm:generation_tokens_total", "counter", "Generation tokens produced.", c.generation_tokens)
    metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", running)
    metric("vllm:num_requests_waiting", "gauge", "Requests waiting for admission.", waiting)
    metric("vllm:spec_decode_num_drafts_total", "counter", "Speculative proposals.", c.drafts)
    metric("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", c.draft_tokens)
    metric(
        "vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", c.accepted_tokens
    )
    for pos, n in enumerate(c.accepted_per_pos):
        metric(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
            "Accepted draft tokens per position.", n, f'position="{pos}"',
        )  # fmt: skip
    metric("lumotree:steps_total", "counter", "Engine steps (prefill + decode).", c.steps)
    metric("lumotree:decode_steps_total", "counter", "Verify (decode) steps.", c.decode_steps)
    metric("lumotree:decode_busy_seconds_total", "counter", "Wall time in decode steps.", c.decode_seconds)
    metric("lumotree:prefill_busy_seconds_total", "counter", "Wall time in prefill steps.", c.prefill_seconds)
    metric("lumotree:requests_finished_total", "counter", "Finished requests.", c.requests_finished)
    metric(
        "lumotree:cuda_graph_capture_failed",
        "gauge",
        "1 once a CUDA graph capture failed (new shapes then run eagerly).",
        int(graph_failed),
    )
    for name, secs in c.span_seconds.items():
        metric(
            "lumotree:step_span_seconds_total",
            "counter",
            "Device time per step phase.",
            secs,
            f'span="{name}"',
        )
    return "\n".join(out) + "\n"
