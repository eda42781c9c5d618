"""View models: the JSON behind each page, built from ``lumotree.db.queries`` plus the statistics.

Every page renders from exactly the dict its JSON endpoint returns, so the two can never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lumotree.dashboards.stats import wilson_interval
from lumotree.db import models as m
from lumotree.db import queries as q


def sweeps_view(s: Session) -> dict[str, Any]:
    return {"sweeps": q.list_sweeps(s)}


def with_solve_rate(arm: dict[str, Any]) -> dict[str, Any]:
    """Add the solve rate over finished attempts with its 95% Wilson interval."""
    ci = wilson_interval(int(arm["resolved"]), int(arm["done"]))
    return {
        **arm,
        "solve_rate": ci.estimate if arm["done"] else None,
        "solve_low": ci.low,
        "solve_high": ci.high,
    }


def scatter_data(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """Plotly arrays for solve rate vs decode tok/s: one point per arm with finished attempts; x error bars
    span the per-attempt tok/s range, y error bars the Wilson interval."""
    pts = [a for a in arms if a["done"] and a["decode_tok_s"] is not None]
    return {
        "name": [a["name"] for a in pts],
        "x": [a["decode_tok_s"] for a in pts],
        "x_plus": [max(0.0, (a["tok_s_max"] or a["decode_tok_s"]) - a["decode_tok_s"]) for a in pts],
        "x_minus": [max(0.0, a["decode_tok_s"] - (a["tok_s_min"] or a["decode_tok_s"])) for a in pts],
        "y": [a["solve_rate"] for a in pts],
        "y_plus": [a["solve_high"] - a["solve_rate"] for a in pts],
        "y_minus": [a["solve_rate"] - a["solve_low"] for a in pts],
        "n": [a["done"] for a in pts],
    }


def sweep_view(s: Session, sweep_id: int) -> dict[str, Any] | None:
    """Sweep header, progress, per-arm statistics and the scatter (no matrix: see ``matrix_view``)."""
    sweep = s.get(m.Sweep, sweep_id)
    if sweep is None:
        return None
    arms = [with_solve_rate(a) for a in q.arm_stats(s, sweep_id)]
    progress = dict.fromkeys(m.ATTEMPT_STATUSES, 0)
    for a in arms:
        progress["done"] += a["done"]
        progress["running"] += a["running"]
        progress["error"] += a["error"]
        progress["pending"] += a["attempts"] - a["done"] - a["running"] - a["error"]
    progress["total"] = sum(a["attempts"] for a in arms)
    progress["resolved"] = sum(a["resolved"] for a in arms)
    return {"sweep": q.sweep_dict(sweep), "progress": progress, "arms": arms, "scatter": scatter_data(arms)}


def matrix_view(s: Session, sweep_id: int) -> dict[str, Any]:
    """The tasks x arms x attempts grid: ``arm_ids`` (column order) and ``rows`` of {task, cells}, where
    cells[j] lists arm j's attempts on the task as [attempt id, attempt index, status, resolved, tok/s]."""
    raw = q.attempt_matrix(s, sweep_id)
    arm_ids = list(s.scalars(select(m.Arm.id).where(m.Arm.sweep_id == sweep_id).order_by(m.Arm.id)))
    column = {arm_id: i for i, arm_id in enumerate(arm_ids)}
    grid: dict[int, list[list[list[Any]]]] = {}
    width = len(arm_ids)
    for attempt_id, task_id, arm_id, index, status, resolved, tok_s in raw["cells"]:
        row = grid.get(task_id)
        if row is None:
            row = grid[task_id] = [[] for _ in range(width)]
        row[column[arm_id]].append([attempt_id, index, status, resolved, tok_s])
    rows = [{"task": task, "cells": grid.get(task["id"], [])} for task in raw["tasks"]]
    return {"arm_ids": arm_ids, "rows": rows}


def cell_class(status: str, resolved: bool | None) -> str:
    """CSS class of a matrix cell (the same rule as dashboard.js)."""
    return "resolved" if resolved else ("unresolved" if status == "done" else status)


def matrix_cells_html(cells: list[list[Any]]) -> str:
    """One matrix cell's attempts as links: built here rather than in Jinja, which is ~10x slower per element
    and would dominate a 10,000-attempt page."""
    return "".join(
        f'<a href="/attempts/{c[0]}" id="a{c[0]}" class="cell {cell_class(c[2], c[3])}" '
        f'title="attempt {c[1]}: {c[2]}"></a>'
        for c in cells
    )


def task_view(s: Session, sweep_id: int, task_id: int) -> dict[str, Any] | None:
    """One task of a sweep: the instance and every attempt on it, by arm."""
    task = s.get(m.Task, task_id)
    sweep = s.get(m.Sweep, sweep_id)
    if task is None or sweep is None:
        return None
    rows = [a for a in q.attempts(s, sweep_id) if a["task_id"] == task_id]
    return {
        "sweep": q.sweep_dict(sweep),
        "task": {"id": task.id, "suite": task.suite, "instance_id": task.instance_id, "data": task.data},
        "attempts": rows,
    }


def attempt_view(s: Session, attempt_id: int) -> dict[str, Any] | None:
    """The attempt's full trace plus per-request decode statistics and the acceptance histogram."""
    detail = q.attempt_detail(s, attempt_id)
    if detail is None:
        return None
    for r in detail["request_rows"]:
        secs = r["decode_seconds"]
        r["decode_tok_s"] = r["completion_tokens"] / secs if secs else None
        r["acceptance_length"] = 1 + r["accepted_tokens"] / r["drafts"] if r["drafts"] else None
    detail["acceptance_histogram"] = acceptance_histogram(detail["request_rows"])
    return detail


def acceptance_histogram(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Per draft position: accepted count summed over requests and the rate accepted / drafts."""
    depth = max((len(r["accepted_per_position"] or []) for r in requests), default=0)
    accepted = [0] * depth
    for r in requests:
        for i, n in enumerate(r["accepted_per_position"] or []):
            accepted[i] += n
    drafts = sum(r["drafts"] for r in requests)
    return {
        "position": list(range(1, depth + 1)),
        "accepted": accepted,
        "rate": [a / drafts if drafts else 0.0 for a in accepted],
        "drafts": drafts,
    }


def replays_view(s: Session) -> dict[str, Any]:
    return {"replays": q.list_replays(s)}


def replay_view(s: Session, replay_id: int) -> dict[str, Any] | None:
    """A replay run, its per-(arm, run) rows, and per-arm pooled rates with their range over runs."""
    detail = q.replay_detail(s, replay_id)
    if detail is None:
        return None
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in detail["results"]:
        by_arm[r["arm"]].append(r)
    summary = []
    for arm, rows in by_arm.items():
        tokens = sum(r["completion_tokens"] for r in rows)
        seconds = sum(r["decode_seconds"] for r in rows)
        rates = [r["pooled_tok_s"] for r in rows]
        summary.append(
            {
                "arm": arm,
                "runs": len(rows),
                "pooled_tok_s": tokens / seconds if seconds else sum(rates) / len(rates),
                "min_tok_s": min(rates),
                "max_tok_s": max(rates),
                "acceptance_length": _mean([r["acceptance_length"] for r in rows]),
                "per_position": [
                    _mean(list(col)) for col in zip(*(r["per_position"] for r in rows), strict=False)
                ],
            }
        )
    return {**detail, "summary": summary}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
