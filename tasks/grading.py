"""Grading shared by every suite: apply a patch, run the tests, and let SWE-bench's own code decide.

The log is parsed with ``swebench.harness.log_parsers`` (the instance's ``log_parser``, astropy's by
default) and graded with ``swebench.harness.grading``: resolved only when every FAIL_TO_PASS test passes
and every PASS_TO_PASS test still passes. Anything that goes wrong on the way (a patch that does not apply,
a timeout, a crash of the test run) is a graded failure with its reason, never an exception.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from lumotree.tasks.api import GradeResult, Instance, Sandbox, open_sandbox
from lumotree.tasks.sandbox import OutputBuffer, SandboxConfig

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PATCH_FILE = "/tmp/lumotree-{name}.patch"
LOG_LIMIT = 32 << 20  # bytes of test output read back for parsing (the -rA summary is at the end)
STORED_LOG = 256 << 10  # bytes of test log kept in the GradeResult
DEFAULT_TEST_COMMAND = "pytest -rA --tb=short -p no:cacheprovider"


@dataclass(frozen=True)
class ApplyResult:
    """The outcome of applying one patch in a sandbox."""

    ok: bool
    method: str  # "git apply", "patch", "empty" (nothing to apply) or "" when it failed
    reason: str  # why it failed; "" when ok


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def apply_patch(sb: Sandbox, patch: str, *, name: str = "model", reverse: bool = False) -> ApplyResult:
    """Apply ``patch`` in /testbed (``reverse``: un-apply it): ``git apply``, then ``patch`` with fuzz.

    Direction is checked: a patch that only applies the other way (already applied, or reversed) fails
    with that reason instead of being applied backwards by ``patch``'s guesswork.
    """
    if not patch.strip():
        return ApplyResult(True, "empty", "")
    if not patch.endswith("\n"):
        patch += "\n"  # a diff cut at its last line is still a diff
    path = PATCH_FILE.format(name=name)
    try:
        sb.write_file(path, patch)
    except OSError as exc:
        return ApplyResult(False, "", f"could not write the {name} patch: {exc}")
    r = "-R " if reverse else ""
    other = "" if reverse else "-R "
    p = shlex.quote(path)
    res = sb.exec(f"git apply {r}--check {p} 2>&1 && git apply {r}{p}", 120)
    if res.exit_code == 0:
        return ApplyResult(True, "git apply", "")
    git_error = res.output.strip()
    # -N: never take an already-applied hunk for a reversed one; --dry-run first: no half-applied patch stays.
    fuzz = f"patch --batch --fuzz=5 -p1 -N {r}--no-backup-if-mismatch -i {p}"
    res = sb.exec(f"{fuzz} --dry-run >/dev/null 2>&1 && {fuzz}", 120)
    if res.exit_code == 0:
        return ApplyResult(True, "patch", "")
    if sb.exec(f"git apply {other}--check {p}", 120).exit_code == 0:
        direction = "un-applied" if reverse else "applied"
        return ApplyResult(False, "", f"the {name} patch is already {direction} (it only applies in reverse)")
    return ApplyResult(False, "", f"the {name} patch does not apply: {_first_lines(git_error or res.output)}")


def _first_lines(text: str, n: int = 6) -> str:
    return " | ".join(line for line in text.strip().splitlines()[:n])


def default_test_command(instance: Instance) -> str:
    return f"{DEFAULT_TEST_COMMAND} " + " ".join(shlex.quote(f) for f in instance.test_files())


def parse_log(instance: Instance, log: str) -> dict[str, str]:
    """Test id -> status with SWE-bench's parser for the instance (astropy's when it names none)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parser = PARSER_REGISTRY[instance.log_parser or "parse_log_astropy"]
    return parser(strip_ansi(log), None)


