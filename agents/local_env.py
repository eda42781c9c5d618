"""A local-process environment: each command in a fresh ``bash -c`` inside a directory (no isolation).

For tests and trusted scripted runs only; real agent runs use the Docker sandboxes of ``lumotree.tasks``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LocalExecResult:
    """Same fields as ``lumotree.tasks.api.ExecResult``."""

    exit_code: int
    output: str
    truncated: bool
    timed_out: bool
    seconds: float


class LocalEnvironment:
    """Runs commands in ``cwd``; output beyond ``max_output`` characters keeps its head and tail."""

    def __init__(self, cwd: str | Path, max_output: int = 100_000, env: dict[str, str] | None = None) -> None:
        self.cwd = Path(cwd)
        assert self.cwd.is_dir(), f"no such directory: {self.cwd}"
        self.max_output = max_output
        self.env = {**os.environ, "PAGER": "cat", "GIT_PAGER": "cat", **(env or {})}

    def exec(self, cmd: str, timeout: float) -> LocalExecResult:
        start = time.monotonic()
        # A new session so that a timeout kills the whole process group, not only bash.
        proc = subprocess.Popen(
            ["bash", "-c", cmd],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        timed_out = False
        try:
            raw, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
        text = raw.decode("utf-8", errors="replace")
        truncated = len(text) > self.max_output
        if truncated:
            half = self.max_output // 2
            text = text[:half] + "\n[... output truncated ...]\n" + text[-half:]
        code = -9 if timed_out else proc.returncode
        return LocalExecResult(code, text, truncated, timed_out, time.monotonic() - start)

    def diff(self) -> str:
        # Untracked files count as changes too: add them with intent-to-add so git diff shows them.
        subprocess.run(["git", "add", "-A", "-N"], cwd=self.cwd, capture_output=True, check=False)
        out = subprocess.run(["git", "diff", "--no-color"], cwd=self.cwd, capture_output=True, check=True)
        return out.stdout.decode("utf-8", errors="replace")

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
