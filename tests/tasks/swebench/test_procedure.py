"""The release-finding procedure's pure parts: candidate order, patch directions, test presence."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from lumotree.tasks.api import Instance
from lumotree.tasks.swebench.releases import Release, candidate_releases, major_minor
from lumotree.tasks.swebench.resolve import _series_interleave
from lumotree.tasks.swebench.source import FORWARD, check_release, patch_files, split_test_id

T0 = datetime(2022, 6, 1, tzinfo=timezone.utc)


def _rel(version: str, days: int) -> Release:
    return Release(version, T0 + timedelta(days=days), f"pkg-{version}.tar.gz")


def test_candidates_nearest_first_and_not_older_than_the_version() -> None:
    releases = [_rel("4.3", -300), _rel("5.0", -200), _rel("5.0.1", -20), _rel("5.1", 10), _rel("5.2", 400)]
    got = [r.version for r in candidate_releases(releases, "5.0", T0.isoformat(), window_days=365)]
    assert got == ["5.1", "5.0.1", "5.0"]  # 4.3 is older than the version, 5.2 outside the window


def test_series_interleave_tries_each_series_before_a_second_of_one() -> None:
    order = [_rel(v, 0) for v in ("2.0.3", "2.0.4", "3.0", "2.0.5", "3.0.1", "3.1")]
    assert [r.version for r in _series_interleave(order)] == [
        "2.0.3",
        "3.0",
        "3.1",
        "2.0.4",
        "3.0.1",
        "2.0.5",
    ]
    assert major_minor("v5.3") == (5, 3) and major_minor("4.0.1.post1") == (4, 0)


BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
OLD_TESTS = "from pkg.mod import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
NEW_TESTS = OLD_TESTS + "\n\ndef test_add():\n    assert add(1, 2) == 3\n"


def _diff(path: str, old: str, new: str) -> str:
    import difflib

    body = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


def _instance(**extra: object) -> Instance:
    row = dict(
        instance_id="o__p-1",
        repo="o/p",
        base_commit="abc",
        problem_statement="add subtracts",
        patch=_diff("pkg/mod.py", BUGGY, FIXED),
        test_patch=_diff("pkg/tests/test_mod.py", OLD_TESTS, NEW_TESTS),
        FAIL_TO_PASS=["pkg/tests/test_mod.py::test_add"],
        PASS_TO_PASS=["pkg/tests/test_mod.py::test_zero"],
        version="1.0",
        created_at=T0.isoformat(),
    )
    row.update(extra)
    return Instance.model_validate(row)


def _tree(root: Path, mod: str, tests: str) -> Path:
    (root / "pkg" / "tests").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(mod)
    (root / "pkg" / "tests" / "test_mod.py").write_text(tests)
    return root


def test_release_with_the_bug_goes_forward(tmp_path: Path) -> None:
    directions, why = check_release(_instance(), _tree(tmp_path, BUGGY, OLD_TESTS))
    assert why == "" and directions is not None
    assert (directions.gold, directions.test, directions.label()) == (FORWARD, FORWARD, "F")
    assert directions.reversed_patches(_instance()) == []


def test_release_with_the_fix_goes_in_reverse(tmp_path: Path) -> None:
    inst = _instance()
    directions, why = check_release(inst, _tree(tmp_path, FIXED, NEW_TESTS))
    assert why == "" and directions is not None and directions.label() == "R"
    assert directions.reversed_patches(inst) == [inst.test_patch, inst.patch]


def test_unrelated_release_is_rejected(tmp_path: Path) -> None:
    other = "def add(a, b, c=0):\n    return a * b\n"
    directions, why = check_release(_instance(), _tree(tmp_path, other, OLD_TESTS))
    assert directions is None and "gold patch applies neither" in why


def test_release_without_a_named_test_is_rejected(tmp_path: Path) -> None:
    inst = _instance(
        PASS_TO_PASS=["pkg/tests/test_mod.py::test_zero", "pkg/tests/test_mod.py::TestX::test_gone[1]"]
    )
    directions, why = check_release(inst, _tree(tmp_path, BUGGY, OLD_TESTS))
    assert directions is None and "TestX::test_gone" in why


def test_patch_files_and_test_names() -> None:
    assert patch_files(_instance().patch) == ["pkg/mod.py"]
    assert split_test_id("a/test_b.py::TestC::test_d[x-1]") == ("a/test_b.py", "test_d")
    assert split_test_id("not a pytest id") is None


def test_python_requirement_of_a_release() -> None:
    from lumotree.tasks.swebench.releases import supports_python

    assert supports_python(Release("6.0.0", T0, "p.tar.gz", requires_python=">=3.9"), "3.9")
    assert not supports_python(Release("6.1.0", T0, "p.tar.gz", requires_python=">=3.10"), "3.9")
    assert supports_python(Release("1.0", T0, "p.tar.gz"), "3.9")
