"""SQLAlchemy 2 models of a sweep: sweeps, arms, tasks, attempts, requests, agent events and replay results.

One attempt = one (sweep, arm, task, attempt index) cell; its unique key makes planning and resuming
idempotent. Statistics an arm is judged by live on the attempt row (filled once, at finish) so the sweep page
reads one table; per-request detail lives in ``requests`` and the agent's trace in ``agent_events``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Attempt statuses. pending: planned, never claimed; running: claimed by ``owner`` until ``lease_until``
# (a dead owner's lease expires and the attempt is claimed again); done: finished with a result (resolved
# or not); error: the last try failed (infrastructure, not the agent) and may be retried up to a try limit.
PENDING, RUNNING, DONE, ERROR = "pending", "running", "done", "error"
ATTEMPT_STATUSES = (PENDING, RUNNING, DONE, ERROR)
# Sweep statuses.
SWEEP_STATUSES = ("pending", "running", "done", "error", "cancelled")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps naive text: store UTC, reattach it)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert value.tzinfo is not None, "store timezone-aware datetimes only"
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        return None if value is None else value.replace(tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, dt.datetime: UTCDateTime}


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # The sweep's full configuration (arms, suite, attempts, limits, sampling) as given by the user.
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    finished: Mapped[dt.datetime | None] = mapped_column(default=None)

    arms: Mapped[list[Arm]] = relationship(back_populates="sweep", order_by="Arm.id")


class Arm(Base):
    __tablename__ = "arms"
    __table_args__ = (UniqueConstraint("sweep_id", "name", name="uq_arms_sweep_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    # Model path or name the arm serves (``tiny`` for the built-in model).
    model: Mapped[str] = mapped_column(String(500), default="")
    # Snapshot of the arm's resolved configuration (drafter, tree, k, sampling, engine settings).
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Git commit of the code that served the arm ("" when unknown), "+dirty" suffix for a modified tree.
    git_commit: Mapped[str] = mapped_column(String(64), default="")

    sweep: Mapped[Sweep] = relationship(back_populates="arms")


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("suite", "instance_id", name="uq_tasks_suite_instance"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    suite: Mapped[str] = mapped_column(String(100))
    instance_id: Mapped[str] = mapped_column(String(300))
    # The instance as the suite gives it (SWE-bench schema: repo, base_commit, problem_statement, ...).
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("sweep_id", "arm_id", "task_id", "attempt_index", name="uq_attempts_cell"),
        # Serves claim_attempt: runnable attempts of a sweep in (attempt index, id) order without a sort.
        Index("ix_attempts_claim", "sweep_id", "status", "attempt_index"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    arm_id: Mapped[int] = mapped_column(ForeignKey("arms.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    attempt_index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    # How many times the attempt was claimed (1 on a clean run; more after a crash or a retried error).
    tries: Mapped[int] = mapped_column(Integer, default=0)
    owner: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_until: Mapped[dt.datetime | None] = mapped_column(default=None)
    started: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished: Mapped[dt.datetime | None] = mapped_column(default=None)
    # Result (None until done). resolved: the grader's verdict on the submitted patch.
    resolved: Mapped[bool | None] = mapped_column(Boolean, default=None)
    exit_status: Mapped[str | None] = mapped_column(String(100), default=None)
    patch: Mapped[str | None] = mapped_column(Text, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # Decode rate from the server's counter differences over the attempt: generated tokens / decode seconds.
    decode_tok_s: Mapped[float | None] = mapped_column(Float, default=None)
    decode_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    # Speculative counters over the attempt (vLLM's definitions): rate = accepted / draft tokens,
    # length = 1 + accepted / drafts. None for the AR arm.
    drafts: Mapped[int] = mapped_column(Integer, default=0)
    draft_tokens: Mapped[int] = mapped_column(Integer, default=0)
    accepted_tokens: Mapped[int] = mapped_column(Integer, default=0)
    acceptance_rate: Mapped[float | None] = mapped_column(Float, default=None)
    acceptance_length: Mapped[float | None] = mapped_column(Float, default=None)
    wall_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    agent_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    eval_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    # Anything else the orchestrator wants to keep (grader log excerpt, F2P/P2P counts, limits hit...).
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)

    arm: Mapped[Arm] = relationship()
    task: Mapped[Task] = relationship()


class Request(Base):
    """One model call of an attempt, with everything needed to replay it on another arm."""

    __tablename__ = "requests"
    __table_args__ = (UniqueConstraint("attempt_id", "index", name="uq_requests_attempt_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # Engine steps (target forwards) that produced the completion.
    steps: Mapped[int] = mapped_column(Integer, default=0)
    drafts: Mapped[int] = mapped_column(Integer, default=0)
    draft_tokens: Mapped[int] = mapped_column(Integer, default=0)
    accepted_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # accepted_per_position[i]: drafts whose position i+1 was accepted.
    accepted_per_position: Mapped[list[Any]] = mapped_column(default=list)
    # Phase spans: {"draft": s, "verify": s, "commit": s, ...} or a list of [name, start, end].
    spans: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Timings in seconds: ttft, decode_seconds, total_seconds, queue ...
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    decode_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    prompt_token_ids: Mapped[list[Any]] = mapped_column(default=list)
    sampling_params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    text: Mapped[str] = mapped_column(Text, default="")
    finish_reason: Mapped[str | None] = mapped_column(String(32), default=None)
    created: Mapped[dt.datetime] = mapped_column(default=utcnow)


class AgentEvent(Base):
    """The agent's trace, append-only: messages, commands, observations, submission (kind + JSON payload)."""

    __tablename__ = "agent_events"
    __table_args__ = (UniqueConstraint("attempt_id", "seq", name="uq_agent_events_attempt_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    # message (payload: role, content), command (command), output (output, exit_code...), submission, error
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    time: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ReplayRun(Base):
    """One replay benchmark invocation over a request corpus."""

    __tablename__ = "replay_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Corpus name: "sweep:<id>" or a corpus file's name.
    corpus: Mapped[str] = mapped_column(String(500))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), default=None)
    created: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # Replay settings: arms, runs, max tokens, model, device, git commit.
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)

    results: Mapped[list[ReplayResult]] = relationship(
        back_populates="run", order_by="(ReplayResult.arm, ReplayResult.run_index)"
    )


class ReplayResult(Base):
    """One arm's pass over the corpus: pooled rate = sum(tokens) / sum(decode seconds) as the paper pools."""

    __tablename__ = "replay_results"
    __table_args__ = (UniqueConstraint("replay_id", "arm", "run_index", name="uq_replay_results_cell"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    replay_id: Mapped[int] = mapped_column(ForeignKey("replay_runs.id", ondelete="CASCADE"))
    arm: Mapped[str] = mapped_column(String(100))
    run_index: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    decode_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    pooled_tok_s: Mapped[float] = mapped_column(Float, default=0.0)
    acceptance_length: Mapped[float | None] = mapped_column(Float, default=None)
    # Per-position acceptance rates (position 1..k) pooled over the corpus.
    per_position: Mapped[list[Any]] = mapped_column(default=list)
    # Phase spans pooled over the corpus, seconds: {"draft": s, "verify": s, "commit": s, ...}.
    spans: Mapped[dict[str, Any]] = mapped_column(default=dict)
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)

    run: Mapped[ReplayRun] = relationship(back_populates="results")
