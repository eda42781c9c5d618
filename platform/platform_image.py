"""The platform image, built offline: a debootstrap Debian base plus a layer with LumoTree installed by pip.

No registry is needed: the base comes from ``lumotree.tasks.rootfs.build_base`` (debootstrap + docker import)
and two layers go on top: the target's dependencies (cached until the requirements change), then the project
installed by pip from an archive of the repository's tracked files. Tags are content hashes, so an unchanged
tree reuses the image and a source change rebuilds only the thin project layer.

    python -m lumotree.platform.platform_image --target dashboard    # prints the tag
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from lumotree.tasks import rootfs

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("dashboard", "full")
# What pip needs to build the project; tests and CI files stay out of the image.
SOURCE_DIRS = ("platform", "serving", "kernels", "agents", "tasks", "db", "dashboards")
SOURCE_FILES = ("pyproject.toml", "README.md", "__init__.py")


@dataclass(frozen=True)
class PlatformImageSpec:
    """Which platform image to build."""

    # dashboard: the project without its heavy dependencies plus the dashboard's (small); full: everything.
    target: str = "dashboard"
    # Debian release of the base (bookworm: Python 3.11).
    release: str = "bookworm"
    # Repository root (a git checkout) whose tracked files are installed.
    source: Path = REPO_ROOT

    def __post_init__(self) -> None:
        assert self.target in TARGETS, f"unknown target {self.target!r}; choose from {TARGETS}"


def source_files(root: Path) -> list[str]:
    """The tracked files that make up the package, sorted (their content as in the working tree)."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True)
    names = [n for n in out.stdout.decode().split("\0") if n]
    keep = [n for n in names if n in SOURCE_FILES or n.split("/", 1)[0] in SOURCE_DIRS]
    return sorted(n for n in keep if (root / n).is_file())


def source_archive(root: Path) -> bytes:
    """A reproducible tar of the package sources: sorted names, zero mtimes and owners, fixed modes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in source_files(root):
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(f"src/{name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def requirements(spec: PlatformImageSpec) -> str:
    """The target's third-party requirements from pyproject.toml: the ``dashboard`` extra, or every
    dependency (docker/install.sh reads the same lists)."""
    with open(spec.source / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    deps = extras["dashboard"] if spec.target == "dashboard" else project["dependencies"]
    return "\n".join(deps) + "\n"


def layer_specs(spec: PlatformImageSpec, base: str) -> tuple[rootfs.LayerSpec, rootfs.LayerSpec]:
    """Two layers: the dependencies (rebuilt only when the requirements change) and the project itself
    (``pip install --no-deps`` of the source archive: seconds, rebuilt on every source change)."""
    deps = rootfs.LayerSpec(
        name=f"platform-deps-{spec.target}",
        base=base,
        script=(
            f"python3 -m venv {rootfs.VENV}\n"
            f'{rootfs.VENV}/bin/pip install --isolated ${{PIP_CERT:+--cert "$PIP_CERT"}} --no-cache-dir '
            "--progress-bar off -r /tmp/requirements.txt\nrm -f /tmp/requirements.txt\nmkdir -p /work\n"
        ),
        files={"/tmp/requirements.txt": requirements(spec).encode()},
        workdir="/work",
    )
    project = rootfs.LayerSpec(
        name=f"platform-{spec.target}",
        base=deps.tag(),
        script=(
            "mkdir -p /tmp/lumotree && tar -C /tmp/lumotree -xf /tmp/lumotree.tar\n"
            # Build isolation fetches setuptools; the project's own dependencies are in the layer below.
            f'{rootfs.VENV}/bin/pip install --isolated ${{PIP_CERT:+--cert "$PIP_CERT"}} --no-cache-dir '
            "--progress-bar off --no-deps /tmp/lumotree/src\n"
            f"{rootfs.VENV}/bin/lumotree --help >/dev/null\n"
            "rm -rf /tmp/lumotree /tmp/lumotree.tar /root/.cache\n"
        ),
        files={"/tmp/lumotree.tar": source_archive(spec.source)},
        workdir="/work",
    )
    return deps, project


def build_platform_image(
    spec: PlatformImageSpec = PlatformImageSpec(), *, force: bool = False, log: Any = print
) -> str:
    """Build (or find by content hash) the platform image; returns its tag. Also tags it
    ``lumotree/platform:<target>`` (and ``lumotree/platform:latest`` for the full target) for compose."""
    base = rootfs.build_base(rootfs.BaseSpec(release=spec.release), log=log)
    deps, project = layer_specs(spec, base)
    rootfs.build_layer(deps, force=force, log=log)
    tag = rootfs.build_layer(project, force=force, log=log)
    image = rootfs.docker_client().images.get(tag)
    image.tag("lumotree/platform", spec.target)
    if spec.target == "full":
        image.tag("lumotree/platform", "latest")
    return tag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, default="full")
    parser.add_argument("--release", default="bookworm")
    parser.add_argument("--force", action="store_true", help="Rebuild even if the tag exists.")
    args = parser.parse_args()
    spec = PlatformImageSpec(target=args.target, release=args.release)
    print(build_platform_image(spec, force=args.force, log=lambda msg: print(msg, file=sys.stderr)))


if __name__ == "__main__":
    main()
