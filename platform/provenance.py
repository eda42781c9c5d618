"""Where a number came from: the commit, the command line, the machine (no host names) and the versions.

Benchmarks, audits, sweeps and replays all stamp their reports through here, so every recorded number can
be traced to the code and the command that produced it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
"""The checkout the package runs from."""


def git_commit(paths: Sequence[str] = ()) -> str | None:
    """HEAD of the checkout, with "+dirty" when tracked files (under ``paths`` when given) differ from it.

    A copy without git metadata may carry the commit in a ``.commit`` file at its root; None when neither
    exists. ``LUMOTREE_COMMIT`` overrides both: scripts that run a copied tree whose git metadata may lag
    behind its files set it."""
    pinned = os.environ.get("LUMOTREE_COMMIT", "").strip()
    if pinned:
        return pinned[:12]
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", *paths],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        marker = ROOT / ".commit"
        return marker.read_text().strip()[:12] or None if marker.is_file() else None
    return head + ("+dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or the stdlib's guess elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform as stdlib_platform

    return stdlib_platform.processor() or "unknown"


def command_line() -> str:
    """The command as typed, program name shortened to ``lumotree`` when run through the CLI."""
    prog = Path(sys.argv[0]).name
    args = sys.argv[1:]
    return " ".join(["lumotree" if prog in ("lumotree", "cli.py", "__main__.py") else prog, *args])


def provenance(device: str, started: float) -> dict[str, Any]:
    """Machine, device, commit, command, versions and elapsed seconds of a run."""
    import torch

    meta: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "device": device,
        "torch": torch.__version__,
        "commit": git_commit(),
        "command": command_line(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    meta["seconds"] = round(time.time() - started, 1)
    return meta
