"""Loading SWE-bench rows: the shared 16 astropy instances, older rows, malformed rows, the hub switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumotree.tasks.api import InstanceError, get_suite
from lumotree.tasks.swebench import specs
from lumotree.tasks.swebench.config import SwebenchConfig
from lumotree.tasks.swebench.dataset import load_swebench


def _rows(shared_data: Path) -> list[dict]:
    path = shared_data / "swebench" / "astropy.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_agree(shared_data: Path) -> None:
    jl = load_swebench(SwebenchConfig(dataset=str(shared_data / "swebench" / "astropy.jsonl")))
    pq = load_swebench(SwebenchConfig(dataset=str(shared_data / "swebench" / "astropy.parquet")))
    assert len(jl) == 16
    assert [i.instance_id for i in jl] == [i.instance_id for i in pq]
    raw = {r["instance_id"]: r for r in _rows(shared_data)}
    for inst in jl:
        assert inst.FAIL_TO_PASS == json.loads(raw[inst.instance_id]["FAIL_TO_PASS"])
        assert inst.PASS_TO_PASS == json.loads(raw[inst.instance_id]["PASS_TO_PASS"])
        assert inst.patch == raw[inst.instance_id]["patch"]


def test_suite_is_registered_with_default_dataset(shared_data: Path) -> None:
    suite = get_suite("swebench-astropy")
    assert suite.name == "swebench-astropy"
    assert len(suite.instances()) == 16
    assert len(suite.instances(limit=2)) == 2


def test_older_rows_without_v5_fields(shared_data: Path, tmp_path: Path) -> None:
    rows = _rows(shared_data)
    old = [
        {k: v for k, v in r.items() if k not in ("eval_script", "image", "log_parser", "eval_type")}
        for r in rows
    ]
    insts = load_swebench(SwebenchConfig(dataset=str(_write(tmp_path / "old.jsonl", old))))
    assert len(insts) == 16 and all(i.eval_script is None and i.image is None for i in insts)
    new = {
        i.instance_id: i
        for i in load_swebench(SwebenchConfig(dataset=str(_write(tmp_path / "new.jsonl", rows))))
    }
    for inst in insts:
        # Without an eval script the command follows SWE-bench's specs; it runs the same test files.
        assert specs.test_command(inst).split()[-1] == specs.test_command(new[inst.instance_id]).split()[-1]
        assert specs.test_command(inst).startswith("pytest -rA")


def test_command_comes_from_the_eval_script(shared_data: Path) -> None:
    inst = load_swebench(SwebenchConfig(dataset=str(shared_data / "swebench" / "astropy.jsonl")))[0]
    lines = inst.eval_script.splitlines()
    i = next(n for n, line in enumerate(lines) if "Start Test Output" in line)
    assert specs.test_command(inst) == lines[i + 1].strip()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("created_at", "", "missing created_at"),
        ("created_at", "last tuesday", "not an ISO date"),
        ("FAIL_TO_PASS", "[not json", "FAIL_TO_PASS"),
        ("patch", "just words", "not a unified diff"),
        ("test_patch", "", "test_patch"),
        ("base_commit", "", "base_commit"),
    ],
)
def test_malformed_rows_name_row_and_instance(
    shared_data: Path, tmp_path: Path, field: str, value: str, message: str
) -> None:
    rows = _rows(shared_data)[:3]
    rows[1][field] = value
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InstanceError) as exc:
        load_swebench(SwebenchConfig(dataset=str(path)))
    text = str(exc.value)
    assert "row 2" in text and rows[1]["instance_id"] in text and message in text


def test_not_json_row(shared_data: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_rows(shared_data)[0]) + "\n{oops\n")
    with pytest.raises(InstanceError, match="row 2"):
        load_swebench(SwebenchConfig(dataset=str(path)))


def test_names_need_the_hub_switch() -> None:
    with pytest.raises(InstanceError, match="loading datasets by name is off"):
        load_swebench(SwebenchConfig(dataset="SWE-bench/SWE-bench_Verified", hub=False))
    with pytest.raises(InstanceError, match="no such file"):
        load_swebench(SwebenchConfig(dataset="missing/file.jsonl"))


def test_other_repositories_are_left_out(shared_data: Path, tmp_path: Path) -> None:
    rows = _rows(shared_data)[:2]
    rows[0] = dict(rows[0], repo="django/django", instance_id="django__django-1")
    insts = load_swebench(SwebenchConfig(dataset=str(_write(tmp_path / "mixed.jsonl", rows))))
    assert [i.instance_id for i in insts] == [rows[1]["instance_id"]]
