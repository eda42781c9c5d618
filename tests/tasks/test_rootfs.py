"""Offline image building: apt mirror discovery, content-hash tags, and reuse of unchanged images."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lumotree.tasks.rootfs import BaseSpec, LayerSpec, apt_mirror, build_layer, clean_build_env, content_hash


def test_apt_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "a.sources").write_text(
        "Types: deb\n# comment\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
    )
    (tmp_path / "sources.list.d" / "off.list.disabled").write_text(
        "deb http://off.example/debian bookworm main\n"
    )
    assert apt_mirror(tmp_path) == "http://mirror.example/debian"
    one = tmp_path / "one"
    one.mkdir()
    (one / "sources.list").write_text(
        "# deb http://old.example/debian bullseye main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://ppa.example/x nodistro main\n"
        "deb http://deb.example/debian bullseye main contrib\n"
    )
    assert apt_mirror(one) == "http://deb.example/debian"
    with pytest.raises(RuntimeError, match="no Debian archive"):
        apt_mirror(tmp_path / "missing")


def test_tags_are_content_hashes() -> None:
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})
    assert BaseSpec("bookworm").tag() == BaseSpec("bookworm", mirror="http://elsewhere/debian").tag()
    assert BaseSpec("bookworm").tag() != BaseSpec("bullseye").tag()
    layer = LayerSpec(name="x", base="b:1", script="true", files={"/f": b"1"})
    assert layer.tag() == LayerSpec(name="x", base="b:1", script="true", files={"/f": b"1"}).tag()
    assert layer.tag() != LayerSpec(name="x", base="b:1", script="true", files={"/f": b"2"}).tag()
    assert layer.tag() != LayerSpec(name="x", base="b:2", script="true", files={"/f": b"1"}).tag()


def test_build_environment_carries_no_host_pip_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/somewhere")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///elsewhere")
    env = clean_build_env()
    assert env["PIP_CONFIG_FILE"] == "/dev/null"
    assert not {
        k for k in env if k in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_INDEX_URL")
    }


@pytest.mark.docker
def test_venv_inside_image_ignores_host_pip_config_and_second_build_is_fast(mini_image: str) -> None:
    import docker

    client = docker.from_env()
    out = client.containers.run(
        mini_image,
        ["bash", "-c", "ls /etc/pip.conf /etc/xdg/pip 2>&1; env | grep ^PIP_ || true"],
        remove=True,
    ).decode()
    assert "No such file" in out and "PIP_" not in out.replace("No such file", ""), out
    # A second build of an unchanged image finds it by tag.
    from lumotree.tasks.rootfs import build_base

    t0 = time.monotonic()
    base = build_base(BaseSpec())
    assert client.images.get(mini_image).attrs["Config"]["Labels"]["lumotree.image"] == "test-mini"
    spec = LayerSpec(name="test-mini-echo", base=base, script="echo built > /built.txt")
    tag = build_layer(spec)
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert build_base(BaseSpec()) == base and build_layer(spec) == tag
    second = time.monotonic() - t0
    assert second < 10, (first, second)
    assert client.containers.run(tag, ["cat", "/built.txt"], remove=True).decode().strip() == "built"
