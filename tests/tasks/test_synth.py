"""astropy-synth: shipped instances are well formed and leak no fix; a few validate in the offline image."""

from __future__ import annotations

import re

import pytest

from lumotree.tasks.api import get_suite
from lumotree.tasks.synth.config import SynthConfig
from lumotree.tasks.synth.generate import problem_statement
from lumotree.tasks.synth.suite import AstropySynthSuite

CI_VALIDATE = 3  # instances validated for real in CI (each: instance image + gold and empty runs)


@pytest.fixture(scope="module")
def suite() -> AstropySynthSuite:
    s = get_suite("astropy-synth")
    assert isinstance(s, AstropySynthSuite)
    if not s.packaged_path().is_file() and not s.cache_path().is_file():
        pytest.fail(f"no generated instances for the default config ({s.packaged_path().name})")
    return s


def changed_lines(patch: str) -> list[str]:
    return [
        line[1:].strip()
        for line in patch.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()
    ]


def test_shipped_instances_follow_the_schema_and_leak_no_fix(suite: AstropySynthSuite) -> None:
    insts = suite.instances()
    assert len(insts) >= 30
    assert len({i.instance_id for i in insts}) == len(insts)
    for inst in insts:
        assert (
            inst.repo == "astropy/astropy"
            and inst.test_patch == ""
            and inst.version == SynthConfig().astropy_version
        )
        assert re.fullmatch(r"[0-9a-f]{40}", inst.base_commit)
        assert inst.patch.startswith("diff --git a/astropy/") and inst.FAIL_TO_PASS
        assert not set(inst.FAIL_TO_PASS) & set(inst.PASS_TO_PASS)
        text = inst.problem_statement
        for line in changed_lines(inst.patch):
            # Short lines ("pass", "return x") may match test code; a whole mutated line must not appear.
            if len(line) > 12:
                assert line not in text, (inst.instance_id, line)
        assert "diff --git" not in text and "\n@@ " not in text and "+++ b/" not in text
    assert suite.instances(limit=5) == insts[:5]


def test_problem_statement_is_deterministic_and_normalised() -> None:
    log = (
        "PASSED astropy/x/tests/test_a.py::test_ok\n"
        "FAILED astropy/x/tests/test_a.py::test_b - AssertionError: <Obj at 0x7f00deadbeef> in "
        "/tmp/pytest-of-sandbox/pytest-3/test_b0/f.txt\n"
    )
    one = problem_statement(
        "astropy/x/tests/test_a.py", "astropy/x/a.py", ["astropy/x/tests/test_a.py::test_b"], log
    )
    two = problem_statement(
        "astropy/x/tests/test_a.py", "astropy/x/a.py", ["astropy/x/tests/test_a.py::test_b"], log
    )
    assert one == two and "0x..." in one and "/tmp/pytest/test_b0" in one and "test_ok" not in one


def test_candidate_order_depends_on_the_seed_only(tmp_path) -> None:
    from lumotree.tasks.synth.generate import candidate_pairs

    for name in ("a", "b", "c", "d", "e"):
        (tmp_path / "astropy" / "utils" / "tests").mkdir(parents=True, exist_ok=True)
        (tmp_path / "astropy" / "utils" / f"{name}.py").write_text("def f():\n    return 1\n")
        (tmp_path / "astropy" / "utils" / "tests" / f"test_{name}.py").write_text("def test_f():\n    pass\n")
    cfg = SynthConfig(subpackages=("utils",))
    first = candidate_pairs(tmp_path, cfg)
    assert first == candidate_pairs(tmp_path, cfg) and len(first) == 5
    assert first != candidate_pairs(tmp_path, SynthConfig(subpackages=("utils",), seed=1))


@pytest.mark.docker
def test_handful_validate_in_offline_image(suite: AstropySynthSuite) -> None:
    import docker
    from lumotree.tasks.validate import validate

    insts = suite.instances(limit=CI_VALIDATE)
    report = validate(suite, insts)
    assert report["valid_count"] == CI_VALIDATE, report
    # The instance repository is one root commit: no history or stray object holds the fix.
    client = docker.from_env()
    image = suite.image_for(insts[0], build=False)
    out = (
        client.containers.run(
            image,
            [
                "bash",
                "-c",
                "git rev-list --count HEAD; git rev-list --all --objects | wc -l; "
                "git cat-file --batch-all-objects --batch-check | wc -l; git status --porcelain | wc -l",
            ],
            remove=True,
            user="1000:1000",
            environment={
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "safe.directory",
                "GIT_CONFIG_VALUE_0": "*",
            },
        )
        .decode()
        .split()
    )
    commits, reachable, stored, dirty = map(int, out)
    assert commits == 1 and reachable == stored and dirty == 0, out
