"""The sweep orchestrator: plans arms x tasks x attempts in the database, then runs them, bounded.

Every state change goes through the store's claim / lease / finish protocol, so the orchestrator may die at
any instant: a rerun of the same sweep skips finished attempts, reclaims the dead one's attempts (at once when
the dead owner was a process of this host, else when its lease expires) and never runs a finished cell twice.
Infrastructure failures (an arm actor dying, a sandbox failing) mark the attempt ``error``; it is claimed
again until it has used ``max_tries`` tries.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from lumotree.agents.agent import AgentResult, BashAgent
from lumotree.agents.protocols import Model, ModelReply
from lumotree.db import models as dbm
from lumotree.db.store import AttemptClaim, AttemptResult, RequestRecord, Store
from lumotree.platform.provenance import git_commit
from lumotree.platform.sweep_config import SweepConfig
from lumotree.platform.task_backends import TaskBackend
from lumotree.tasks.api import Instance


def make_owner() -> str:
    """``host:pid:nonce``: unique per process; a successor on the same host can see it died."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _owner_is_dead_local(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def request_record(index: int, reply: ModelReply) -> RequestRecord:
    s = reply.stats
    return RequestRecord(
        index=index,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        steps=s.steps,
        drafts=s.drafts,
        draft_tokens=s.draft_tokens,
        accepted_tokens=s.accepted_tokens,
        accepted_per_position=list(s.accepted_per_position),
        spans=dict(s.spans),
        timings={"total_seconds": reply.seconds, "decode_seconds": s.decode_seconds},
        decode_seconds=s.decode_seconds,
        prompt_token_ids=list(reply.prompt_token_ids or []),
        sampling_params=dict(reply.sampling),
        text=reply.text,
        finish_reason=reply.finish_reason,
    )


def attempt_result(
    agent: AgentResult, resolved: bool, eval_seconds: float, wall: float, detail: dict
) -> AttemptResult:
    s = agent.stats
    return AttemptResult(
        resolved=resolved,
        exit_status=agent.exit_status,
        patch=agent.patch,
        requests=agent.requests,
        prompt_tokens=agent.prompt_tokens,
        completion_tokens=agent.completion_tokens,
        decode_tok_s=s.tok_s if s.decode_seconds > 0 else None,
        decode_seconds=s.decode_seconds,
        drafts=s.drafts,
        draft_tokens=s.draft_tokens,
        accepted_tokens=s.accepted_tokens,
        wall_seconds=wall,
        agent_seconds=agent.seconds,
        eval_seconds=eval_seconds,
        extra={
            "format_errors": agent.format_errors,
            "model_seconds": agent.model_seconds,
            "command_seconds": agent.command_seconds,
            "accepted_per_position": agent.stats.accepted_per_position,
            "grade": detail,
        },
    )


