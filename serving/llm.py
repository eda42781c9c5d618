"""``LLM``: the offline, vLLM-like facade over one engine (load, generate, chat, counters)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, overload

from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.request import Request
from lumotree.serving.sampler import SamplingParams


@dataclass
class GenerationResult:
    """One finished request.

    ``steps`` counts the forwards that produced its tokens: the prefill that drew the first token plus every
    verify step, so AR has tokens_per_step = 1. Decode figures exclude the first token (from prefill).
    """

    text: str
    token_ids: list[int]
    num_tokens: int
    prompt_tokens: int
    steps: int
    decode_seconds: float
    """Wall time of the verify steps this request took part in."""
    decode_tok_s: float
    """(num_tokens - 1) / decode_seconds."""
    finish_reason: str | None
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_step: float
    """Accepted draft tokens per verify step."""
    tokens_per_step: float
    """num_tokens / steps."""
    acceptance_rate: float
    """accepted_tokens / draft_tokens (0 when nothing was drafted)."""

    @staticmethod
    def from_request(req: Request) -> GenerationResult:
        s = req.stats
        n = len(req.output_ids)
        steps = s.decode_steps + 1
        return GenerationResult(
            text=req.text,
            token_ids=list(req.output_ids),
            num_tokens=n,
            prompt_tokens=len(req.prompt_ids),
            steps=steps,
            decode_seconds=s.decode_seconds,
            decode_tok_s=(n - 1) / s.decode_seconds if s.decode_seconds > 0 else 0.0,
            finish_reason=req.finish_reason,
            drafts=s.drafts,
            draft_tokens=s.draft_tokens,
            accepted_tokens=s.accepted_tokens,
            accepted_per_step=s.accepted_tokens / s.decode_steps if s.decode_steps else 0.0,
            tokens_per_step=n / steps,
            acceptance_rate=s.accepted_tokens / s.draft_tokens if s.draft_tokens else 0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ChatResult(GenerationResult):
    """A generation answering a conversation; ``message`` is the assistant turn."""

    @property
    def message(self) -> dict[str, str]:
        return {"role": "assistant", "content": self.text}


class LLM:
    """Load once, then ``generate`` / ``chat`` batches of requests with continuous batching."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        config = config or EngineConfig()
        for k, v in overrides.items():
            if not hasattr(config, k):
                raise TypeError(f"EngineConfig has no field {k!r}")
            setattr(config, k, v)
        self.engine = Engine.from_config(config)

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """Texts or token-id lists (a single one is accepted too); results in input order."""
        batch: list[Any] = (
            [prompts]
            if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int))
            else list(prompts)
        )
        reqs = self.engine.generate(batch, params or SamplingParams())
        return [GenerationResult.from_request(r) for r in reqs]

    @overload
    def chat(
        self, messages: Sequence[dict[str, Any]], params: SamplingParams | None = None
    ) -> ChatResult: ...

    @overload
    def chat(
        self, messages: Sequence[Sequence[dict[str, Any]]], params: SamplingParams | None = None
    ) -> list[ChatResult]: ...

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams | None = None,
    ) -> ChatResult | list[ChatResult]:
        """One conversation -> one ChatResult; a list of conversations -> a list."""
        single = bool(messages) and isinstance(messages[0], dict)
        convs = [messages] if single else list(messages)
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template")
        texts = [self.tokenizer.apply_chat_template(list(c), add_generation_prompt=True) for c in convs]
        reqs = self.engine.generate(texts, params or SamplingParams())
        out = [ChatResult(**asdict(GenerationResult.from_request(r))) for r in reqs]
        return out[0] if single else out

    def counters(self) -> dict[str, Any]:
        return self.engine.counters.as_dict()

    def reset_shared_caches(self) -> None:
        """See ``Engine.reset_shared_caches``."""
        self.engine.reset_shared_caches()
