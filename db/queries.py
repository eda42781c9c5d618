"""Read-side queries for the dashboard and the exporters; every function returns JSON-ready dicts and lists.

Aggregates are computed in SQL (one grouped query per table) so a 10,000-attempt sweep costs a handful of
queries, never one per attempt.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from lumotree.db import models as m
from lumotree.db.store import acceptance

# Attempt columns that are plain values (everything but relationships), in a stable order for tables and CSV.
ATTEMPT_FIELDS = (
    "id",
    "sweep_id",
    "arm_id",
    "task_id",
    "attempt_index",
    "status",
    "tries",
    "owner",
    "started",
    "finished",
    "resolved",
    "exit_status",
    "error",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "decode_tok_s",
    "decode_seconds",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "acceptance_length",
    "wall_seconds",
    "agent_seconds",
    "eval_seconds",
)


def iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _row(obj: Any, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
    out = {}
    for name in fields:
        value = getattr(obj, name)
        out[name] = iso(value) if isinstance(value, dt.datetime) else value
    return out


def sweep_dict(sweep: m.Sweep) -> dict[str, Any]:
    return _row(sweep, ["id", "name", "created", "config", "status", "finished"])


def list_sweeps(s: Session) -> list[dict[str, Any]]:
    """Every sweep, newest first, with attempt counts by status, resolved count and number of arms."""
    counts: dict[int, dict[str, int]] = {}
    by_status = select(
        m.Attempt.sweep_id,
        m.Attempt.status,
        func.count(),
        func.count(case((m.Attempt.resolved.is_(True), 1))),
    )
    for sweep_id, status, n, resolved in s.execute(by_status.group_by(m.Attempt.sweep_id, m.Attempt.status)):
        c = counts.setdefault(sweep_id, {**dict.fromkeys(m.ATTEMPT_STATUSES, 0), "total": 0, "resolved": 0})
        c[status] = n
        c["total"] += n
        c["resolved"] += resolved
    arms = {k: n for k, n in s.execute(select(m.Arm.sweep_id, func.count()).group_by(m.Arm.sweep_id))}
    empty = {**dict.fromkeys(m.ATTEMPT_STATUSES, 0), "total": 0, "resolved": 0}
    return [
        {**sweep_dict(sw), "arms": arms.get(sw.id, 0), "progress": counts.get(sw.id, empty)}
        for sw in s.scalars(select(m.Sweep).order_by(m.Sweep.id.desc()))
    ]


def arm_stats(s: Session, sweep_id: int) -> list[dict[str, Any]]:
    """Per arm: attempt counts, resolved, sums of requests/tokens/seconds, pooled decode rate (completion
    tokens / decode seconds over done attempts), per-attempt tok/s range, pooled acceptance (vLLM's rules)."""
    a = m.Attempt
    done = a.status == m.DONE
    in_done = lambda col: func.sum(case((done, col), else_=0))
    query = (
        select(
            a.arm_id,
            func.count().label("attempts"),
            func.count(case((done, 1))).label("done"),
            func.count(case((a.status == m.RUNNING, 1))).label("running"),
            func.count(case((a.status == m.ERROR, 1))).label("error"),
            func.count(case((a.resolved.is_(True), 1))).label("resolved"),
            in_done(a.requests).label("requests"),
            in_done(a.prompt_tokens).label("prompt_tokens"),
            in_done(a.completion_tokens).label("completion_tokens"),
            in_done(a.decode_seconds).label("decode_seconds"),
            in_done(a.drafts).label("drafts"),
            in_done(a.draft_tokens).label("draft_tokens"),
            in_done(a.accepted_tokens).label("accepted_tokens"),
            in_done(a.wall_seconds).label("wall_seconds"),
            in_done(a.agent_seconds).label("agent_seconds"),
            in_done(a.eval_seconds).label("eval_seconds"),
            func.min(case((done, a.decode_tok_s))).label("tok_s_min"),
            func.max(case((done, a.decode_tok_s))).label("tok_s_max"),
        )
        .where(a.sweep_id == sweep_id)
        .group_by(a.arm_id)
    )
    sums = {row.arm_id: row._asdict() for row in s.execute(query)}
    out = []
    for arm in s.scalars(select(m.Arm).where(m.Arm.sweep_id == sweep_id).order_by(m.Arm.id)):
        row = sums.get(arm.id, {})
        stats = {k: (v or 0) for k, v in row.items() if k not in ("arm_id", "tok_s_min", "tok_s_max")}
        decode_seconds = float(stats.get("decode_seconds", 0.0))
        rate, length = acceptance(
            stats.get("drafts", 0), stats.get("draft_tokens", 0), stats.get("accepted_tokens", 0)
        )
        out.append(
            {
                **_row(arm, ["id", "name", "model", "config", "git_commit"]),
                **{
                    k: stats.get(k, 0)
                    for k in ("attempts", "done", "running", "error", "resolved", "requests")
                },
                **{
                    k: stats.get(k, 0)
                    for k in ("prompt_tokens", "completion_tokens", "drafts", "draft_tokens")
                },
                "accepted_tokens": stats.get("accepted_tokens", 0),
                "decode_seconds": decode_seconds,
                "decode_tok_s": stats.get("completion_tokens", 0) / decode_seconds
                if decode_seconds > 0
                else None,
                "tok_s_min": row.get("tok_s_min"),
                "tok_s_max": row.get("tok_s_max"),
                "acceptance_rate": rate,
                "acceptance_length": length,
                **{k: float(stats.get(k, 0.0)) for k in ("wall_seconds", "agent_seconds", "eval_seconds")},
            }
        )
    return out


def attempt_matrix(s: Session, sweep_id: int) -> dict[str, Any]:
    """The tasks x arms x attempts grid: ``tasks`` (id, suite, instance_id) by instance id, and ``cells``
    as compact rows [attempt id, task id, arm id, attempt index, status, resolved, decode tok/s] ordered by
    (task, arm, index). Core statements on the tables: ORM rows cost several times more at 10,000 cells."""
    a, t = m.Attempt.__table__.c, m.Task.__table__.c
    conn = s.connection()
    cells = [
        list(row)
        for row in conn.execute(
            select(a.id, a.task_id, a.arm_id, a.attempt_index, a.status, a.resolved, a.decode_tok_s)
            .where(a.sweep_id == sweep_id)
            .order_by(a.task_id, a.arm_id, a.attempt_index)
        )
    ]
    in_sweep = select(a.task_id).where(a.sweep_id == sweep_id).distinct().subquery()
    tasks = [
        {"id": task_id, "suite": suite, "instance_id": iid}
        for task_id, suite, iid in conn.execute(
            select(t.id, t.suite, t.instance_id)
            .join(in_sweep, in_sweep.c.task_id == t.id)
            .order_by(t.instance_id)
        )
    ]
    return {"tasks": tasks, "cells": cells}


def attempts(s: Session, sweep_id: int, *, with_patch: bool = False) -> list[dict[str, Any]]:
    """Every attempt of the sweep with its arm name and instance id (ordered by arm, task, attempt index)."""
    fields = ATTEMPT_FIELDS + (("patch",) if with_patch else ())
    rows = s.execute(
        select(m.Attempt, m.Arm.name, m.Arm.model, m.Task.suite, m.Task.instance_id)
        .join(m.Arm, m.Arm.id == m.Attempt.arm_id)
        .join(m.Task, m.Task.id == m.Attempt.task_id)
        .where(m.Attempt.sweep_id == sweep_id)
        .order_by(m.Arm.id, m.Task.instance_id, m.Attempt.attempt_index)
    )
    return [
        {**_row(att, fields), "arm": arm, "model": model, "suite": suite, "instance_id": iid}
        for att, arm, model, suite, iid in rows
    ]


def attempt_detail(s: Session, attempt_id: int, *, token_ids: bool = False) -> dict[str, Any] | None:
    """One attempt with arm, task, ``request_rows`` (prompt token ids only if asked: large), ``events``."""
    att = s.get(m.Attempt, attempt_id)
    if att is None:
        return None
    req_fields = [c.name for c in m.Request.__table__.columns if token_ids or c.name != "prompt_token_ids"]
    requests = [
        _row(r, req_fields)
        for r in s.scalars(
            select(m.Request).where(m.Request.attempt_id == attempt_id).order_by(m.Request.index)
        )
    ]
    return {
        **_row(att, ATTEMPT_FIELDS + ("patch", "extra")),
        "arm": _row(att.arm, ["id", "name", "model", "config", "git_commit"]),
        "task": _row(att.task, ["id", "suite", "instance_id", "data"]),
        # The count stays under "requests" (an attempt column); the rows go here.
        "request_rows": requests,
        "events": events(s, attempt_id),
    }


def events(s: Session, attempt_id: int) -> list[dict[str, Any]]:
    rows = s.scalars(
        select(m.AgentEvent).where(m.AgentEvent.attempt_id == attempt_id).order_by(m.AgentEvent.seq)
    )
    return [_row(e, ["seq", "kind", "payload", "time"]) for e in rows]


def iter_sweep_events(s: Session, sweep_id: int) -> Iterator[dict[str, Any]]:
    """Every agent event of the sweep in (attempt, seq) order, with the attempt's arm and instance id."""
    query = (
        select(m.AgentEvent, m.Attempt.attempt_index, m.Arm.name, m.Task.instance_id)
        .join(m.Attempt, m.Attempt.id == m.AgentEvent.attempt_id)
        .join(m.Arm, m.Arm.id == m.Attempt.arm_id)
        .join(m.Task, m.Task.id == m.Attempt.task_id)
        .where(m.Attempt.sweep_id == sweep_id)
        .order_by(m.AgentEvent.attempt_id, m.AgentEvent.seq)
        .execution_options(yield_per=1000)
    )
    for ev, index, arm, iid in s.execute(query):
        yield {
            "sweep_id": sweep_id,
            "attempt_id": ev.attempt_id,
            "arm": arm,
            "instance_id": iid,
            "attempt_index": index,
            **_row(ev, ["seq", "kind", "time", "payload"]),
        }


def list_replays(s: Session) -> list[dict[str, Any]]:
    runs = s.scalars(select(m.ReplayRun).order_by(m.ReplayRun.id.desc()))
    return [_row(r, ["id", "corpus", "sweep_id", "created", "config"]) for r in runs]


def replay_detail(s: Session, replay_id: int) -> dict[str, Any] | None:
    """A replay run with its per-(arm, run) results."""
    run = s.get(m.ReplayRun, replay_id)
    if run is None:
        return None
    fields = [c.name for c in m.ReplayResult.__table__.columns if c.name not in ("id", "replay_id")]
    return {
        **_row(run, ["id", "corpus", "sweep_id", "created", "config"]),
        "results": [_row(r, fields) for r in run.results],
    }