def evaluate(instance: Instance, status_map: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """SWE-bench's resolution status and its F2P/P2P report for a parsed status map."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    gold = {FAIL_TO_PASS: instance.FAIL_TO_PASS, PASS_TO_PASS: instance.PASS_TO_PASS}
    report = get_eval_tests_report(status_map, gold)
    return get_resolution_status(report), report


def grade_in_sandbox(
    sb: Sandbox,
    instance: Instance,
    model_patch: str,
    *,
    test_command: str | None = None,
    timeout: float = 1800,
) -> GradeResult:
    """Grade ``model_patch`` in an open sandbox whose /testbed is at the instance's base state."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus

    t0 = time.monotonic()
    iid = instance.instance_id

    def failed(reason: str, *, applied: bool = True, log: str = "", code: int | None = None) -> GradeResult:
        return GradeResult(
            iid,
            False,
            patch_applied=applied,
            reason=reason,
            status=ResolvedStatus.NO.value,
            log=log,
            test_exit_code=code,
            seconds=time.monotonic() - t0,
        )

    try:
        applied = apply_patch(sb, model_patch, name="model")
        if not applied.ok:
            return failed(applied.reason, applied=False)
        # The model may have edited the tests: they go back to the base state before the test patch.
        tests = [shlex.quote(f) for f in instance.test_files()]
        if tests:
            sb.exec(
                f'for f in {" ".join(tests)}; do git checkout -q HEAD -- "$f" 2>/dev/null || true; done', 120
            )
        if instance.test_patch.strip():
            tp = apply_patch(sb, instance.test_patch, name="test")
            if not tp.ok:
                return failed(f"environment: {tp.reason}")
        cmd = test_command or default_test_command(instance)
        res = sb.exec(cmd, timeout, max_output=LOG_LIMIT)
        log = strip_ansi(res.output)
        stored = _bounded(log)
        if res.timed_out:
            return failed(f"tests timed out after {timeout:g} s", log=stored, code=res.exit_code)
        status_map = parse_log(instance, log)
        if not status_map:
            return failed(
                f"no test results in the log (exit code {res.exit_code})", log=stored, code=res.exit_code
            )
        status, report = evaluate(instance, status_map)
    except Exception as exc:  # noqa: BLE001 - grading must report, never crash the sweep
        return failed(f"grading error: {type(exc).__name__}: {exc}")
    f2p, p2p = report[FAIL_TO_PASS], report[PASS_TO_PASS]
    resolved = status == ResolvedStatus.FULL.value
    reason = ""
    if not resolved:
        parts = []
        if f2p["failure"]:
            parts.append(f"{len(f2p['failure'])}/{len(instance.FAIL_TO_PASS)} FAIL_TO_PASS tests fail")
        if p2p["failure"]:
            parts.append(f"{len(p2p['failure'])}/{len(instance.PASS_TO_PASS)} PASS_TO_PASS tests fail")
        reason = "; ".join(parts) or status
    return GradeResult(
        iid,
        resolved,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        patch_applied=True,
        reason=reason,
        status=status,
        log=stored,
        test_exit_code=res.exit_code,
        seconds=time.monotonic() - t0,
    )


def _bounded(log: str) -> str:
    buf = OutputBuffer(STORED_LOG)
    buf.add(log.encode())
    return buf.text()


def grade(
    instance: Instance,
    model_patch: str,
    image: str,
    *,
    test_command: str | None = None,
    config: SandboxConfig | None = None,
) -> GradeResult:
    """See :func:`lumotree.tasks.api.grade`."""
    t0 = time.monotonic()
    try:
        sb = open_sandbox(image, config)
    except Exception as exc:  # noqa: BLE001 - no container, no grade; the reason says why
        from swebench.harness.constants import ResolvedStatus

        return GradeResult(
            instance.instance_id,
            False,
            reason=f"environment: sandbox did not start: {exc}",
            status=ResolvedStatus.NO.value,
            seconds=time.monotonic() - t0,
        )
    with sb:
        return grade_in_sandbox(sb, instance, model_patch, test_command=test_command)