@dataclass
class Orchestrator:
    """Runs one sweep's attempts; ``models`` maps arm names to their clients."""

    store: Store
    config: SweepConfig
    backend: TaskBackend
    models: dict[str, Model]
    owner: str = ""

    def __post_init__(self) -> None:
        self.owner = self.owner or make_owner()
        self._instances: dict[str, Instance] = {}
        self._running: dict[int, int] = {}  # attempt id -> arm id, attempts this process runs now
        self._lock = threading.Lock()
        self._sandboxes = threading.BoundedSemaphore(self.config.sandboxes)
        self._stop = threading.Event()
        self.failures: list[str] = []
        self.interrupted = False

    # ---- planning -----------------------------------------------------------------------------------------

    def plan(self, sweep_id: int | None = None, arm_info: dict[str, dict[str, Any]] | None = None) -> int:
        """Create (or complete) the sweep's arms, tasks and attempt cells; returns its id. Idempotent."""
        cfg = self.config
        if sweep_id is None:
            sweep_id = self.store.create_sweep(cfg.name, cfg.model_dump(mode="json"))
        else:
            assert self.store.get_sweep(sweep_id) is not None, f"no sweep {sweep_id}"
            self.store.set_sweep_status(sweep_id, "running")
        commit = git_commit() or ""
        arm_ids = [
            self.store.upsert_arm(
                sweep_id,
                spec.name,
                model=spec.url or spec.model,
                config={**spec.model_dump(mode="json"), **(arm_info or {}).get(spec.name, {})},
                git_commit=commit,
            )
            for spec in cfg.arms
        ]
        instances = self.backend.instances(cfg.limit)
        assert instances, f"suite {cfg.suite} has no instances"
        self._instances = {i.instance_id: i for i in instances}
        task_ids = [self.store.upsert_task(cfg.suite, i.instance_id, i.to_row()) for i in instances]
        self.store.plan_attempts(sweep_id, arm_ids, task_ids, cfg.attempts)
        return sweep_id

    def prepare_tasks(self, on_task: Callable[[str], None] | None = None) -> None:
        """Build every task's sandbox image before attempts start (builds never count as attempt time)."""
        for instance in self._instances.values():
            if on_task:
                on_task(instance.instance_id)
            self.backend.prepare(instance)

    # ---- running ------------------------------------------------------------------------------------------

    def run(self, sweep_id: int) -> None:
        """Run until no attempt of the sweep is runnable or running anywhere (or ``interrupt()``); blocks."""
        self._reclaim_dead_local(sweep_id)
        arm_ids = self._arm_ids(sweep_id)
        threads = [
            threading.Thread(
                target=self._worker, args=(sweep_id, arm_id), daemon=True, name=f"arm-{name}-{slot}"
            )
            for name, arm_id in arm_ids.items()
            for slot in range(self.config.arm_concurrency)
        ]
        heartbeat = threading.Thread(target=self._heartbeat, daemon=True, name="lease-heartbeat")
        heartbeat.start()
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)
        finally:
            self._stop.set()
        if self.interrupted:
            return
        progress = self.store.progress(sweep_id)
        finished = progress["pending"] == 0 and progress["running"] == 0
        self.store.set_sweep_status(sweep_id, "done" if finished else "error")

    def interrupt(self) -> None:
        """Stop claiming and give the attempts in flight back (pending again, try not counted)."""
        self.interrupted = True
        self._stop.set()
        with self._lock:
            running = list(self._running)
        for attempt_id in running:
            self.store.release_attempt(attempt_id, self.owner)

    def _arm_ids(self, sweep_id: int) -> dict[str, int]:
        with self.store.session() as s:
            rows = s.execute(select(dbm.Arm.name, dbm.Arm.id).where(dbm.Arm.sweep_id == sweep_id))
            ids = {name: arm_id for name, arm_id in rows}
        wanted = [a.name for a in self.config.arms]
        missing = [n for n in wanted if n not in ids]
        assert not missing, f"sweep {sweep_id} has no arms {missing}"
        return {n: ids[n] for n in wanted}

    def _running_elsewhere(self, sweep_id: int, arm_id: int) -> int:
        """Running attempts of the arm not run by this process (another live orchestrator, or a dead one)."""
        with self.store.session() as s:
            n = s.scalar(
                select(func.count()).where(
                    dbm.Attempt.sweep_id == sweep_id,
                    dbm.Attempt.arm_id == arm_id,
                    dbm.Attempt.status == dbm.RUNNING,
                )
            )
        with self._lock:
            mine = sum(1 for a in self._running.values() if a == arm_id)
        return int(n or 0) - mine

    def _reclaim_dead_local(self, sweep_id: int) -> None:
        """Expire the leases of attempts whose owner was a process of this host that no longer exists."""
        with self.store.session() as s:
            rows = s.execute(
                select(dbm.Attempt.id, dbm.Attempt.owner).where(
                    dbm.Attempt.sweep_id == sweep_id, dbm.Attempt.status == dbm.RUNNING
                )
            )
            stale = [(i, o) for i, o in rows if o and o != self.owner and _owner_is_dead_local(o)]
        for attempt_id, owner in stale:
            self.store.renew_lease(attempt_id, owner, lease_seconds=-1.0)

    def _worker(self, sweep_id: int, arm_id: int) -> None:
        cfg = self.config
        while not self._stop.is_set():
            with self._sandboxes:
                if self._stop.is_set():
                    return
                claim = self.store.claim_attempt(
                    sweep_id, self.owner, lease_seconds=cfg.lease_s, max_tries=cfg.max_tries, arm_ids=[arm_id]
                )
                if claim is not None:
                    with self._lock:
                        self._running[claim.attempt_id] = arm_id
                    try:
                        self.run_attempt(claim)
                    finally:
                        with self._lock:
                            self._running.pop(claim.attempt_id, None)
                    continue
            # Nothing claimable: done, unless someone else still runs (or a dead owner still holds) attempts.
            if self._running_elsewhere(sweep_id, arm_id) <= 0:
                return
            self._reclaim_dead_local(sweep_id)
            self._stop.wait(min(2.0, cfg.lease_s / 4))

    def _heartbeat(self) -> None:
        interval = max(0.2, self.config.lease_s / 3)
        while not self._stop.wait(interval):
            with self._lock:
                running = list(self._running)
            for attempt_id in running:
                self.store.renew_lease(attempt_id, self.owner, lease_seconds=self.config.lease_s)

    def _instance(self, claim: AttemptClaim) -> Instance:
        if claim.instance_id not in self._instances:
            with self.store.session() as s:
                task = s.get(dbm.Task, claim.task_id)
                assert task is not None
                self._instances[claim.instance_id] = Instance.model_validate(task.data)
        return self._instances[claim.instance_id]

    def run_attempt(self, claim: AttemptClaim) -> None:
        """One try of one attempt: agent in a fresh sandbox, grade, store. Failures become ``error`` rows."""
        start = time.monotonic()
        attempt_id = claim.attempt_id

        def on_event(kind: str, payload: dict[str, Any]) -> None:
            if kind == "request":
                reply = ModelReply.from_dict(payload["reply"])
                self.store.record_request(attempt_id, request_record(payload["index"], reply))
            else:
                self.store.record_event(attempt_id, kind, payload)

        try:
            instance = self._instance(claim)
            model = self.models[claim.arm_name]
            with self.backend.sandbox(instance) as env:
                agent = BashAgent(model, env, self.config.agent, on_event=on_event).run(
                    instance.problem_statement
                )
            if agent.patch.strip():
                verdict = self.backend.grade(instance, agent.patch)
                resolved, eval_seconds, detail = verdict.resolved, verdict.seconds, verdict.detail
            else:
                resolved, eval_seconds, detail = False, 0.0, {"reason": "empty patch"}
            result = attempt_result(agent, resolved, eval_seconds, time.monotonic() - start, detail)
            if not self.store.finish_attempt(attempt_id, self.owner, result):
                self.failures.append(f"attempt {attempt_id}: lost its lease before finishing")
        except Exception as exc:  # infrastructure failure: the attempt is retried while tries remain
            text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
            self.failures.append(
                f"attempt {attempt_id} ({claim.arm_name}, {claim.instance_id}): {type(exc).__name__}"
            )
            self.store.record_event(attempt_id, "error", {"error": text, "try": claim.tries})
            self.store.fail_attempt(attempt_id, self.owner, text)
