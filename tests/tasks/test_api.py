"""Instance files: valid rows load, malformed rows fail with errors naming the file, row and instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumotree.tasks.api import (
    Instance,
    InstanceError,
    get_suite,
    load_instances,
    suite_names,
    write_instances,
)

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def row(**over: object) -> dict:
    base = {
        "instance_id": "demo__demo-1",
        "repo": "demo/demo",
        "base_commit": "abc",
        "patch": PATCH,
        "test_patch": (
            "diff --git a/t/test_m.py b/t/test_m.py\n--- a/t/test_m.py\n+++ b/t/test_m.py\n"
            "@@ -1 +1 @@\n-x\n+y\n"
        ),
        "problem_statement": "a is wrong",
        "FAIL_TO_PASS": json.dumps(["t/test_m.py::test_a"]),
        "PASS_TO_PASS": ["t/test_other.py::test_b[1]"],
        "version": "1.0",
    }
    base.update(over)
    return base


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_loads_swebench_rows_with_json_encoded_lists(tmp_path: Path) -> None:
    (inst,) = load_instances(write_jsonl(tmp_path / "ok.jsonl", [row()]))
    assert inst.FAIL_TO_PASS == ["t/test_m.py::test_a"]
    assert inst.test_files() == ["t/test_m.py", "t/test_other.py"]
    out = tmp_path / "round.jsonl"
    write_instances([inst], out)
    assert load_instances(out) == [inst]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS"),
        ({"patch": "just some text"}, "patch"),
        ({"problem_statement": "  "}, "problem_statement"),
    ],
)
def test_malformed_row_names_row_instance_and_field(tmp_path: Path, bad: dict, expected: str) -> None:
    rows = [row(instance_id="demo__demo-1"), row(instance_id="demo__demo-2", **bad)]
    with pytest.raises(InstanceError) as err:
        load_instances(write_jsonl(tmp_path / "bad.jsonl", rows))
    msg = str(err.value)
    assert "bad.jsonl row 2" in msg and "demo__demo-2" in msg and expected in msg, msg


def test_missing_field_invalid_json_duplicates_and_non_objects(tmp_path: Path) -> None:
    r = row()
    del r["repo"]
    with pytest.raises(InstanceError, match=r"m\.jsonl row 1 \(instance_id='demo__demo-1'\): field repo"):
        load_instances(write_jsonl(tmp_path / "m.jsonl", [r]))
    with pytest.raises(InstanceError, match=r"j\.jsonl row 2: not valid JSON"):
        load_instances(write_jsonl(tmp_path / "j.jsonl", [row(), "{broken"]))
    with pytest.raises(InstanceError, match=r"d\.jsonl row 2 .*duplicate of row 1"):
        load_instances(write_jsonl(tmp_path / "d.jsonl", [row(), row()]))
    with pytest.raises(InstanceError, match=r"n\.jsonl row 1: expected an object"):
        load_instances(write_jsonl(tmp_path / "n.jsonl", ["[1, 2]"]))
    with pytest.raises(InstanceError, match="no such file"):
        load_instances(tmp_path / "absent.jsonl")


def test_parquet_rows_are_numbered_too(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [row(), row(instance_id="demo__demo-2", repo="")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    with pytest.raises(InstanceError, match=r"x\.parquet row 2 \(instance_id='demo__demo-2'\): field repo"):
        load_instances(tmp_path / "x.parquet")


def test_shared_swebench_file_loads(shared_data: Path) -> None:
    insts = load_instances(shared_data / "swebench" / "astropy.jsonl")
    assert len(insts) == 16 and all(isinstance(i, Instance) and i.FAIL_TO_PASS for i in insts)


def test_registry() -> None:
    assert "astropy-synth" in suite_names()
    assert get_suite("astropy-synth", seed=3).name == "astropy-synth"
    with pytest.raises(KeyError, match="unknown suite 'nope'"):
        get_suite("nope")
