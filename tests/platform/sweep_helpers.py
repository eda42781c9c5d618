"""Shared pieces of the sweep tests: scripts for the scripted arms and database checks."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import func, select

from lumotree.db import models as dbm
from lumotree.db.store import Store


def bash(text: str) -> str:
    return f"THOUGHT: next.\n\n```bash\n{text}\n```\n"


# Fixes every local-toy task (the bug is always "a - b"); the sleep makes attempts last long enough to kill.
FIX = [
    bash("sleep {delay} && cat calc.py"),
    bash("sed -i 's/a - b/a + b/' calc.py && python3 test_calc.py"),
    bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
]
# Looks around and submits nothing.
NOOP = [bash("sleep {delay} && ls"), bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]


def script(replies: list[str], delay: float) -> list[str]:
    return [r.replace("{delay}", str(delay)) for r in replies]


def check_sweep(store: Store, sweep_id: int, arms: dict[str, int], tasks: int, attempts: int) -> list[Any]:
    """Every planned cell exists exactly once, is done, and holds exactly one episode's requests and events.

    ``arms`` maps arm name -> requests per episode of its script. Returns the attempt rows."""
    with store.session() as s:
        rows = s.execute(
            select(dbm.Attempt, dbm.Arm.name).join(dbm.Arm).where(dbm.Attempt.sweep_id == sweep_id)
        ).all()
        cells = Counter((arm, a.task_id, a.attempt_index) for a, arm in rows)
        assert len(cells) == len(arms) * tasks * attempts, cells
        assert set(cells.values()) == {1}
        for attempt, arm in rows:
            assert attempt.status == dbm.DONE, (arm, attempt.status, attempt.error)
            n_req = s.scalar(select(func.count()).where(dbm.Request.attempt_id == attempt.id))
            assert n_req == attempt.requests == arms[arm], (arm, n_req, attempt.requests)
            kinds = Counter(
                s.scalars(select(dbm.AgentEvent.kind).where(dbm.AgentEvent.attempt_id == attempt.id)).all()
            )
            # One episode: one submission, one finish, one command per request, no leftovers of a killed try.
            assert kinds["submitted"] == 1 and kinds["finished"] == 1 and kinds["command"] == arms[arm], kinds
            assert kinds["error"] == 0, kinds
        return [a for a, _ in rows]
