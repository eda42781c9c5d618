"""Offline image building: debootstrap a Debian release into a base image, then add layers on top.

No registry can be reached, so every image starts from ``debootstrap`` against the Debian mirror this
machine's apt already uses (read from the apt sources at run time) and is loaded with ``docker import``.
Layers (a Python venv, a testbed) are built by running a script in a container of the layer below with
network enabled for that build only, then ``docker commit``. Tags are content hashes of everything that
defines an image, so an unchanged image is found by tag and never rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumotree.tasks.api import TESTBED, VENV

IMAGE_LABEL = "lumotree.image"  # every image we build carries it (value: the layer name)
KIND_LABEL = "lumotree.kind"  # on our containers: "build" or "sandbox"
OWNER_PID_LABEL = "lumotree.owner_pid"  # pid of the process that created the container (reaped when dead)
OWNER_HOST_LABEL = "lumotree.owner_host"  # host of that process: pids mean nothing elsewhere
CREATED_LABEL = "lumotree.created"  # unix time the container was created
DEBIAN_CODENAMES = ("buster", "bullseye", "bookworm", "trixie", "forky", "sid")
SANDBOX_UID = 1000  # the non-root user sandbox commands run as; task images give /testbed to it
SANDBOX_USER = "sandbox"
BASE_RECIPE = 2  # bump when build_base changes what it puts in the image (part of the tag)
# Python of each Debian release, for callers that choose a release by Python version.
PYTHON_OF_RELEASE = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
# The base image's packages: enough to create venvs, install wheels, and work with git diffs.
DEFAULT_PACKAGES = ("python3", "python3-venv", "python3-pip", "git", "patch", "ca-certificates", "procps")
# Container environment of every image: the task's venv first on PATH, so it is active for every command.
IMAGE_ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def cache_dir() -> Path:
    """Where build locks and generated artefacts live (``$LUMOTREE_CACHE`` or ``~/.cache/lumotree``)."""
    root = Path(os.environ.get("LUMOTREE_CACHE", Path.home() / ".cache" / "lumotree"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def content_hash(*parts: Any, length: int = 16) -> str:
    """A stable hex digest of JSON-serialisable parts (key order does not matter)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


# --- apt mirror


def _apt_entries(root: Path) -> Iterator[tuple[str, list[str]]]:
    """(uri, suites) of every enabled ``deb`` source: one-line ``.list`` and deb822 ``.sources`` files."""
    files = [root / "sources.list"] if (root / "sources.list").is_file() else []
    d = root / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                    for uri in fields.get("uris", "").split():
                        yield uri, fields.get("suites", "").split()
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    yield words[1], [words[2]]


def apt_mirror(apt_root: str | Path = "/etc/apt") -> str:
    """The Debian archive URI this machine's apt uses (not the security archive)."""
    for uri, suites in _apt_entries(Path(apt_root)):
        releases = {s.split("-")[0] for s in suites}
        if releases & set(DEBIAN_CODENAMES) and not any(s.endswith("-security") for s in suites):
            return uri.rstrip("/")
    raise RuntimeError(f"no Debian archive found in the apt sources under {apt_root}")


