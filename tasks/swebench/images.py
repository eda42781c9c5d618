"""Docker images of the SWE-bench suite, as layers over the offline-built Debian base.

    base (debootstrap, per Debian release) -> env (venv + era pins, per era) -> testbed (a release built
    in /testbed, per release) -> instance (the base state of one instance; only when patches were reversed)

Each layer's tag is a content hash of what defines it, so a second run finds every image by tag. Installs are
offline: the era's wheels are downloaded once (for the image's Python, on the host, with a clean pip
environment) into a wheelhouse that travels into the env image; later layers install with ``--no-index``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from lumotree.tasks.rootfs import DEFAULT_PACKAGES, BaseSpec, LayerSpec, build_base, build_layer, content_hash
from lumotree.tasks.swebench.config import SwebenchConfig
from lumotree.tasks.swebench.releases import clean_pip_env, index_url
from lumotree.tasks.swebench.specs import Era

WHEELS = "/opt/wheels"
SANDBOX_OWNER = "1000:1000"  # the sandbox user owns /testbed (tasks.sandbox.SANDBOX_UID)
BUILD_PACKAGES = ("gcc", "g++", "make", "libc6-dev", "python3-dev")
# Manylinux tags a bullseye system (glibc 2.31) accepts, newest first.
PLATFORMS: tuple[str, ...] = (
    "manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux2010_x86_64",
    "manylinux1_x86_64",
)  # fmt: skip
# Files whose change needs the compiled extensions rebuilt.
COMPILED_SUFFIXES = (".c", ".h", ".pyx", ".pxd", ".cpp")
GIT = "git -c user.name=lumotree -c user.email=lumotree@localhost"


def wheelhouse(config: SwebenchConfig, era: Era) -> Path:
    """The era's wheels (pins and their dependencies) for the image's Python, downloaded once."""
    folder = config.cache / "wheelhouse" / f"{era.name}-{content_hash(era.pins, era.python, PLATFORMS)}"
    done = folder / ".complete"
    if done.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    py = era.python.replace(".", "")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--isolated",
        "--only-binary",
        ":all:",
        "--dest",
        str(folder),
    ]
    cmd += ["--index-url", index_url(config), "--python-version", era.python, "--implementation", "cp"]
    cmd += ["--abi", f"cp{py}"] + [arg for p in PLATFORMS for arg in ("--platform", p)] + list(era.pins)
    proc = subprocess.run(cmd, env=clean_pip_env(), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(
            f"downloading the {era.name} wheelhouse failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    done.write_text("\n".join(sorted(p.name for p in folder.glob("*.whl"))) + "\n")
    return folder


def base_image(era: Era, log: Any = None) -> str:
    spec = BaseSpec(release=era.debian, packages=tuple(dict.fromkeys(DEFAULT_PACKAGES + BUILD_PACKAGES)))
    return build_base(spec, log=log)


def env_image(config: SwebenchConfig, era: Era, log: Any = None) -> str:
    """The era's venv at /opt/venv with its pins, installed offline from the wheelhouse kept in the image."""
    wheels = wheelhouse(config, era)
    files = {f"{WHEELS}/{p.name}": p.read_bytes() for p in sorted(wheels.glob("*.whl"))}
    pins = " ".join(shlex.quote(p) for p in era.pins)
    script = (
        f"python{era.python} -m venv /opt/venv\n"
        f"/opt/venv/bin/pip install --isolated --no-index --find-links {WHEELS} --progress-bar off {pins}\n"
        # Layers run git as root on a tree the sandbox user owns: trust it system-wide.
        "git config --system --add safe.directory '*'\n"
    )
    spec = LayerSpec(
        name="swebench-env", base=base_image(era, log), script=script, files=files, inputs={"era": era.name}
    )
    return build_layer(spec, timeout=config.build_timeout, log=log)


def install_command(era: Era, *, deps: bool = True) -> str:
    target = ".[test]" if era.test_extras else "."
    flags = "" if deps else " --no-deps"
    return (
        f"pip install --isolated --no-index --find-links {WHEELS} --no-build-isolation --progress-bar off"
        f"{flags} -e '{target}'"
    )


