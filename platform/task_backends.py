"""Where the orchestrator gets tasks, sandboxes and verdicts: a ``lumotree.tasks`` suite in Docker, or the
process-local ``local-toy`` suite (no isolation: for tests of the orchestration with scripted models only)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lumotree.agents.local_env import LocalEnvironment
from lumotree.agents.protocols import Environment
from lumotree.tasks.api import Instance


@dataclass
class Verdict:
    """The grader's decision on one patch."""

    resolved: bool
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)


class TaskBackend(Protocol):
    suite: str

    def instances(self, limit: int | None) -> list[Instance]: ...

    def prepare(self, instance: Instance) -> None:
        """Make the instance runnable (build its image); called before any attempt of it starts."""
        ...

    def sandbox(self, instance: Instance) -> AbstractContextManager[Environment]: ...

    def grade(self, instance: Instance, patch: str) -> Verdict: ...


class DockerSuiteBackend:
    """A suite of ``lumotree.tasks``: one Docker sandbox per attempt, SWE-bench grading in a fresh one."""

    def __init__(self, suite: str, **options: Any) -> None:
        from lumotree.tasks.api import get_suite

        self.suite = suite
        self._suite = get_suite(suite, **options)
        self._images: dict[str, str] = {}

    def instances(self, limit: int | None) -> list[Instance]:
        return self._suite.instances(limit=limit)

    def prepare(self, instance: Instance) -> None:
        self._images[instance.instance_id] = self._suite.image_for(instance, build=True)

    def _image(self, instance: Instance) -> str:
        if instance.instance_id not in self._images:
            self.prepare(instance)
        return self._images[instance.instance_id]

    def sandbox(self, instance: Instance) -> AbstractContextManager[Environment]:
        from lumotree.tasks.api import open_sandbox

        return open_sandbox(self._image(instance))  # type: ignore[return-value]

    def grade(self, instance: Instance, patch: str) -> Verdict:
        from lumotree.tasks.api import grade

        test_command = getattr(self._suite, "test_command", None)
        result = grade(
            instance,
            patch,
            self._image(instance),
            test_command=test_command(instance) if test_command else None,
        )
        detail = {
            "reason": result.reason,
            "status": result.status,
            "fail_to_pass": result.fail_to_pass,
            "pass_to_pass": result.pass_to_pass,
            "patch_applied": result.patch_applied,
            "log_tail": result.log[-2000:],
        }
        return Verdict(result.resolved, result.seconds, detail)


# ---- local-toy: a tiny process-local suite ---------------------------------------------------------------

_TOY_SOURCE = "def add(a, b):\n    return a - b + {k}\n"
_TOY_FIXED = "def add(a, b):\n    return a + b + {k}\n"
_TOY_TEST = "from calc import add\n\nassert add(2, 3) == 5 + {k}, add(2, 3)\nprint('passed')\n"


def _toy_instance(k: int) -> Instance:
    fix = (
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
        f"-    return a - b + {k}\n+    return a + b + {k}\n"
    )
    return Instance(
        instance_id=f"toy__calc-{k}",
        repo="toy/calc",
        base_commit="base",
        patch=fix,
        problem_statement=f"add(2, 3) should be {5 + k} (a + b + {k}) but calc.add subtracts b.",
        FAIL_TO_PASS=["test_calc.py"],
    )


class LocalToyBackend:
    """``local-toy``: a one-file Python bug per task in a temporary git repository, graded by its test script.

    Commands run on the host without isolation; use it only with scripted models (tests of the orchestration).
    """

    suite = "local-toy"

    def __init__(self, size: int = 8, root: str | Path | None = None) -> None:
        self.size = size
        self.root = Path(root or tempfile.mkdtemp(prefix="lumotree-toy-"))
        self.root.mkdir(parents=True, exist_ok=True)

    def instances(self, limit: int | None) -> list[Instance]:
        return [_toy_instance(k) for k in range(min(self.size, limit or self.size))]

    def prepare(self, instance: Instance) -> None:
        pass

    def _checkout(self, instance: Instance) -> Path:
        k = int(instance.instance_id.rsplit("-", 1)[1])
        repo = Path(tempfile.mkdtemp(prefix=f"{instance.instance_id}-", dir=self.root))
        (repo / "calc.py").write_text(_TOY_SOURCE.format(k=k))
        (repo / "test_calc.py").write_text(_TOY_TEST.format(k=k))
        ident = ["-c", "user.email=toy@lumotree", "-c", "user.name=toy"]
        for args in (["init", "-q"], [*ident, "add", "."], [*ident, "commit", "-qm", "base"]):
            subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
        return repo

    def sandbox(self, instance: Instance) -> AbstractContextManager[Environment]:
        return _TempRepo(self._checkout(instance))

    def grade(self, instance: Instance, patch: str) -> Verdict:
        start = time.monotonic()
        repo = self._checkout(instance)
        try:
            applied = (
                not patch
                or subprocess.run(
                    ["git", "apply", "-"], input=patch.encode(), cwd=repo, capture_output=True
                ).returncode
                == 0
            )
            ok = (
                applied
                and subprocess.run(["python3", "test_calc.py"], cwd=repo, capture_output=True).returncode == 0
            )
            return Verdict(ok, time.monotonic() - start, {"patch_applied": applied})
        finally:
            shutil.rmtree(repo, ignore_errors=True)


class _TempRepo(LocalEnvironment):
    def close(self) -> None:
        shutil.rmtree(self.cwd, ignore_errors=True)


def make_backend(suite: str, **options: Any) -> TaskBackend:
    if suite == LocalToyBackend.suite:
        return LocalToyBackend(**{k: v for k, v in options.items() if k in ("size", "root")})
    return DockerSuiteBackend(suite, **options)
