"""Typed configuration of a sweep: which arms, which tasks, how many attempts, and how much runs at once."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lumotree.agents.config import AgentConfig

SERVING_ARMS = ("ar", "mtp", "eagle", "lumotree")
"""Decoding schemes of the embedded engine."""


class ArmSpec(BaseModel):
    """One arm of a sweep: a decoding scheme of the embedded engine, an external server, or a test script."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    name: str
    """Label of the arm in the sweep (unique): ``mtp``, ``lumotree``, ``vllm-eagle`` ..."""
    kind: str = "engine"
    """``engine`` (hosted by a Ray actor), ``url`` (an OpenAI-compatible server) or ``scripted`` (tests)."""
    arm: str = ""
    """Engine arm (``ar``, ``mtp``, ``eagle``, ``lumotree``) for kind ``engine``; defaults to ``name``."""
    model: str = "tiny"
    """Model path, or ``tiny`` for the built-in model."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Engine options of the arm (``mtp_k``, ``tree``, ``device``, ``dtype`` ...)."""
    url: str | None = None
    """Base URL of the server for kind ``url``."""
    script: list[str] | None = None
    """Replies of the scripted model for kind ``scripted`` (tests only)."""
    delay_s: float = 0.0
    """Seconds the scripted model waits per reply, to make a test sweep last (kind ``scripted``)."""

    @model_validator(mode="after")
    def _check(self) -> ArmSpec:
        assert self.name and "," not in self.name and "=" not in self.name, f"bad arm name {self.name!r}"
        assert self.kind in ("engine", "url", "scripted"), f"unknown arm kind {self.kind!r}"
        if self.kind == "engine":
            assert self.engine_arm in SERVING_ARMS, (
                f"unknown engine arm {self.engine_arm!r}; one of {SERVING_ARMS}"
            )
        if self.kind == "url":
            assert self.url, f"arm {self.name}: kind url needs a url"
        if self.kind == "scripted":
            assert self.script, f"arm {self.name}: kind scripted needs a script"
        return self

    @property
    def engine_arm(self) -> str:
        return self.arm or self.name

    @property
    def hosted(self) -> bool:
        """Whether a Ray actor hosts the arm (external servers are called directly)."""
        return self.kind != "url"


class SweepConfig(BaseModel):
    """A sweep: arms x tasks x attempts, run with bounded concurrency, resumable by id."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    name: str
    """Human name of the sweep (several sweeps may share it; the id is unique)."""
    suite: str = "astropy-synth"
    """Task suite (``lumotree.tasks`` registry, or ``local-toy`` for the process-local test suite)."""
    arms: list[ArmSpec]
    """The arms, in table order; statistics compare every arm with the first."""
    attempts: int = Field(default=2, ge=1)
    """Attempts per arm and task."""
    limit: int | None = Field(default=None, ge=1)
    """Use only the suite's first ``limit`` tasks."""
    sandboxes: int = Field(default=2, ge=1)
    """Attempts running at once over all arms (each holds one sandbox)."""
    arm_concurrency: int = Field(default=1, ge=1)
    """Attempts running at once per arm (1 keeps server-counter differences exact)."""
    max_tries: int = Field(default=3, ge=1)
    """Tries per attempt before an infrastructure error is final."""
    lease_s: float = Field(default=60.0, gt=0)
    """Lease of a claimed attempt; renewed while it runs; a dead orchestrator's work is reclaimed after it."""
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig())
    """The agent every attempt runs."""

    @model_validator(mode="after")
    def _unique_arms(self) -> SweepConfig:
        names = [a.name for a in self.arms]
        assert names and len(set(names)) == len(names), f"arm names must be unique and non-empty: {names}"
        return self
