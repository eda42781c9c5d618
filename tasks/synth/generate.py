"""Generate ``astropy-synth`` instances: mutate covered functions, keep the mutants the tests catch.

For each candidate (source module, its test module) in seeded order: run the test module clean, then for a
few seeded mutation sites write the mutant, run the tests again, and compare. FAIL_TO_PASS = passed clean
and failed buggy; PASS_TO_PASS = passed both. The gold patch (buggy -> clean) and the base commit come from
git in the sandbox, so the instance image rebuilt from the patch has exactly that commit.
"""

from __future__ import annotations

import io
import random
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumotree.tasks.api import TESTBED, Instance
from lumotree.tasks.grading import parse_log, strip_ansi
from lumotree.tasks.rootfs import cache_dir, content_hash, docker_client
from lumotree.tasks.sandbox import DockerSandbox, SandboxConfig
from lumotree.tasks.synth.config import SynthConfig
from lumotree.tasks.synth.mutate import Site, mutate, mutation_sites
from lumotree.tasks.synth.testbed import TEST_COMMAND, commit_tree_script, git_init_script

REPO = "astropy/astropy"
PASSED, FAILED, ERROR = "PASSED", "FAILED", "ERROR"


@dataclass(frozen=True)
class TestRun:
    status: dict[str, str]
    log: str
    seconds: float
    timed_out: bool


def extract_sources(testbed: str) -> Path:
    """The testbed's Python sources on the host (cached per image), for choosing and mutating sites."""
    client = docker_client()
    image_id = client.images.get(testbed).id.split(":")[-1][:16]
    dest = cache_dir() / "synth" / f"src-{image_id}"
    if (dest / ".complete").exists():
        return dest
    container = client.containers.create(testbed, command=["true"])
    try:
        stream, _ = container.get_archive(f"{TESTBED}/astropy")
        data = io.BytesIO(b"".join(stream))
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=data) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".py")]
        tar.extractall(dest, members=members, filter="data")
    (dest / ".complete").touch()
    return dest


def candidate_pairs(src_root: Path, config: SynthConfig) -> list[tuple[str, str]]:
    """(source, test module) pairs named ``x.py`` / ``tests/test_x.py``, in the seed's order."""
    pairs = []
    for sub in config.subpackages:
        for src in sorted((src_root / "astropy" / sub).rglob("*.py")):
            if "tests" in src.parts or src.name.startswith(("test_", "_")) or "extern" in src.parts:
                continue
            test = src.parent / "tests" / f"test_{src.stem}.py"
            if not test.is_file() or src.stat().st_size > config.max_source_bytes:
                continue
            text = test.read_text(errors="replace")
            if "hypothesis" in text or "remote_data" in text:  # randomised or network-bound tests
                continue
            pairs.append((str(src.relative_to(src_root)), str(test.relative_to(src_root))))
    random.Random(config.seed).shuffle(pairs)
    return pairs


def run_tests(sb: DockerSandbox, test_file: str, timeout: float) -> TestRun:
    res = sb.exec(f"{TEST_COMMAND} {shlex.quote(test_file)}", timeout, max_output=32 << 20)
    log = strip_ansi(res.output)
    # Leave /testbed as HEAD has it: tests that write files there must not leak into the next tree.
    sb.exec("git checkout -q HEAD -- . && git clean -fdq", 120)
    status = parse_log(_probe_instance(), log)
    return TestRun(status, log, res.seconds, res.timed_out)


def _probe_instance() -> Instance:
    # parse_log only needs the log parser; astropy's.
    return Instance(
        instance_id="probe",
        repo=REPO,
        base_commit="0",
        patch="",
        problem_statement="probe",
        FAIL_TO_PASS=["x"],
    )


_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")
_TMP = re.compile(r"/tmp/pytest-of-[^/\s]+/pytest-\d+/")


def problem_statement(test_file: str, source_file: str, f2p: list[str], log: str) -> str:
    """A deterministic issue text from the failing output; it names symptoms, never the change."""
    messages = []
    for line in log.splitlines():
        if line.startswith((f"{FAILED} ", f"{ERROR} ")) and any(t in line for t in f2p):
            line = _TMP.sub("/tmp/pytest/", _ADDR.sub("0x...", line))
            messages.append(line if len(line) <= 400 else line[:400] + " ...")
    first = f2p[0].split("::", 1)[-1]
    others = f" and {len(f2p) - 1} other test{'s' if len(f2p) > 2 else ''}" if len(f2p) > 1 else ""
    module = source_file.removesuffix(".py").replace("/", ".")
    listed = "\n".join(f"- `{t}`" for t in f2p[:15]) + (
        f"\n- ... ({len(f2p) - 15} more)" if len(f2p) > 15 else ""
    )
    shown = "\n".join(messages[:6]) or "(no failure message was printed)"
    return (
        f"`{first}`{others} fail in `{test_file}`\n\n"
        f"The test suite of `{module}` no longer passes. These tests fail:\n\n{listed}\n\n"
        f"Running `pytest -rA {test_file}` reports:\n\n```\n{shown}\n```\n\n"
        f"The tests describe the intended behaviour of `{module}` and are correct as they are. "
        "Please fix the library code so that they pass again, without breaking the other tests."
    )


