"""The orchestrator in-process with scripted models on the local-toy suite (no Ray): planning, grading,
records, idempotent re-planning and the summary statistics."""

from __future__ import annotations

from pathlib import Path

from sweep_helpers import FIX, NOOP, check_sweep, script

from lumotree.agents.scripted import ScriptedModel
from lumotree.db.store import Store
from lumotree.platform.orchestrator import Orchestrator
from lumotree.platform.sweep_config import ArmSpec, SweepConfig
from lumotree.platform.sweep_summary import summarize, summary_table
from lumotree.platform.task_backends import LocalToyBackend


def test_sweep_runs_grades_and_summarizes(tmp_path: Path) -> None:
    fix, noop = script(FIX, 0), script(NOOP, 0)
    config = SweepConfig(
        name="toy",
        suite="local-toy",
        arms=[
            ArmSpec(name="fixer", kind="scripted", script=fix),
            ArmSpec(name="idle", kind="scripted", script=noop),
        ],
        attempts=2,
        limit=3,
        sandboxes=2,
    )
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    models = {"fixer": ScriptedModel(fix), "idle": ScriptedModel(noop)}
    orch = Orchestrator(store, config, LocalToyBackend(root=tmp_path / "toy"), models)
    sweep_id = orch.plan()
    assert orch.plan(sweep_id) == sweep_id  # re-planning adds nothing
    orch.run(sweep_id)
    assert orch.failures == []
    attempts = check_sweep(store, sweep_id, {"fixer": 3, "idle": 2}, tasks=3, attempts=2)
    assert all(a.tries == 1 for a in attempts)
    rows = {r["arm"]: r for r in summarize(store, sweep_id)}
    assert rows["fixer"]["resolved"] == 6 and rows["idle"]["resolved"] == 0
    assert rows["fixer"]["requests"] == 18 and rows["idle"]["requests"] == 12
    # 6/6 against 0/6: Fisher's exact two-sided p = 2 / C(12, 6).
    assert abs(rows["idle"]["fisher_p_vs_first"] - 2 / 924) < 1e-12
    assert rows["idle"]["wilson_high"] < 0.5 < rows["fixer"]["wilson_low"]
    assert store.get_sweep(sweep_id).status == "done"
    table = summary_table(list(rows.values()))
    assert table.row_count == 2
