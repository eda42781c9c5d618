"""End to end in Docker: a new instance file in the SWE-bench schema validates with no code change, and a
second run reuses every image (found by content hash) and the recorded release decision."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

# One instance whose release builds on the first try keeps CI at one testbed build (cached afterwards).
CI_INSTANCE = "astropy__astropy-14182"


def _validate(path: Path) -> dict:
    from lumotree.platform.cli import app

    result = CliRunner().invoke(
        app, ["tasks", "validate", "--suite", "swebench-astropy", "--dataset", str(path), "--json"]
    )
    assert result.exit_code == 0, result.output[-3000:]
    return json.loads(result.stdout[result.stdout.index("{") :])


def _our_images() -> dict[str, str]:
    from lumotree.tasks.rootfs import docker_client

    return {
        tag: img.id for img in docker_client().images.list(name="lumotree/swebench-*") for tag in img.tags
    }


@pytest.mark.docker
@pytest.mark.slow
def test_copied_instance_validates_and_second_run_reuses(
    docker_ready: None, shared_data: Path, tmp_path: Path
) -> None:
    rows = [
        json.loads(line) for line in (shared_data / "swebench" / "astropy.jsonl").read_text().splitlines()
    ]
    row = next(r for r in rows if r["instance_id"] == CI_INSTANCE)
    # A "new" instance: another id and no v5 fields, so nothing about the shared file is assumed.
    row = {k: v for k, v in row.items() if k not in ("eval_script", "image", "log_parser", "eval_type")}
    row["instance_id"] = "example__astropy-copy-1"
    path = tmp_path / "new.jsonl"
    path.write_text(json.dumps(row) + "\n")

    report = _validate(path)
    assert report["valid_count"] == 1, report
    (entry,) = report["instances"]
    assert entry == {
        "instance_id": "example__astropy-copy-1",
        "env_ok": True,
        "gold_resolved": True,
        "empty_resolved": False,
        "valid": True,
        "reason": "",
    }

    from lumotree.tasks.api import get_suite

    suite = get_suite("swebench-astropy", dataset=str(path))
    (inst,) = suite.instances()
    res = suite.resolution(inst, build=False)  # recorded: found without building anything
    assert res.direction in ("F", "R") and res.release and res.attempts[-1].outcome == "valid"

    before = _our_images()
    t0 = time.monotonic()
    again = _validate(path)
    assert again["valid_count"] == 1
    assert _our_images() == before, "a second run must not build or retag any image"
    assert suite.image_for(inst, build=False) == res.image
    assert time.monotonic() - t0 < 300