def generate(config: SynthConfig, testbed: str, *, log: Callable[[str], Any] | None = None) -> list[Instance]:
    """Generate ``config.count`` instances (fewer only if the candidates run out)."""
    say = log or (lambda _msg: None)
    src_root = extract_sources(testbed)
    pairs = candidate_pairs(src_root, config)
    say(f"{len(pairs)} candidate modules")
    instances: list[Instance] = []
    sb_config = SandboxConfig(timeout=config.test_timeout, pids=1024)
    with DockerSandbox(testbed, sb_config) as sb:
        res = sb.exec(git_init_script(), 300)
        if res.exit_code != 0:
            raise RuntimeError(f"git init of the testbed failed: {res.output[-2000:]}")
        for src, test in pairs:
            if len(instances) >= config.count:
                break
            clean = run_tests(sb, test, config.test_timeout)
            passed = sorted(t for t, s in clean.status.items() if s == PASSED)
            if clean.timed_out or clean.seconds > config.max_test_seconds or not passed:
                say(f"skip {test}: {len(passed)} passing, {clean.seconds:.0f} s")
                continue
            source = (src_root / src).read_text()
            sites = mutation_sites(source)
            rng = random.Random(f"{config.seed}:{src}")
            chosen = rng.sample(range(len(sites)), min(config.mutants_per_module, len(sites)))
            kept = 0
            for index in chosen:
                if kept >= config.max_per_module or len(instances) >= config.count:
                    break
                inst = _try_mutant(sb, config, src, test, source, index, passed)
                if inst is not None:
                    instances.append(inst)
                    kept += 1
                    say(f"[{len(instances)}/{config.count}] {inst.instance_id} {src}")
    return instances


def _try_mutant(
    sb: DockerSandbox, config: SynthConfig, src: str, test: str, source: str, index: int, passed: list[str]
) -> Instance | None:
    buggy, site = mutate(source, index)
    sb.write_file(src, buggy)
    commit = sb.exec(commit_tree_script(), 120)
    base = commit.output.strip()
    run = run_tests(sb, test, config.test_timeout)  # also restores the clean tree
    if commit.exit_code != 0 or not re.fullmatch(r"[0-9a-f]{40}", base) or run.timed_out:
        return None
    if any(t not in run.status for t in passed):  # collection broke: not comparable test by test
        return None
    f2p = [t for t in passed if run.status[t] in (FAILED, ERROR)]
    p2p = [t for t in passed if run.status[t] == PASSED]
    if not 1 <= len(f2p) <= config.max_fail_to_pass:
        return None
    diff = sb.exec(f"git diff --no-color {base} HEAD", 120, max_output=1 << 20)
    if diff.exit_code != 0 or not diff.output.startswith("diff --git"):
        return None
    return _instance(config, src, test, site, base, diff.output, f2p, p2p, run.log)


def _instance(
    config: SynthConfig,
    src: str,
    test: str,
    site: Site,
    base: str,
    patch: str,
    f2p: list[str],
    p2p: list[str],
    log: str,
) -> Instance:
    iid = f"astropy__astropy-synth-{content_hash(config.astropy_version, src, patch, length=10)}"
    # model_validate: ``synth`` is an extra field (the schema allows extras), not a constructor argument.
    return Instance.model_validate(
        dict(
            instance_id=iid,
            repo=REPO,
            base_commit=base,
            patch=patch,
            test_patch="",
            problem_statement=problem_statement(test, src, f2p, log),
            FAIL_TO_PASS=f2p,
            PASS_TO_PASS=p2p,
            version=config.astropy_version,
            log_parser="parse_log_astropy",
            # Where the bug is: for analysis only, never shown to an agent.
            synth={
                "source": src,
                "test": test,
                "operator": site.operator,
                "line": site.line,
                "function": site.function,
            },
        )
    )


def elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.0f} s"