def host_ca_bundle() -> Path | None:
    """The host's CA bundle, handed to builds so TLS to the package index works behind the same proxy."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


# --- docker helpers


def _docker() -> Any:
    # Imported lazily (slow import); typed Any because the SDK ships no type information.
    import importlib

    return importlib.import_module("docker")


def docker_client() -> Any:
    docker = _docker()
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means the same thing to the user
        raise RuntimeError(
            f"the Docker daemon does not answer ({exc}); start it with scripts/start-dockerd.sh"
        ) from exc
    return client


def image_exists(tag: str, client: Any = None) -> bool:
    docker = _docker()
    client = client or docker_client()
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


@contextmanager
def build_lock(tag: str) -> Iterator[None]:
    """Serialise builds of one tag across processes (two engineers, two CI jobs)."""
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / (re.sub(r"[^\w.-]", "_", tag) + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def owner_labels(kind: str) -> dict[str, str]:
    """Labels marking a container as ours and naming its owner, so orphans can be reaped after a crash."""
    return {
        KIND_LABEL: kind,
        OWNER_PID_LABEL: str(os.getpid()),
        OWNER_HOST_LABEL: socket.gethostname(),
        CREATED_LABEL: str(int(time.time())),
    }


def _changes(env: Mapping[str, str], workdir: str, label: str, user: str | None = None) -> list[str]:
    changes = [f"ENV {k}={v}" for k, v in env.items()]
    changes += [f"WORKDIR {workdir}", f"LABEL {IMAGE_LABEL}={label}", 'CMD ["sleep", "infinity"]']
    if user:
        changes.append(f"USER {user}")
    return changes


# --- base images


@dataclass(frozen=True)
class BaseSpec:
    """A Debian base image: what debootstrap installs."""

    release: str = "bookworm"  # Debian codename; bookworm has Python 3.11, bullseye 3.9
    packages: tuple[str, ...] = DEFAULT_PACKAGES  # extra packages debootstrap --include's
    variant: str = "minbase"  # debootstrap variant
    mirror: str | None = None  # None: the mirror of this machine's apt sources (read when building)

    def __post_init__(self) -> None:
        assert self.release in DEBIAN_CODENAMES, f"unknown Debian release {self.release!r}"

    def tag(self) -> str:
        # The mirror is not hashed: one release from another mirror is the same image.
        digest = content_hash(self.release, sorted(self.packages), self.variant, BASE_RECIPE)
        return f"lumotree/base:{self.release}-{digest}"


def _build_once(tag: str, force: bool, build: Callable[[], None], log: Any) -> str:
    """``build()`` the image ``tag`` unless it exists (looked for again under the tag's build lock, so that
    concurrent builders build it once); returns the tag."""
    client = docker_client()
    if not force and image_exists(tag, client):
        return tag
    with build_lock(tag):
        if not force and image_exists(tag, client):
            return tag
        t0 = time.monotonic()
        build()
        _say(log, f"built {tag} in {time.monotonic() - t0:.0f} s")
    return tag


def build_base(spec: BaseSpec = BaseSpec(), *, force: bool = False, log: Any = None) -> str:
    """Debootstrap ``spec`` into a rootfs and ``docker import`` it; returns the tag (reused when present)."""
    tag = spec.tag()

    def build() -> None:
        if shutil.which("debootstrap") is None:
            raise RuntimeError("debootstrap is not installed; run scripts/start-dockerd.sh (it installs it)")
        mirror = spec.mirror or apt_mirror()
        with tempfile.TemporaryDirectory(prefix="lumotree-rootfs-", dir=_scratch()) as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = [
                "debootstrap",
                f"--variant={spec.variant}",
                f"--include={','.join(spec.packages)}",
                spec.release,
                str(rootfs),
                mirror,
            ]
            _run(cmd, log)
            _add_sandbox_user(rootfs)
            # Shrink: apt lists and caches are useless offline.
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            tar = subprocess.Popen(
                ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE
            )
            imp = ["docker", "import"]
            for change in _changes(IMAGE_ENV, "/", "base"):
                imp += ["--change", change]
            _run([*imp, "-", tag], log, stdin=tar.stdout)
            if tar.wait() != 0:
                raise RuntimeError("tar of the rootfs failed")

    return _build_once(tag, force, build, log)


def _add_sandbox_user(rootfs: Path) -> None:
    # Tools look the uid up (getpass, ssh, pip); a passwd entry with HOME on the tmpfs keeps them working.
    with open(rootfs / "etc/passwd", "a") as fh:
        fh.write(f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/bin/bash\n")
    with open(rootfs / "etc/group", "a") as fh:
        fh.write(f"{SANDBOX_USER}:x:{SANDBOX_UID}:\n")


def _scratch() -> str:
    # Debootstrap needs a filesystem that allows device nodes and is not noexec; /var/tmp usually is.
    return "/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir()


def _run(cmd: Sequence[str], log: Any, stdin: Any = None) -> None:
    _say(log, "$ " + " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""))
    proc = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"{cmd[0]} failed with exit code {proc.returncode}:\n{tail}")


def _say(log: Any, msg: str) -> None:
    if log is not None:
        log(msg)


# --- layers


@dataclass(frozen=True)
class LayerSpec:
    """A layer built by running ``script`` (bash, as root) in a container of ``base`` with network."""

    name: str  # image repository name under ``lumotree/`` (e.g. "astropy-synth")
    base: str  # tag of the image below
    script: str  # the build script; part of the hash
    inputs: Mapping[str, Any] = field(
        default_factory=dict
    )  # anything else that defines the image (versions...)
    files: Mapping[str, bytes] = field(default_factory=dict)  # files copied in before the script runs; hashed
    env: Mapping[str, str] = field(default_factory=lambda: dict(IMAGE_ENV))  # the image's ENV
    workdir: str = TESTBED  # the image's working directory

    def tag(self) -> str:
        files = {k: hashlib.sha256(v).hexdigest() for k, v in self.files.items()}
        digest = content_hash(self.base, self.script, dict(self.inputs), files, dict(self.env), self.workdir)
        return f"lumotree/{self.name}:{digest}"


def clean_build_env() -> dict[str, str]:
    """The build container's environment: nothing of the host's pip configuration, only TLS trust.

    The host may carry find-links, constraints and extra indexes (config files and ``PIP_*`` variables);
    none of it may shape an image, so pip runs with ``PIP_CONFIG_FILE=/dev/null`` and ``--isolated``.
    """
    env = dict(IMAGE_ENV)
    env.update(
        HOME="/root",
        PIP_CONFIG_FILE="/dev/null",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PIP_ROOT_USER_ACTION="ignore",
        DEBIAN_FRONTEND="noninteractive",
    )
    if host_ca_bundle() is not None:
        env.update(PIP_CERT="/etc/lumotree-ca.crt", SSL_CERT_FILE="/etc/lumotree-ca.crt")
    return env


def build_layer(spec: LayerSpec, *, force: bool = False, timeout: float = 1800, log: Any = None) -> str:
    """Build ``spec`` on top of ``spec.base`` unless its tag exists; returns the tag."""
    tag = spec.tag()

    def build() -> None:
        client = docker_client()
        files = dict(spec.files)
        ca = host_ca_bundle()
        if ca is not None:
            files["/etc/lumotree-ca.crt"] = ca.read_bytes()
        # The build environment is exported inside the script, not set on the container: docker commit would
        # otherwise bake it into the image.
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in clean_build_env().items())
        script = exports + spec.script + "\nrm -f /etc/lumotree-ca.crt\n"
        container = client.containers.create(
            spec.base,
            command=["bash", "-euo", "pipefail", "-c", script],
            network_mode="host",  # network at build time only; sandboxes run with none
            working_dir="/",
            labels=owner_labels("build"),
        )
        try:
            if files:
                container.put_archive("/", _tar(files))
            container.start()
            status = container.wait(timeout=timeout)
            output = container.logs().decode(errors="replace")
            if status.get("StatusCode") != 0:
                raise RuntimeError(
                    f"building {tag} failed (exit {status.get('StatusCode')}):\n{output[-4000:]}"
                )
            repo, _, version = tag.rpartition(":")
            container.commit(
                repository=repo, tag=version, changes=_changes(spec.env, spec.workdir, spec.name)
            )
        finally:
            container.remove(force=True)

    return _build_once(tag, force, build, log)


def _tar(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def venv_script(
    packages: Sequence[str], *, python: str = "python3", extra_pip_args: Sequence[str] = ()
) -> str:
    """A build script creating ``/opt/venv`` with ``packages`` from the package index (clean pip config)."""
    pkgs = " ".join(f"'{p}'" for p in packages)
    args = " ".join(extra_pip_args)
    return (
        f"{python} -m venv {VENV}\n"
        # --isolated ignores PIP_* variables too, so the CA bundle is passed explicitly.
        f'{VENV}/bin/pip install --isolated ${{PIP_CERT:+--cert "$PIP_CERT"}} --no-cache-dir '
        f"--progress-bar off {args} {pkgs}\n"
    )
