"""Export a sweep for other tools: mini-swe-agent trajectories, an append-only JSONL event log, SWE-bench
predictions, and summary tables (CSV / parquet).

Layout under the output folder:
    traj/<arm>/attempt-<k>/<instance_id>/<instance_id>.traj.json  one per attempt (mini-swe-agent's layout)
    events.jsonl                                  every agent event, appended, never rewritten
    preds/<arm>__attempt-<k>.jsonl                SWE-bench predictions, one file per arm and attempt index
    attempts.csv|parquet, arms.csv|parquet        one row per attempt / per arm
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from lumotree.dashboards import views
from lumotree.db import models as m
from lumotree.db import queries as q

TRAJECTORY_FORMAT = "mini-swe-agent-1"
FORMATS = ("traj", "jsonl", "preds", "csv", "parquet")
# Exit statuses as mini-swe-agent spells them (ours are snake_case).
EXIT_STATUS = {
    "submitted": "Submitted",
    "step_limit": "LimitsExceeded",
    "token_limit": "LimitsExceeded",
    "wall_limit": "TimeoutError",
    "context_length": "ContextWindowExceeded",
}


def _safe(name: str) -> str:
    """A file-name-safe version of an arm name or instance id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "_"


def model_name(sweep: dict[str, Any], arm: str, attempt_index: int) -> str:
    """``model_name_or_path`` of a predictions file: SWE-bench uses it as a folder name, so no slashes."""
    return f"lumotree-{_safe(sweep['name'])}-{sweep['id']}-{_safe(arm)}-a{attempt_index}"


def trajectory(detail: dict[str, Any]) -> dict[str, Any]:
    """A mini-swe-agent ``.traj.json`` document for one attempt (``queries.attempt_detail`` output), with our
    decode statistics under ``info.lumotree``."""
    messages = [
        {"role": e["payload"].get("role", "user"), "content": e["payload"].get("content", "")}
        for e in detail["events"]
        if e["kind"] == "message"
    ]
    if not messages:
        messages = list(detail.get("extra", {}).get("messages", []))
    status = detail["exit_status"] or ("Error" if detail["error"] else "")
    fields = ("resolved", "status", "tries", "error", "requests", "prompt_tokens", "completion_tokens")
    decode = ("decode_tok_s", "decode_seconds", "drafts", "draft_tokens", "accepted_tokens")
    accept = ("acceptance_rate", "acceptance_length", "wall_seconds", "agent_seconds", "eval_seconds")
    per_request: tuple[str, ...] = (
        "index",
        "prompt_tokens",
        "completion_tokens",
        "steps",
        "drafts",
        "draft_tokens",
    )
    per_request += ("accepted_tokens", "accepted_per_position", "spans", "timings", "decode_seconds")
    return {
        "info": {
            "exit_status": EXIT_STATUS.get(status, status),
            "submission": detail["patch"] or "",
            "model_stats": {"instance_cost": 0.0, "api_calls": detail["requests"]},
            "config": {"arm": detail["arm"]["config"], "model": detail["arm"]["model"]},
            "lumotree": {
                "sweep_id": detail["sweep_id"],
                "attempt_id": detail["id"],
                "arm": detail["arm"]["name"],
                "attempt_index": detail["attempt_index"],
                "git_commit": detail["arm"]["git_commit"],
                "exit_status": detail["exit_status"],
                **{k: detail[k] for k in fields + decode + accept},
                "per_request": [{k: r[k] for k in per_request} for r in detail["request_rows"]],
            },
        },
        "messages": messages,
        "trajectory_format": TRAJECTORY_FORMAT,
        "instance_id": detail["task"]["instance_id"],
    }


def export_traj(s: Session, sweep_id: int, out: Path) -> list[Path]:
    paths = []
    for row in q.attempts(s, sweep_id):
        if row["status"] != "done":
            continue
        detail = q.attempt_detail(s, row["id"])
        assert detail is not None
        iid = _safe(row["instance_id"])
        path = out / "traj" / _safe(row["arm"]) / f"attempt-{row['attempt_index']}" / iid / f"{iid}.traj.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(trajectory(detail), indent=2, ensure_ascii=False))
        paths.append(path)
    return paths


def export_events(s: Session, sweep_id: int, out: Path) -> list[Path]:
    """Append the sweep's events not yet in ``events.jsonl`` (keyed by attempt id and seq): re-exporting a
    growing sweep only appends, so readers can tail the file."""
    path = out / "events.jsonl"
    seen: set[tuple[int, int]] = set()
    if path.exists():
        with path.open() as f:
            for line in f:
                if line.strip():
                    ev = json.loads(line)
                    seen.add((ev["attempt_id"], ev["seq"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for ev in q.iter_sweep_events(s, sweep_id):
            if (ev["attempt_id"], ev["seq"]) not in seen:
                f.write(json.dumps(ev, ensure_ascii=False) + "\n")
    return [path]


def export_preds(s: Session, sweep_id: int, out: Path) -> list[Path]:
    """SWE-bench predictions: one JSONL per (arm, attempt index), every finished attempt's patch."""
    sweep = s.get(m.Sweep, sweep_id)
    assert sweep is not None
    info = q.sweep_dict(sweep)
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in q.attempts(s, sweep_id, with_patch=True):
        if row["status"] == "done":
            groups.setdefault((row["arm"], row["attempt_index"]), []).append(row)
    paths = []
    for (arm, index), rows in sorted(groups.items()):
        path = out / "preds" / f"{_safe(arm)}__attempt-{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        name = model_name(info, arm, index)
        with path.open("w") as f:
            for row in rows:
                pred = {
                    "instance_id": row["instance_id"],
                    "model_name_or_path": name,
                    "model_patch": row["patch"] or "",
                }
                f.write(json.dumps(pred, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def summary_tables(s: Session, sweep_id: int) -> dict[str, list[dict[str, Any]]]:
    """Rows of the attempts table and of the per-arm table (with Wilson intervals), flat values only."""
    attempts = q.attempts(s, sweep_id)
    arms = views.sweep_view(s, sweep_id)
    assert arms is not None
    arm_rows = [{k: v for k, v in a.items() if not isinstance(v, dict)} for a in arms["arms"]]
    return {"attempts": attempts, "arms": arm_rows}


def _write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    rows = list(rows)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def export_tables(s: Session, sweep_id: int, out: Path, fmt: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in summary_tables(s, sweep_id).items():
        path = out / f"{name}.{fmt}"
        if fmt == "csv":
            _write_csv(path, rows)
        else:
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError as exc:  # the small dashboard image leaves pyarrow out
                raise RuntimeError(
                    "parquet export needs pyarrow: pip install pyarrow (or use --format csv)"
                ) from exc

            pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return paths


def export(s: Session, sweep_id: int, fmt: str, out: Path) -> list[Path]:
    """Write one format of the sweep under ``out``; returns the files written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if views.sweep_view(s, sweep_id) is None:
        raise KeyError(f"sweep {sweep_id} not found")
    out = Path(out)
    if fmt == "traj":
        return export_traj(s, sweep_id, out)
    if fmt == "jsonl":
        return export_events(s, sweep_id, out)
    if fmt == "preds":
        return export_preds(s, sweep_id, out)
    return export_tables(s, sweep_id, out, fmt)
