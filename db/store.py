"""The few functions that write a sweep, idempotent so an orchestrator can die anywhere and resume.

Resume without duplicates: every (sweep, arm, task, attempt index) cell exists once (unique key), is planned
once (``plan_attempts`` skips existing cells), and moves pending -> running (claimed by an owner with a lease)
-> done | error. A killed orchestrator's running attempts keep their owner until the lease expires; then any
owner may claim them again (their half-written requests and events are cleared at that claim). Every write
that changes a claimed attempt checks the owner, so a stale owner cannot overwrite the new one's result.

    store = Store(url)                       # migrates the schema to head
    sweep = store.create_sweep("demo", {...})
    arm = store.upsert_arm(sweep, "mtp", model="tiny", config={...}, git_commit="abc123")
    task = store.upsert_task("astropy-synth", "astropy__astropy-1", {...})
    store.plan_attempts(sweep, [arm], [task], attempts=2)
    while (claim := store.claim_attempt(sweep, owner="host:pid")) is not None:
        store.record_request(claim.attempt_id, RequestRecord(...), owner=claim.owner)
        store.record_event(claim.attempt_id, "message", {"role": "assistant", "content": "..."})
        store.finish_attempt(claim.attempt_id, claim.owner, AttemptResult(resolved=True, ...))
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from lumotree.db import models as m
from lumotree.db.engine import make_engine, write_engine
from lumotree.db.models import DONE, ERROR, PENDING, RUNNING, utcnow


@dataclass(frozen=True)
class AttemptClaim:
    """An attempt this owner now runs: everything the orchestrator needs without another query."""

    attempt_id: int
    sweep_id: int
    arm_id: int
    arm_name: str
    task_id: int
    suite: str
    instance_id: str
    attempt_index: int
    # 1 on the first claim; more when a dead owner's or a failed try is run again.
    tries: int
    owner: str


@dataclass
class AttemptResult:
    """What a finished attempt reports. Acceptance rate/length are derived from the counters (vLLM's rule)."""

    resolved: bool | None = None
    # The agent's exit status (mini-swe-agent style: Submitted, LimitsExceeded, FormatError, TimeoutError).
    exit_status: str | None = None
    patch: str | None = None
    error: str | None = None
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Generated tokens / decode seconds, both from the server's counter differences over the attempt.
    decode_tok_s: float | None = None
    decode_seconds: float | None = None
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    wall_seconds: float | None = None
    agent_seconds: float | None = None
    eval_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert min(self.requests, self.prompt_tokens, self.completion_tokens) >= 0
        assert 0 <= self.accepted_tokens <= max(self.draft_tokens, self.accepted_tokens)
        assert self.accepted_tokens <= self.draft_tokens or self.draft_tokens == 0, "accepted > draft tokens"


@dataclass
class RequestRecord:
    """One model call: counters, timings, and the prompt token ids + sampling parameters to replay it."""

    index: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    spans: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    decode_seconds: float | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    sampling_params: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        assert self.index >= 0 and self.completion_tokens >= 0 and self.prompt_tokens >= 0
        assert self.accepted_tokens <= self.draft_tokens or self.draft_tokens == 0, "accepted > draft tokens"


def _update(model: type[m.Base]) -> Any:
    # The ORM's default session synchronization walks the identity map per statement; our sessions are short
    # and never reuse updated objects, so skip it (it was most of the claim's cost).
    return update(model).execution_options(synchronize_session=False)


def _rowcount(result: Any) -> int:
    # Session.execute is typed as returning Result; DML statements give a CursorResult with a rowcount.
    return int(cast(CursorResult[Any], result).rowcount)


def _delete(model: type[m.Base]) -> Any:
    return delete(model).execution_options(synchronize_session=False)


def acceptance(drafts: int, draft_tokens: int, accepted: int) -> tuple[float | None, float | None]:
    """(rate, length) as vLLM computes them: accepted / draft tokens and 1 + accepted / drafts."""
    rate = accepted / draft_tokens if draft_tokens else None
    length = 1.0 + accepted / drafts if drafts else None
    return rate, length


class Store:
    """A database of sweeps. ``Store(url)`` opens (SQLite file by default) and migrates it to the newest
    schema."""

    def __init__(self, url: str | None = None, *, migrate: bool = True, engine: Engine | None = None) -> None:
        self.engine = engine if engine is not None else make_engine(url)
        if migrate:
            from lumotree.db.migrate import upgrade_engine

            upgrade_engine(self.engine)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(write_engine(self.engine), expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read session (for queries); commits nothing."""
        with self._read() as s:
            yield s

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A write transaction (SQLite: write lock taken up front); commits on success."""
        with self._write.begin() as s:
            yield s

    # ---- sweeps, arms, tasks -------------------------------------------------------------------------------

    def create_sweep(self, name: str, config: dict[str, Any], status: str = "running") -> int:
        assert status in m.SWEEP_STATUSES
        with self.writing() as s:
            sweep = m.Sweep(name=name, config=config, status=status)
            s.add(sweep)
            s.flush()
            return sweep.id

    def get_sweep(self, sweep_id: int) -> m.Sweep | None:
        with self.session() as s:
            return s.get(m.Sweep, sweep_id)

    def find_sweep(self, name: str) -> int | None:
        """The newest sweep with this name (for ``--resume NAME``)."""
        with self.session() as s:
            return s.scalar(
                select(m.Sweep.id).where(m.Sweep.name == name).order_by(m.Sweep.id.desc()).limit(1)
            )

    def set_sweep_status(self, sweep_id: int, status: str) -> None:
        assert status in m.SWEEP_STATUSES
        finished = utcnow() if status in ("done", "error", "cancelled") else None
        with self.writing() as s:
            s.execute(_update(m.Sweep).where(m.Sweep.id == sweep_id).values(status=status, finished=finished))

    def upsert_arm(
        self,
        sweep_id: int,
        name: str,
        *,
        model: str = "",
        config: dict[str, Any] | None = None,
        git_commit: str = "",
    ) -> int:
        """The arm's id; an existing arm of the same name in the sweep gets the new snapshot."""
        with self.writing() as s:
            arm = s.scalar(select(m.Arm).where(m.Arm.sweep_id == sweep_id, m.Arm.name == name))
            if arm is None:
                arm = m.Arm(sweep_id=sweep_id, name=name)
                s.add(arm)
            arm.model, arm.config, arm.git_commit = model, dict(config or {}), git_commit
            s.flush()
            return arm.id

    def upsert_task(self, suite: str, instance_id: str, data: dict[str, Any] | None = None) -> int:
        """The task's id; tasks are shared by sweeps (keyed by suite and instance id)."""
        for _ in range(2):  # a concurrent insert of the same task loses the race once, then finds it
            try:
                with self.writing() as s:
                    task = s.scalar(
                        select(m.Task).where(m.Task.suite == suite, m.Task.instance_id == instance_id)
                    )
                    if task is None:
                        task = m.Task(suite=suite, instance_id=instance_id, data=dict(data or {}))
                        s.add(task)
                    elif data is not None:
                        task.data = dict(data)
                    s.flush()
                    return task.id
            except IntegrityError:
                continue
        raise RuntimeError(f"could not upsert task {suite}/{instance_id}")

    def plan_attempts(
        self, sweep_id: int, arm_ids: Sequence[int], task_ids: Sequence[int], attempts: int
    ) -> int:
        """Create the pending cells arms x tasks x range(attempts) that do not exist yet; returns how many."""
        assert attempts >= 1
        with self.writing() as s:
            existing = set(
                s.execute(
                    select(m.Attempt.arm_id, m.Attempt.task_id, m.Attempt.attempt_index).where(
                        m.Attempt.sweep_id == sweep_id
                    )
                )
            )
            rows = [
                {"sweep_id": sweep_id, "arm_id": a, "task_id": t, "attempt_index": i, "status": PENDING}
                for a in arm_ids
                for t in task_ids
                for i in range(attempts)
                if (a, t, i) not in existing
            ]
            if rows:
                s.execute(insert(m.Attempt), rows)
            return len(rows)

    # ---- attempts: claim, lease, finish --------------------------------------------------------------------

    def _claimable(self, now: dt.datetime, max_tries: int) -> Any:
        return or_(
            m.Attempt.status == PENDING,
            and_(m.Attempt.status == RUNNING, m.Attempt.lease_until < now),
            and_(m.Attempt.status == ERROR, m.Attempt.tries < max_tries),
        )

    def _candidate(
        self,
        s: Session,
        sweep_id: int,
        now: dt.datetime,
        max_tries: int,
        arm_ids: Sequence[int] | None,
        attempt_id: int | None,
    ) -> int | None:
        """The next attempt to claim: pending ones first (fresh work), then expired leases, then retryable
        errors; within a class by (attempt index, id) so every cell gets its first attempt early. One indexed
        lookup per class: a sort over a 10,000-attempt sweep per claim would make planning quadratic.

        The row is locked for the claiming transaction and rows other claimers hold are skipped (PostgreSQL's
        FOR UPDATE SKIP LOCKED; SQLite's write transactions are serial already): otherwise every claimer
        picks the same first row, all but one lose the compare-and-set, and on a loaded machine one of them
        could lose 20 rounds in a row."""
        classes = [
            m.Attempt.status == PENDING,
            and_(m.Attempt.status == RUNNING, m.Attempt.lease_until < now),
            and_(m.Attempt.status == ERROR, m.Attempt.tries < max_tries),
        ]
        for condition in classes:
            query = select(m.Attempt.id).where(m.Attempt.sweep_id == sweep_id, condition)
            if arm_ids is not None:
                query = query.where(m.Attempt.arm_id.in_(list(arm_ids)))
            if attempt_id is not None:
                query = query.where(m.Attempt.id == attempt_id)
            query = query.order_by(m.Attempt.attempt_index, m.Attempt.id).limit(1)
            found = s.scalar(query.with_for_update(skip_locked=True))
            if found is not None:
                return found
        return None

    def claim_attempt(
        self,
        sweep_id: int,
        owner: str,
        *,
        lease_seconds: float = 900.0,
        max_tries: int = 3,
        arm_ids: Sequence[int] | None = None,
        attempt_id: int | None = None,
    ) -> AttemptClaim | None:
        """Claim one runnable attempt of the sweep (pending, or running with an expired lease, or error with
        tries left), optionally only among ``arm_ids`` or exactly ``attempt_id``; None if nothing is runnable.
        The claim is a compare-and-set, so concurrent owners never get the same attempt."""
        for _ in range(20):
            now = utcnow()
            with self.writing() as s:
                candidate = self._candidate(s, sweep_id, now, max_tries, arm_ids, attempt_id)
                if candidate is None:
                    return None
                claimed = s.execute(
                    _update(m.Attempt)
                    .where(m.Attempt.id == candidate, self._claimable(now, max_tries))
                    .values(
                        status=RUNNING,
                        owner=owner,
                        lease_until=now + dt.timedelta(seconds=lease_seconds),
                        tries=m.Attempt.tries + 1,
                        started=now,
                        finished=None,
                        error=None,
                    )
                )
                if _rowcount(claimed) != 1:
                    continue  # another owner took it between select and update: pick again
                # A re-claimed attempt restarts from scratch: drop what the dead try wrote.
                s.execute(_delete(m.Request).where(m.Request.attempt_id == candidate))
                s.execute(_delete(m.AgentEvent).where(m.AgentEvent.attempt_id == candidate))
                row = s.execute(
                    select(m.Attempt, m.Arm.name, m.Task.suite, m.Task.instance_id)
                    .join(m.Arm, m.Arm.id == m.Attempt.arm_id)
                    .join(m.Task, m.Task.id == m.Attempt.task_id)
                    .where(m.Attempt.id == candidate)
                ).one()
                a, arm_name, suite, instance_id = row
                return AttemptClaim(
                    attempt_id=a.id,
                    sweep_id=a.sweep_id,
                    arm_id=a.arm_id,
                    arm_name=arm_name,
                    task_id=a.task_id,
                    suite=suite,
                    instance_id=instance_id,
                    attempt_index=a.attempt_index,
                    tries=a.tries,
                    owner=owner,
                )
        raise RuntimeError("could not claim an attempt after 20 races")

    def start_attempt(
        self, sweep_id: int, arm_id: int, task_id: int, attempt_index: int, owner: str, **kwargs: Any
    ) -> AttemptClaim | None:
        """Claim one specific cell (None if it is done, or running under a live lease, or out of tries)."""
        with self.session() as s:
            attempt_id = s.scalar(
                select(m.Attempt.id).where(
                    m.Attempt.sweep_id == sweep_id,
                    m.Attempt.arm_id == arm_id,
                    m.Attempt.task_id == task_id,
                    m.Attempt.attempt_index == attempt_index,
                )
            )
        if attempt_id is None:
            raise KeyError(f"attempt ({sweep_id}, {arm_id}, {task_id}, {attempt_index}) is not planned")
        return self.claim_attempt(sweep_id, owner, attempt_id=attempt_id, **kwargs)

    def _owned(self, attempt_id: int, owner: str) -> Any:
        return and_(m.Attempt.id == attempt_id, m.Attempt.owner == owner, m.Attempt.status == RUNNING)

    def renew_lease(self, attempt_id: int, owner: str, lease_seconds: float = 900.0) -> bool:
        """Extend the lease of a running attempt; False if this owner no longer holds it."""
        with self.writing() as s:
            until = utcnow() + dt.timedelta(seconds=lease_seconds)
            query = _update(m.Attempt).where(self._owned(attempt_id, owner)).values(lease_until=until)
            res = s.execute(query)
            return _rowcount(res) == 1

    def finish_attempt(self, attempt_id: int, owner: str, result: AttemptResult) -> bool:
        """Store the result and mark the attempt done; False (nothing written) if the owner lost it.
        Finishing an attempt that this owner already finished is a no-op that returns True."""
        values = dataclasses.asdict(result)
        rate, length = acceptance(result.drafts, result.draft_tokens, result.accepted_tokens)
        values.update(acceptance_rate=rate, acceptance_length=length)
        with self.writing() as s:
            res = s.execute(
                _update(m.Attempt)
                .where(self._owned(attempt_id, owner))
                .values(status=DONE, finished=utcnow(), lease_until=None, **values)
            )
            if _rowcount(res) == 1:
                return True
            again = s.scalar(
                select(m.Attempt.id).where(
                    m.Attempt.id == attempt_id, m.Attempt.owner == owner, m.Attempt.status == DONE
                )
            )
            return again is not None

    def fail_attempt(self, attempt_id: int, owner: str, error: str) -> bool:
        """Mark the attempt error (an infrastructure failure: it may be claimed again while tries remain)."""
        with self.writing() as s:
            res = s.execute(
                _update(m.Attempt)
                .where(self._owned(attempt_id, owner))
                .values(status=ERROR, error=error, finished=utcnow(), lease_until=None)
            )
            return _rowcount(res) == 1

    def release_attempt(self, attempt_id: int, owner: str) -> bool:
        """Give a running attempt back unstarted (e.g. on Ctrl-C): pending again, try not counted."""
        with self.writing() as s:
            res = s.execute(
                _update(m.Attempt)
                .where(self._owned(attempt_id, owner))
                .values(status=PENDING, owner=None, lease_until=None, started=None, tries=m.Attempt.tries - 1)
            )
            return _rowcount(res) == 1

    def import_attempts(
        self, sweep_id: int, rows: Sequence[tuple[int, int, int, AttemptResult]], owner: str = "import"
    ) -> int:
        """Write finished attempts (arm id, task id, attempt index, result) in one transaction: for importing
        results run elsewhere and for filling large synthetic sweeps. Cells that already exist are left alone;
        returns how many were written."""
        now = utcnow()
        with self.writing() as s:
            existing = set(
                s.execute(
                    select(m.Attempt.arm_id, m.Attempt.task_id, m.Attempt.attempt_index).where(
                        m.Attempt.sweep_id == sweep_id
                    )
                )
            )
            values = []
            for arm_id, task_id, index, result in rows:
                if (arm_id, task_id, index) in existing:
                    continue
                rate, length = acceptance(result.drafts, result.draft_tokens, result.accepted_tokens)
                values.append(
                    {
                        **dataclasses.asdict(result),
                        "sweep_id": sweep_id,
                        "arm_id": arm_id,
                        "task_id": task_id,
                        "attempt_index": index,
                        "status": DONE,
                        "tries": 1,
                        "owner": owner,
                        "started": now,
                        "finished": now,
                        "acceptance_rate": rate,
                        "acceptance_length": length,
                    }
                )
            if values:
                s.execute(insert(m.Attempt), values)
            return len(values)

    # ---- per-request records and the agent trace -----------------------------------------------------------

    def record_request(self, attempt_id: int, record: RequestRecord) -> int:
        """Insert or replace request ``record.index`` of the attempt; returns its row id."""
        values = dataclasses.asdict(record)
        with self.writing() as s:
            row = s.scalar(
                select(m.Request).where(m.Request.attempt_id == attempt_id, m.Request.index == record.index)
            )
            if row is None:
                row = m.Request(attempt_id=attempt_id, **values)
                s.add(row)
            else:
                for key, value in values.items():
                    setattr(row, key, value)
            s.flush()
            return row.id

    def record_event(
        self,
        attempt_id: int,
        kind: str,
        payload: dict[str, Any],
        *,
        seq: int | None = None,
        time: dt.datetime | None = None,
    ) -> int:
        """Append an agent event (seq = next free one unless given; a given seq replaces that event)."""
        with self.writing() as s:
            if seq is None:
                last = s.scalar(
                    select(func.max(m.AgentEvent.seq)).where(m.AgentEvent.attempt_id == attempt_id)
                )
                seq = 0 if last is None else last + 1
            row = s.scalar(
                select(m.AgentEvent).where(m.AgentEvent.attempt_id == attempt_id, m.AgentEvent.seq == seq)
            )
            if row is None:
                row = m.AgentEvent(attempt_id=attempt_id, seq=seq)
                s.add(row)
            row.kind, row.payload, row.time = kind, dict(payload), time or utcnow()
            return seq

    # ---- replay --------------------------------------------------------------------------------------------

    def create_replay(self, corpus: str, config: dict[str, Any], sweep_id: int | None = None) -> int:
        with self.writing() as s:
            run = m.ReplayRun(corpus=corpus, config=config, sweep_id=sweep_id)
            s.add(run)
            s.flush()
            return run.id

    def record_replay_result(self, replay_id: int, arm: str, run_index: int, **values: Any) -> int:
        """Insert or replace one (arm, run) result: requests, completion_tokens, decode_seconds, pooled_tok_s,
        acceptance_length, per_position, spans, extra."""
        with self.writing() as s:
            row = s.scalar(
                select(m.ReplayResult).where(
                    m.ReplayResult.replay_id == replay_id,
                    m.ReplayResult.arm == arm,
                    m.ReplayResult.run_index == run_index,
                )
            )
            if row is None:
                row = m.ReplayResult(replay_id=replay_id, arm=arm, run_index=run_index)
                s.add(row)
            for key, value in values.items():
                assert hasattr(m.ReplayResult, key), f"unknown replay result field {key}"
                setattr(row, key, value)
            s.flush()
            return row.id

    # ---- progress ------------------------------------------------------------------------------------------

    def progress(self, sweep_id: int) -> dict[str, int]:
        """Attempt counts by status (all four keys present) plus ``total`` and ``resolved``."""
        with self.session() as s:
            counts = dict.fromkeys(m.ATTEMPT_STATUSES, 0)
            for status, n in s.execute(
                select(m.Attempt.status, func.count())
                .where(m.Attempt.sweep_id == sweep_id)
                .group_by(m.Attempt.status)
            ):
                counts[status] = n
            resolved = s.scalar(
                select(func.count()).where(m.Attempt.sweep_id == sweep_id, m.Attempt.resolved.is_(True))
            )
            return {**counts, "total": sum(counts.values()), "resolved": int(resolved or 0)}
