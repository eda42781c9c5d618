"""Fixtures for the tasks tests: a Docker client and a tiny task image (a git repo with pytest)."""

from __future__ import annotations

import pytest

MINI_SOURCE = """def clip(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
"""
MINI_TEST = """from mini import clip


def test_inside():
    assert clip(5, 0, 10) == 5


def test_low():
    assert clip(-3, 0, 10) == 0


def test_high():
    assert clip(30, 0, 10) == 10
"""


@pytest.fixture(scope="session")
def docker_ready() -> None:
    from lumotree.tasks.rootfs import docker_client

    try:
        docker_client()
    except RuntimeError as exc:
        pytest.fail(f"{exc} (run scripts/start-dockerd.sh as root)")


@pytest.fixture(scope="session")
def mini_image(docker_ready: None) -> str:
    """A task image in SWE-bench layout: /testbed a git repo of the sandbox user, pytest in the venv."""
    from lumotree.tasks.rootfs import SANDBOX_UID, BaseSpec, LayerSpec, build_base, build_layer, venv_script
    from lumotree.tasks.synth.testbed import git_init_script

    base = build_base(BaseSpec())
    script = (
        venv_script(["pytest==8.3.5"])
        + "mkdir -p /testbed && cp /opt/mini/mini.py /opt/mini/test_mini.py /testbed/ && rm -rf /opt/mini\n"
        + "cd /testbed && printf '__pycache__/\\n' > .gitignore\n"
        + git_init_script()
        + f"chown -R {SANDBOX_UID}:{SANDBOX_UID} /testbed\n"
    )
    spec = LayerSpec(
        name="test-mini",
        base=base,
        script=script,
        files={"/opt/mini/mini.py": MINI_SOURCE.encode(), "/opt/mini/test_mini.py": MINI_TEST.encode()},
    )
    return build_layer(spec)
