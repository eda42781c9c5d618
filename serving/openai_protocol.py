"""OpenAI request bodies (pydantic) and the mapping to ``SamplingParams``; the wire format of responses."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lumotree.serving.sampler import SamplingParams

__all__ = ["ChatRequest", "CompletionRequest", "ProtocolError", "ValidationError", "validation_message"]


class ProtocolError(ValueError):
    """A request the API refuses; ``status`` is the HTTP status, ``param`` the offending field."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


class _Common(BaseModel):
    """Fields shared by completions and chat; unknown fields are ignored as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: Any = None
    user: str | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.n != 1:
            raise ProtocolError("only n = 1 is supported", param="n")
        if self.logprobs not in (None, False, 0):
            raise ProtocolError("logprobs are not supported", param="logprobs")
        if self.frequency_penalty not in (None, 0, 0.0):
            raise ProtocolError(
                "frequency_penalty is not supported (use presence_penalty)", param="frequency_penalty"
            )
        max_tokens = self.max_tokens if self.max_tokens is not None else default_max_tokens
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=-1 if self.top_k is None else self.top_k,
                min_p=0.0 if self.min_p is None else self.min_p,
                presence_penalty=0.0 if self.presence_penalty is None else self.presence_penalty,
                max_tokens=max_tokens,
                seed=self.seed,
                stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
                stop_token_ids=list(self.stop_token_ids or []),
                ignore_eos=self.ignore_eos,
            )
        except ValueError as e:
            raise ProtocolError(str(e), param=str(e).split(" ", 1)[0]) from None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        if self.echo:
            raise ProtocolError("echo is not supported", param="echo")
        if self.suffix:
            raise ProtocolError("suffix is not supported", param="suffix")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ProtocolError("prompt is empty", param="prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def as_template_dict(self) -> dict[str, Any]:
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            parts = [c.get("text", "") for c in self.content if c.get("type") == "text"]
            if len(parts) != len(self.content):
                raise ProtocolError("only text content parts are supported", param="messages")
            d["content"] = "".join(parts)
        d.setdefault("content", "")
        return d


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """A one-line message and the first offending field of a pydantic error."""
    errs = e.errors()
    parts = []
    for err in errs[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    param = ".".join(str(x) for x in errs[0].get("loc", ())) if errs else None
    return "invalid request: " + "; ".join(parts), param


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