def testbed_image(config: SwebenchConfig, era: Era, version: str, sdist: Path, log: Any = None) -> str:
    """A release unpacked into /testbed as a git repo, built in place; build outputs are git-excluded."""
    fixes = "\n".join(era.source_fixes)
    script = f"""
mkdir -p /testbed && tar -xzf /tmp/release.tar.gz -C /testbed --strip-components=1 && rm /tmp/release.tar.gz
cd /testbed
{fixes}
# The build must see the release's own version, not one made up from our fresh git history.
export SETUPTOOLS_SCM_PRETEND_VERSION={version}
git init -q && {GIT} add -A -f && {GIT} commit -q -m 'release {version}'
{install_command(era)}
python -c 'import astropy, sys; print("built astropy", astropy.__version__, file=sys.stderr)'
# Whatever the build generated stays out of every diff; what it rewrote becomes part of the base.
git ls-files --others --exclude-standard | sed 's|^|/|' >> .git/info/exclude
{GIT} add -A && ({GIT} diff --cached --quiet || {GIT} commit -q -m 'build outputs')
chown -R {SANDBOX_OWNER} /testbed
"""
    spec = LayerSpec(
        name="swebench-testbed",
        base=env_image(config, era, log),
        script=script,
        files={"/tmp/release.tar.gz": sdist.read_bytes()},
        inputs={"release": version, "era": era.name},
    )
    return build_layer(spec, timeout=config.build_timeout, log=log)


def instance_image(testbed: str, era: Era, reversed_patches: list[str], label: str, log: Any = None) -> str:
    """The base state of one instance: ``reversed_patches`` taken out of the testbed and committed."""
    if not reversed_patches:
        return testbed
    files = {f"/tmp/lumotree/rev-{i}.patch": p.encode() for i, p in enumerate(reversed_patches)}
    compiled = any(
        line.rstrip().endswith(COMPILED_SUFFIXES)
        for p in reversed_patches
        for line in p.splitlines()
        if line.startswith(("+++ ", "--- "))
    )
    steps = "\n".join(
        f"git apply -R /tmp/lumotree/rev-{i}.patch || patch -p1 -R --batch --fuzz=3 --no-backup-if-mismatch "
        f"-r - -i /tmp/lumotree/rev-{i}.patch"
        for i in range(len(reversed_patches))
    )
    script = f"""
cd /testbed
{steps}
rm -rf /tmp/lumotree
{install_command(era, deps=False) if compiled else ":"}
{GIT} add -A && {GIT} commit -q -m 'base state ({label})'
chown -R {SANDBOX_OWNER} /testbed
"""
    spec = LayerSpec(
        name="swebench-instance", base=testbed, script=script, files=files, inputs={"label": label}
    )
    return build_layer(spec, log=log)


def git_image(config: SwebenchConfig, era: Era, repo: str, commit: str, log: Any = None) -> str:
    """The repository cloned at ``commit`` into /testbed and built (needs the network while building)."""
    script = f"""
git clone -q {shlex.quote(config.git_url.format(repo=repo))} /testbed
cd /testbed && git checkout -q {shlex.quote(commit)}
{chr(10).join(era.source_fixes)}
{install_command(era)}
git ls-files --others --exclude-standard | sed 's|^|/|' >> .git/info/exclude
{GIT} add -A && ({GIT} diff --cached --quiet || {GIT} commit -q -m 'build outputs')
chown -R {SANDBOX_OWNER} /testbed
"""
    spec = LayerSpec(
        name="swebench-git",
        base=env_image(config, era, log),
        script=script,
        inputs={"repo": repo, "commit": commit},
    )
    return build_layer(spec, timeout=config.build_timeout, log=log)


def prebuilt_image(image: str, log: Any = None) -> str:
    """SWE-bench's official image adapted to our layout (its conda env as /opt/venv, /testbed to the sandbox
    user); pulling it needs a reachable registry."""
    from lumotree.tasks.rootfs import docker_client, image_exists

    if not image_exists(image):
        docker_client().images.pull(image)
    script = f"""
ln -sfn /opt/miniconda3/envs/testbed /opt/venv
getent passwd 1000 >/dev/null || useradd -u 1000 -M -d /tmp sandbox
git config --system --add safe.directory '*'
chown -R {SANDBOX_OWNER} /testbed
"""
    return build_layer(
        LayerSpec(name="swebench-prebuilt", base=image, script=script, inputs={"image": image}), log=log
    )
