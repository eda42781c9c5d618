"""What the agent sees of the world: a chat ``Model`` and a shell ``Environment`` (structural protocols).

Any object with the right methods qualifies: ``lumotree.tasks`` sandboxes are Environments without knowing
this module, and an arm is a Model whether it lives in a Ray actor or behind an OpenAI-compatible URL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from lumotree.agents.config import SamplingConfig


@dataclass
class DecodeStats:
    """Decoding counters of one or more model calls (differences of the server's counters, never guesses).

    Acceptance follows vLLM: rate = accepted / draft tokens, length = 1 + accepted / drafts.
    """

    tokens: int = 0
    """Generated (completion) tokens."""
    steps: int = 0
    """Engine decode steps (target forwards after prefill); AR has one step per token."""
    decode_seconds: float = 0.0
    """Seconds spent decoding (after the first token), as the server measured them."""
    drafts: int = 0
    """Speculation events (one per verify step that had at least one draft token)."""
    draft_tokens: int = 0
    """Draft tokens proposed over all drafts."""
    accepted_tokens: int = 0
    """Draft tokens accepted by the verifier."""
    accepted_per_position: list[int] = field(default_factory=list)
    """Accepted tokens per draft depth (index 0 = the first draft position)."""
    spans: dict[str, float] = field(default_factory=dict)
    """Seconds per engine phase (e.g. draft, verify, commit), when the server reports them."""

    def __post_init__(self) -> None:
        assert self.tokens >= 0 and self.steps >= 0 and self.drafts >= 0, self
        assert self.accepted_tokens <= self.draft_tokens or self.draft_tokens == 0, self

    def __add__(self, other: DecodeStats) -> DecodeStats:
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        pad = lambda xs: list(xs) + [0] * (n - len(xs))
        mine, theirs = pad(self.accepted_per_position), pad(other.accepted_per_position)
        spans = dict(self.spans)
        for key, value in other.spans.items():
            spans[key] = spans.get(key, 0.0) + value
        return DecodeStats(
            tokens=self.tokens + other.tokens,
            steps=self.steps + other.steps,
            decode_seconds=self.decode_seconds + other.decode_seconds,
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            accepted_per_position=[a + b for a, b in zip(mine, theirs, strict=True)],
            spans=spans,
        )

    @property
    def tok_s(self) -> float:
        """Pooled decode rate: tokens over decode seconds (the paper's, when summed over requests)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted / drafts (1.0 for AR)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """vLLM's acceptance rate: accepted / draft tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeStats:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ModelReply:
    """One chat completion: the text, what it cost, and what is needed to replay it."""

    text: str
    """The assistant message content."""
    prompt_tokens: int
    """Tokens of the rendered prompt."""
    completion_tokens: int
    """Tokens generated for this reply."""
    stats: DecodeStats = field(default_factory=DecodeStats)
    """Decode counters of this call."""
    seconds: float = 0.0
    """Wall seconds of the call as the client saw it (queueing and transport included)."""
    finish_reason: str = "stop"
    """'stop' (end of message) or 'length' (max_tokens reached)."""
    prompt_token_ids: list[int] | None = None
    """The exact prompt token ids (for replay), when the arm can report them."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """The sampling parameters actually sent."""

    def __post_init__(self) -> None:
        assert self.prompt_tokens >= 0 and self.completion_tokens >= 0, self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelReply:
        data = dict(data)
        data["stats"] = DecodeStats.from_dict(data.get("stats") or {})
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


class ContextLengthExceeded(Exception):
    """The conversation no longer fits the model's context: the episode ends (not an infra failure)."""


@runtime_checkable
class Model(Protocol):
    """A chat model: one reply per call for the whole message list."""

    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig) -> ModelReply: ...


class ExecOutput(Protocol):
    """The result of one command (``lumotree.tasks.api.ExecResult`` has these fields)."""

    exit_code: int
    output: str
    truncated: bool
    timed_out: bool
    seconds: float


@runtime_checkable
class Environment(Protocol):
    """Where commands run: every command in a fresh shell in the task's working directory."""

    def exec(self, cmd: str, timeout: float) -> ExecOutput: ...

    def diff(self) -> str: ...
