"""The bash agent: a tiny linear loop (query the model, run its one command, show the output, repeat).

Every model call and command is reported to an optional ``on_event`` callback as it happens, so a caller
can store the trace incrementally (a killed orchestrator loses at most the step in flight).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jinja2 import StrictUndefined, Template

from lumotree.agents.config import AgentConfig
from lumotree.agents.protocols import ContextLengthExceeded, DecodeStats, Environment, Model, ModelReply

_BASH_BLOCK = re.compile(r"```bash[ \t]*\n(.*?)\n?```", re.DOTALL)

EventSink = Callable[[str, dict[str, Any]], None]
"""``on_event(kind, payload)``: kinds are message, request, command, format_error, submitted, limit."""


class ExitStatus:
    """Why an episode ended (the strings stored with the attempt)."""

    SUBMITTED = "submitted"
    STEP_LIMIT = "step_limit"
    TOKEN_LIMIT = "token_limit"
    WALL_LIMIT = "wall_limit"
    LENGTH = "context_length"


@dataclass
class AgentResult:
    """The outcome of one episode."""

    exit_status: str
    """One of ``ExitStatus``."""
    patch: str
    """``git diff`` of the working tree at the end (the submission, also when a limit ended the episode)."""
    messages: list[dict[str, str]]
    """The whole conversation, system message first."""
    requests: int = 0
    """Model calls."""
    format_errors: int = 0
    """Replies without exactly one bash block."""
    prompt_tokens: int = 0
    """Prompt tokens over all calls."""
    completion_tokens: int = 0
    """Completion tokens over all calls."""
    stats: DecodeStats = field(default_factory=DecodeStats)
    """Decode counters summed over all calls."""
    model_seconds: float = 0.0
    """Wall seconds spent waiting for the model."""
    command_seconds: float = 0.0
    """Wall seconds spent running commands."""
    seconds: float = 0.0
    """Wall seconds of the episode."""


def render(template: str, **variables: Any) -> str:
    return Template(template, undefined=StrictUndefined, keep_trailing_newline=False).render(**variables)


def parse_action(text: str) -> list[str]:
    """The bash blocks of a reply (the agent acts only when there is exactly one)."""
    return [block.strip() for block in _BASH_BLOCK.findall(text)]


def shape_output(output: str, limit: int) -> dict[str, Any]:
    """Observation template variables: the full output, or its head and tail halves past ``limit``."""
    if len(output) <= limit:
        return {"output": output, "head": output, "tail": "", "elided": 0}
    half = limit // 2
    return {"output": output, "head": output[:half], "tail": output[-half:], "elided": len(output) - 2 * half}


class BashAgent:
    """Runs one task to submission or to a limit."""

    def __init__(
        self,
        model: Model,
        env: Environment,
        config: AgentConfig | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        self.model = model
        self.env = env
        self.config = config or AgentConfig()
        self.on_event = on_event or (lambda kind, payload: None)

    def _say(self, result: AgentResult, role: str, content: str) -> None:
        result.messages.append({"role": role, "content": content})
        self.on_event("message", {"index": len(result.messages) - 1, "role": role, "content": content})

    def run(self, task: str) -> AgentResult:
        cfg = self.config
        start = time.monotonic()
        result = AgentResult(exit_status="", patch="", messages=[])
        variables = {"task": task, "cwd": cfg.cwd, "submit_sentinel": cfg.submit_sentinel}
        self._say(result, "system", render(cfg.system_template, **variables))
        self._say(result, "user", render(cfg.instance_template, **variables))
        while not result.exit_status:
            result.exit_status = self._limit_reached(result, start) or self._step(result)
        result.seconds = time.monotonic() - start
        result.patch = self.env.diff()
        self.on_event("finished", {"exit_status": result.exit_status, "patch": result.patch})
        return result

    def _limit_reached(self, result: AgentResult, start: float) -> str:
        cfg = self.config
        status = ""
        if result.requests >= cfg.step_limit:
            status = ExitStatus.STEP_LIMIT
        elif result.prompt_tokens + result.completion_tokens >= cfg.token_limit:
            status = ExitStatus.TOKEN_LIMIT
        elif time.monotonic() - start >= cfg.wall_limit_s:
            status = ExitStatus.WALL_LIMIT
        if status:
            self.on_event("limit", {"exit_status": status})
        return status

    def _query(self, result: AgentResult) -> ModelReply:
        reply = self.model.chat(list(result.messages), self.config.sampling)
        result.requests += 1
        result.prompt_tokens += reply.prompt_tokens
        result.completion_tokens += reply.completion_tokens
        result.stats = result.stats + reply.stats
        result.model_seconds += reply.seconds
        self.on_event("request", {"index": result.requests - 1, "reply": reply.to_dict()})
        self._say(result, "assistant", reply.text)
        return reply

    def _step(self, result: AgentResult) -> str:
        """One model call and at most one command; returns an exit status when the episode ends."""
        cfg = self.config
        try:
            reply = self._query(result)
        except ContextLengthExceeded as exc:
            self.on_event("limit", {"exit_status": ExitStatus.LENGTH, "error": str(exc)})
            return ExitStatus.LENGTH
        actions = parse_action(reply.text)
        if len(actions) != 1:
            result.format_errors += 1
            self.on_event("format_error", {"count": len(actions)})
            self._say(result, "user", render(cfg.format_error_template, count=len(actions)))
            return ""
        command = actions[0]
        out = self.env.exec(command, timeout=cfg.command_timeout_s)
        result.command_seconds += out.seconds
        self.on_event(
            "command",
            {
                "command": command,
                "exit_code": out.exit_code,
                "output": out.output,
                "truncated": out.truncated,
                "timed_out": out.timed_out,
                "seconds": out.seconds,
            },
        )
        lines = out.output.lstrip().splitlines()
        if lines and lines[0].strip() == cfg.submit_sentinel and not out.timed_out:
            self.on_event("submitted", {})
            return ExitStatus.SUBMITTED
        if out.timed_out:
            text = render(
                cfg.timeout_template, command=command, output=out.output, timeout=cfg.command_timeout_s
            )
        else:
            text = render(
                cfg.observation_template,
                exit_code=out.exit_code,
                **shape_output(out.output, cfg.observation_limit),
            )
        self._say(result, "user", text)
        return ""
