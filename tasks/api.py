"""The tasks layer's public interface: instances, suites, sandboxes and grading.

Everything another component needs from ``lumotree.tasks`` is named here; the implementations live in
sibling modules and are imported lazily so this module stays cheap (no docker, no libcst at import).

Conventions every task image follows (SWE-bench's layout): the repository is a git repo at ``/testbed``
(the image's working directory) and its Python environment is ``/opt/venv``, already first on ``PATH`` in
the image, so every command of every task runs the same way (``source /opt/venv/bin/activate`` also works).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

if TYPE_CHECKING:
    from lumotree.tasks.sandbox import SandboxConfig

TESTBED = "/testbed"
VENV = "/opt/venv"


# --- instances


class InstanceError(ValueError):
    """A malformed instance row; the message names the file, the row and the instance id when known."""


def _json_list(value: Any) -> Any:
    # SWE-bench ships FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings in its HF datasets.
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list of test ids: {value[:80]!r}") from exc
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    return value


class Instance(BaseModel):
    """One task in the SWE-bench schema (v5 fields optional so older rows load too)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    instance_id: str
    repo: str
    base_commit: str
    patch: str  # the gold fix as a unified diff against the base state
    test_patch: str = ""  # tests added by the fix; empty for synthesized tasks
    problem_statement: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = []
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    created_at: str = ""
    eval_script: str | None = None
    log_parser: str | None = None
    image: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_lists(cls, value: Any) -> Any:
        return _json_list(value)

    @field_validator("instance_id", "repo", "problem_statement")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _some_f2p(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must list at least one test (a task without a failing test cannot be graded)")
        return value

    @field_validator("patch")
    @classmethod
    def _is_diff(cls, value: str) -> str:
        if value and not re.search(r"^(diff --git |--- )", value, re.M):
            raise ValueError("is not a unified diff")
        return value

    def test_files(self) -> list[str]:
        """Test files named by the test ids and by the test patch, in first-seen order."""
        files = [t.split("::", 1)[0] for t in [*self.FAIL_TO_PASS, *self.PASS_TO_PASS] if "::" in t]
        files += re.findall(r"^\+\+\+ b/(\S+)", self.test_patch, re.M)
        return list(dict.fromkeys(f for f in files if f != "/dev/null"))

    def to_row(self) -> dict[str, Any]:
        """The row as written to JSONL (test lists stay real lists)."""
        return self.model_dump()


def parse_instance(row: Any, where: str) -> Instance:
    """Validate one row; ``where`` (e.g. ``"data.jsonl row 3"``) prefixes every error."""
    if not isinstance(row, dict):
        raise InstanceError(f"{where}: expected an object, got {type(row).__name__}")
    label = f"{where} (instance_id={row['instance_id']!r})" if "instance_id" in row else where
    try:
        return Instance.model_validate(row)
    except ValidationError as exc:
        problems = "; ".join(
            f"field {'.'.join(str(p) for p in err['loc']) or '<row>'}: {err['msg']}" for err in exc.errors()
        )
        raise InstanceError(f"{label}: {problems}") from None


def load_instances(path: str | Path) -> list[Instance]:
    """Read instances from a ``.jsonl``, ``.json`` (list) or ``.parquet`` file; rows are numbered from 1."""
    path = Path(path)
    if not path.is_file():
        raise InstanceError(f"{path}: no such file")
    rows: Iterable[tuple[int, Any]]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = enumerate(pq.read_table(path).to_pylist(), 1)
    elif path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise InstanceError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(data, list):
            raise InstanceError(f"{path}: expected a JSON list of instances")
        rows = enumerate(data, 1)
    else:
        rows = _jsonl_rows(path)
    instances = [parse_instance(row, f"{path.name} row {n}") for n, row in rows]
    seen: dict[str, int] = {}
    for n, inst in enumerate(instances, 1):
        if inst.instance_id in seen:
            raise InstanceError(
                f"{path.name} row {n} (instance_id={inst.instance_id!r}): "
                f"duplicate of row {seen[inst.instance_id]}"
            )
        seen[inst.instance_id] = n
    return instances


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InstanceError(
                f"{path.name} row {n}: not valid JSON: {exc.msg} (column {exc.colno})"
            ) from None


def write_instances(instances: Iterable[Instance], path: str | Path) -> None:
    """Write instances as JSONL (one row per line, stable key order)."""
    Path(path).write_text("".join(json.dumps(i.to_row(), sort_keys=True) + "\n" for i in instances))


# --- suites


@runtime_checkable
class Suite(Protocol):
    """A set of tasks with images to run them in."""

    name: str

    def instances(self, limit: int | None = None) -> list[Instance]:
        """The suite's instances in a stable order; the first ``limit`` when given."""
        ...

    def image_for(self, instance: Instance, build: bool = True) -> str:
        """The image tag the instance runs in; builds it (cached) when ``build``, else raises if absent."""
        ...

    def test_command(self, instance: Instance) -> str:
        """The shell command, run in ``/testbed``, whose output grading parses (``pytest -rA ...``)."""
        ...


SuiteFactory = Callable[..., Suite]
_REGISTRY: dict[str, SuiteFactory] = {}
# Modules that register suites when imported; a missing one (a suite not built yet) is skipped.
_SUITE_MODULES = ("lumotree.tasks.synth", "lumotree.tasks.swebench")


def register_suite(name: str, factory: SuiteFactory) -> None:
    """Make ``get_suite(name, **options)`` call ``factory(**options)``."""
    _REGISTRY[name] = factory


def _load_suite_modules() -> None:
    import importlib

    for mod in _SUITE_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name is None or not mod.startswith(exc.name):
                raise


def suite_names() -> list[str]:
    _load_suite_modules()
    return sorted(_REGISTRY)


def get_suite(name: str, **options: Any) -> Suite:
    """The suite registered as ``name``; ``options`` (e.g. ``dataset=``, ``seed=``) go to its factory.

    Options a factory does not accept are dropped, so the CLI can pass its flags to any suite.
    """
    import inspect

    _load_suite_modules()
    if name not in _REGISTRY:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(sorted(_REGISTRY)) or 'none'}")
    factory = _REGISTRY[name]
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        options = {k: v for k, v in options.items() if k in params}
    return factory(**{k: v for k, v in options.items() if v is not None})


