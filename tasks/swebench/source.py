"""Static checks of a release against an instance: which way the patches go, and whether the tests exist.

A candidate release holds the instance's base state when the gold and test patches each apply to it either
forward (the release predates the change) or in reverse (the release already contains it). The base state is
then the release with the reverse-applying patches taken out. These checks need no build: they only touch the
files the patches and test ids name, so a release that cannot be right is rejected in a second, not a minute.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lumotree.tasks.api import Instance

FORWARD = "forward"  # the release lacks the change: the patch applies as is
REVERSE = "reverse"  # the release contains the change: the patch applies with -R


@dataclass(frozen=True)
class Directions:
    """How an instance's patches relate to one release."""

    gold: str  # FORWARD or REVERSE
    test: str  # FORWARD or REVERSE; "" when the instance has no test patch

    def __post_init__(self) -> None:
        assert self.gold in (FORWARD, REVERSE) and self.test in (FORWARD, REVERSE, "")

    def label(self) -> str:
        """``F`` when the release has the bug (the gold patch goes forward), ``R`` when it has the fix."""
        return "F" if self.gold == FORWARD else "R"

    def reversed_patches(self, instance: Instance) -> list[str]:
        """The patches to reverse-apply to the release to reach the base state, last-applied first."""
        out = []
        if self.test == REVERSE:
            out.append(instance.test_patch)
        if self.gold == REVERSE:
            out.append(instance.patch)
        return out


def patch_files(patch: str) -> list[str]:
    """Every path a unified diff reads or writes (``a/`` and ``b/`` sides, /dev/null dropped)."""
    paths = re.findall(r"^(?:---|\+\+\+) [ab]/(\S+)", patch, re.M)
    paths += [p for pair in re.findall(r"^diff --git a/(\S+) b/(\S+)", patch, re.M) for p in pair]
    return list(dict.fromkeys(paths))


def split_test_id(test_id: str) -> tuple[str, str] | None:
    """(file, function) of a pytest id such as ``a/b/test_x.py::TestC::test_y[p1]``; None for other shapes."""
    if "::" not in test_id:
        return None
    path, _, rest = test_id.partition("::")
    func = rest.split("::")[-1].split("[", 1)[0].strip()
    return (path, func) if func else None


def apply_patch(workdir: Path, patch: str, *, reverse: bool = False, check: bool = False) -> bool:
    """Apply ``patch`` in ``workdir`` the way SWE-bench's harness does: ``git apply``, else ``patch --fuzz``.

    ``patch`` runs with ``-N`` going forward so an already-applied patch is refused rather than re-applied
    (its dry run would otherwise claim success), and never leaves ``.orig``/``.rej`` files behind.
    """
    if not patch.strip():
        return True
    cmd = [
        "git",
        "apply",
        "--whitespace=nowarn",
        *(["-R"] if reverse else []),
        *(["--check"] if check else []),
    ]
    if subprocess.run(cmd, cwd=workdir, input=patch, capture_output=True, text=True).returncode == 0:
        return True
    cmd = [
        "patch",
        "-p1",
        "--batch",
        "--fuzz=3",
        "--no-backup-if-mismatch",
        "-r",
        "-",
        "-R" if reverse else "-N",
    ]
    cmd += ["--dry-run"] if check else []
    return subprocess.run(cmd, cwd=workdir, input=patch, capture_output=True, text=True).returncode == 0


def _direction(workdir: Path, patch: str) -> str | None:
    # Forward first: a patch that applies both ways (rare) most likely means the release predates it.
    if apply_patch(workdir, patch, check=True):
        return FORWARD
    if apply_patch(workdir, patch, reverse=True, check=True):
        return REVERSE
    return None


def check_release(instance: Instance, src: Path) -> tuple[Directions | None, str]:
    """Directions of the instance's patches against the source tree ``src``, or None and the reason."""
    files = set(patch_files(instance.patch)) | set(patch_files(instance.test_patch))
    files |= {t[0] for t in map(split_test_id, [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]) if t}
    with tempfile.TemporaryDirectory(prefix="lumotree-swe-check-") as tmp:
        work = Path(tmp)
        for rel in files:
            if (src / rel).is_file():
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, work / rel)
        gold = _direction(work, instance.patch)
        if gold is None:
            return None, "the gold patch applies neither forward nor in reverse"
        test = _direction(work, instance.test_patch) if instance.test_patch.strip() else ""
        if test is None:
            return None, "the test patch applies neither forward nor in reverse"
        directions = Directions(gold, test)
        # Reach the fixed state (base + gold + test) to look for every test the instance names.
        for patch in directions.reversed_patches(instance):
            assert apply_patch(work, patch, reverse=True), "a patch that checked clean must apply"
        for patch in (instance.patch, instance.test_patch):
            if not apply_patch(work, patch):
                return None, "the patches do not apply in sequence on the reconstructed base state"
        missing = [
            t for t in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS] if not _test_defined(work, t, src)
        ]
        if missing:
            return None, f"{len(missing)} named test(s) not defined in this release, e.g. {missing[0]}"
    return directions, ""


def _test_defined(root: Path, test_id: str, tree: Path) -> bool:
    parsed = split_test_id(test_id)
    if parsed is None:
        return True  # not a pytest id: nothing to check statically
    path, func = parsed
    if not (root / path).is_file():
        return False
    pattern = re.compile(rf"^\s*(?:async\s+)?def {re.escape(func)}\b", re.M)
    if pattern.search((root / path).read_text(errors="replace")):
        return True
    # Inherited tests (a class whose base lives in another module): look through the release's test code.
    top = tree / path.split("/", 1)[0]
    return any(pattern.search(f.read_text(errors="replace")) for f in top.rglob("test*.py"))
