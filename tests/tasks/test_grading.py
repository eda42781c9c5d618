"""Grading follows SWE-bench's rules via swebench's own parser and grader; bad patches are graded failures."""

from __future__ import annotations

import pytest

from lumotree.tasks.api import Instance, grade
from lumotree.tasks.grading import evaluate, parse_log, strip_ansi

GOLD = """diff --git a/mini.py b/mini.py
--- a/mini.py
+++ b/mini.py
@@ -1,5 +1,5 @@
 def clip(x, lo, hi):
-    if x < lo:
+    if x > lo:
         return lo
     if x > hi:
         return hi
"""
# The image holds the correct code; the "instance" treats the buggy state (x > lo) as the fix target, so we
# build the instance the other way: base = correct code with a bug patch applied by the test below.


def instance(**over: object) -> Instance:
    row = {
        "instance_id": "mini__mini-1",
        "repo": "astropy/astropy",
        "base_commit": "HEAD",
        "patch": GOLD,
        "problem_statement": "clip is wrong",
        "FAIL_TO_PASS": ["test_mini.py::test_inside", "test_mini.py::test_high"],
        "PASS_TO_PASS": ["test_mini.py::test_low"],
    }
    row.update(over)
    return Instance.model_validate(row)


def test_parse_and_evaluate_match_swebench() -> None:
    log = "\x1b[32mPASSED\x1b[0m test_mini.py::test_inside\nFAILED test_mini.py::test_high - assert 3 == 10\n"
    log += "PASSED test_mini.py::test_low\n"
    sm = parse_log(instance(), log)
    assert sm == {
        "test_mini.py::test_inside": "PASSED",
        "test_mini.py::test_high": "FAILED",
        "test_mini.py::test_low": "PASSED",
    }
    status, report = evaluate(instance(), sm)
    assert status == "RESOLVED_PARTIAL"
    assert report["FAIL_TO_PASS"] == {
        "success": ["test_mini.py::test_inside"],
        "failure": ["test_mini.py::test_high"],
    }
    sm["test_mini.py::test_high"] = "PASSED"
    assert evaluate(instance(), sm)[0] == "RESOLVED_FULL"
    sm["test_mini.py::test_low"] = "FAILED"
    assert evaluate(instance(), sm)[0] == "RESOLVED_NO"
    assert strip_ansi("\x1b[1m\x1b[31mFAILED\x1b[0m x") == "FAILED x"


@pytest.mark.docker
def test_grade_in_docker(mini_image: str) -> None:
    # In the mini image the code is correct, so the "bug" we grade against is: test_low must keep passing and
    # the F2P tests must pass. The empty patch resolves; the gold patch above breaks clip and must not.
    inst = instance(FAIL_TO_PASS=["test_mini.py::test_inside", "test_mini.py::test_high"])
    ok = grade(inst, "", mini_image)
    assert ok.resolved and ok.patch_applied and ok.status == "RESOLVED_FULL", ok.reason + ok.log[-2000:]
    broken = grade(inst, GOLD, mini_image)
    assert not broken.resolved and broken.patch_applied
    assert "FAIL_TO_PASS" in broken.reason or "PASS_TO_PASS" in broken.reason
    assert "test_mini.py::test_low" in broken.pass_to_pass["failure"]
    # Bad patches are graded failures with a reason, never exceptions.
    garbage = grade(inst, "this is not a patch\n", mini_image)
    assert not garbage.resolved and not garbage.patch_applied and "does not apply" in garbage.reason
    # Differing context is fuzzed in (as SWE-bench's harness does); a removed line that is not there is not.
    fuzzed = grade(inst, GOLD.replace(" def clip(x, lo, hi):", " def clamp(x, lo, hi):"), mini_image)
    assert fuzzed.patch_applied and not fuzzed.resolved
    wrong = grade(inst, GOLD.replace("-    if x < lo:", "-    if x < low:"), mini_image)
    assert not wrong.patch_applied and "does not apply" in wrong.reason, wrong.reason
    reversed_patch = GOLD.replace("-    if x < lo:\n+    if x > lo:", "-    if x > lo:\n+    if x < lo:")
    rev = grade(inst, reversed_patch, mini_image)
    assert not rev.patch_applied and "already applied" in rev.reason, rev.reason
    # Editing the tests to make them pass does not count: tests are reset to the base state.
    cheat = GOLD + (
        "diff --git a/test_mini.py b/test_mini.py\n--- a/test_mini.py\n+++ b/test_mini.py\n"
        "@@ -8,4 +8,4 @@ def test_inside():\n \n def test_low():\n-    assert clip(-3, 0, 10) == 0\n"
        "+    assert True\n \n"
    )
    cheated = grade(inst, cheat, mini_image)
    assert cheated.patch_applied and not cheated.resolved, cheated.reason
    # A test run that produces no results (command fails) is graded with the reason.
    none = grade(inst, "", mini_image, test_command="false")
    assert not none.resolved and "no test results" in none.reason