# --- sandboxes


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command in a sandbox."""

    exit_code: int  # the command's exit status; 124 when it was killed for its timeout
    output: str  # stdout and stderr interleaved, bounded (head and tail kept when truncated)
    truncated: bool  # True when output was cut; the cut is marked inside ``output`` with its size
    timed_out: bool  # True when the command ran past its timeout and its process group was killed
    seconds: float  # wall time of the command

    def __post_init__(self) -> None:
        assert self.seconds >= 0, self.seconds
        assert not self.timed_out or self.exit_code != 0, "a timed-out command cannot report success"


class Sandbox(Protocol):
    """One container per attempt: no network, non-root, limited, commands run one by one in ``/testbed``."""

    def exec(self, cmd: str, timeout: float | None = None, *, max_output: int | None = None) -> ExecResult:
        """Run ``cmd`` with bash in ``/testbed``; ``timeout`` seconds and ``max_output`` bytes kept
        (defaults from the sandbox config)."""
        ...

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write a file (absolute or relative to ``/testbed``) as the sandbox user."""
        ...

    def read_file(self, path: str) -> str:
        """Read a file from the sandbox (relative paths are under ``/testbed``)."""
        ...

    def diff(self) -> str:
        """``git diff`` of ``/testbed`` against its base state, new files included: the attempt's patch."""
        ...

    def close(self) -> None:
        """Remove the container (idempotent)."""
        ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...


def open_sandbox(image: str, config: SandboxConfig | None = None) -> Sandbox:
    """Start a sandbox container from ``image`` (reaping containers of dead orchestrators first)."""
    from lumotree.tasks.sandbox import DockerSandbox

    return DockerSandbox(image, config)


# --- grading


@dataclass
class GradeResult:
    """SWE-bench's verdict on one patch for one instance."""

    instance_id: str
    resolved: bool  # every FAIL_TO_PASS passes and every PASS_TO_PASS still passes
    fail_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    pass_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    patch_applied: bool = True  # False when the model patch (or test patch) did not apply
    reason: str = (
        ""  # why it is not resolved (patch did not apply, tests failed, timeout...); "" when resolved
    )
    status: str = ""  # swebench's ResolvedStatus value (RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO)
    log: str = ""  # the (ANSI-stripped, bounded) test log that was parsed
    test_exit_code: int | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        assert not (self.resolved and not self.patch_applied), "a patch that did not apply cannot resolve"
        assert self.resolved == (self.reason == ""), (self.resolved, self.reason)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def grade(
    instance: Instance,
    model_patch: str,
    image: str,
    *,
    test_command: str | None = None,
    config: SandboxConfig | None = None,
) -> GradeResult:
    """Apply ``model_patch`` (then the instance's test patch) in a fresh sandbox of ``image``, run the tests
    (``test_command``, default ``pytest -rA`` on the instance's test files), and grade with SWE-bench's rules.

    A patch that does not apply, a crash or a timeout is a graded failure with its reason, never an exception.
    """
    from lumotree.tasks.grading import grade as _grade

    return _grade(instance, model_patch, image, test_command=test_command, config=config)
