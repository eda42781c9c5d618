"""Typed configuration of the bash agent and of its sampling (the paper's agent-study settings by default)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


def _template(name: str) -> str:
    return resources.files("lumotree.agents").joinpath("templates", name).read_text(encoding="utf-8")


class SamplingConfig(BaseModel):
    """Sampling parameters sent with every model call. Defaults are the paper's agent study."""

    model_config = ConfigDict(use_attribute_docstrings=True, frozen=True, extra="forbid")

    temperature: float = Field(default=0.6, ge=0.0)
    """Softmax temperature; 0 means greedy."""
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    """Nucleus mass kept."""
    top_k: int = Field(default=20, ge=-1)
    """Tokens kept by rank (-1 or 0: all)."""
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """Tokens below min_p x the top probability are dropped."""
    presence_penalty: float = 1.0
    """Subtracted once from the logit of every token already generated."""
    max_tokens: int = Field(default=1024, gt=0)
    """Completion tokens per call."""
    seed: int | None = None
    """Per-request seed, for reproducible sampling where the arm supports it."""

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


class AgentConfig(BaseModel):
    """The bash agent: templates, limits and observation shaping."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    system_template: str = Field(default_factory=lambda: _template("system.jinja"))
    """Jinja2 template of the system message."""
    instance_template: str = Field(default_factory=lambda: _template("instance.jinja"))
    """Jinja2 template of the first user message; gets ``task`` (the problem statement) and ``cwd``."""
    observation_template: str = Field(default_factory=lambda: _template("observation.jinja"))
    """Jinja2 template of a command's result; gets exit_code, output, head, tail, elided."""
    format_error_template: str = Field(default_factory=lambda: _template("format_error.jinja"))
    """Jinja2 template of the corrective message after a reply without exactly one bash block (``count``)."""
    timeout_template: str = Field(default_factory=lambda: _template("timeout.jinja"))
    """Jinja2 template after a command hit its timeout; gets ``command``, ``output``, ``timeout``."""
    submit_sentinel: str = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    """A command whose output starts with this line ends the episode (patch: git diff)."""
    cwd: str = "/testbed"
    """Working directory named in the prompt (the environment decides where commands really run)."""
    step_limit: int = Field(default=30, ge=1)
    """Model calls per attempt."""
    token_limit: int = Field(default=200_000, ge=1)
    """Prompt + completion tokens per attempt, summed over calls."""
    wall_limit_s: float = Field(default=1800.0, gt=0)
    """Wall seconds per attempt (checked between steps)."""
    command_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds each command may run before it is killed."""
    observation_limit: int = Field(default=10_000, ge=100)
    """Characters of command output shown in full; longer output keeps its head and tail halves."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig())
    """Sampling parameters of every call."""

    @model_validator(mode="after")
    def _sentinel_is_one_word(self) -> AgentConfig:
        assert self.submit_sentinel and " " not in self.submit_sentinel, "the sentinel must be one word"
        return self
