"""A request's life in the engine: its tokens, its place in the caches and its counters."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from lumotree.serving.sampling.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestStats:
    """Per-request counters (the engine keeps the same counters summed over all requests)."""

    decode_steps: int = 0
    """Verify forwards this request took part in (its first token comes from prefill, not counted)."""
    decode_seconds: float = 0.0
    """Wall time of those steps."""
    drafts: int = 0
    """Steps in which the arm offered at least one draft token."""
    draft_tokens: int = 0
    """Draft tokens offered (active non-root tree nodes)."""
    accepted_tokens: int = 0
    """Draft tokens accepted by the walk."""
    first_token_time: float | None = None
    """Monotonic time the first token was produced."""


@dataclass
class Request:
    """Prompt + output tokens; ``context_len`` tokens are committed to the state surfaces.

    While running, every token except the pending one (``output_ids[-1]``) is committed:
    ``context_len == len(prompt_ids) + len(output_ids) - 1``.
    """

    req_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    context_len: int = 0
    state_row: int = -1
    """Row in the recurrent/conv pools (and the presence-history table) while admitted."""
    max_tokens: int = 16
    """Effective output budget (params.max_tokens clipped to the model length)."""
    reserved_blocks: int = 0
    """KV blocks the scheduler set aside for the whole life of the request."""
    finish_reason: str | None = None
    text: str = ""
    """Detokenized output so far (stop strings already cut)."""
    stats: RequestStats = field(default_factory=RequestStats)

    def __post_init__(self) -> None:
        assert self.prompt_ids, "a prompt needs at least one token"

    @property
    def prefilled(self) -> bool:
        return self.context_len >= len(self.prompt_ids)

    @property
    def pending_token(self) -> int:
        assert self.output_ids, "no pending token before the prompt is prefilled"
        return self.output_ids[-1]

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
