"""Configuration of the SWE-bench suite: where instances come from and how their testbeds are rebuilt."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lumotree.tasks.rootfs import cache_dir

SOURCES = ("prebuilt", "git", "release")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def default_dataset() -> Path | None:
    """The shared astropy instances beside the repository root, when that folder exists."""
    repo_root = Path(__file__).resolve().parents[2]
    base = Path(os.environ.get("LUMOTREE_SHARED_DATA", repo_root.parent / "shared" / "data"))
    path = base / "swebench" / "astropy.jsonl"
    return path if path.is_file() else None


@dataclass(frozen=True)
class SwebenchConfig:
    """How the ``swebench-astropy`` suite loads instances and rebuilds their environments."""

    # A .jsonl/.json/.parquet file, or a dataset name on the hub (only used when ``hub`` is on).
    dataset: str | None = None
    # Dataset split when loading by name through ``datasets``.
    split: str = "test"
    # Load datasets by name through the hub; off by default because offline machines cannot reach it.
    hub: bool = field(default_factory=lambda: _env_flag("LUMOTREE_SWEBENCH_HUB"))
    # Network for sources: official prebuilt images and ``git clone``; offline only releases are used.
    network: bool = field(default_factory=lambda: _env_flag("LUMOTREE_SWEBENCH_NETWORK"))
    # Preferred order of sources of the base state; sources needing the network are skipped without it.
    sources: tuple[str, ...] = ("prebuilt", "git", "release")
    # Clone URL of a repository (``{repo}`` is ``owner/name``), used by the ``git`` source.
    git_url: str = "https://github.com/{repo}.git"
    # Only instances of this repository are served by this suite.
    repo: str = "astropy/astropy"
    # Package index project holding the repository's source releases.
    project: str = "astropy"
    # Simple-API URL of the package index; None: pip's default index.
    index_url: str | None = field(default_factory=lambda: os.environ.get("LUMOTREE_INDEX_URL") or None)
    # How many candidate releases (those that pass the cheap static checks) are built and tried per instance.
    max_candidates: int = 4
    # Releases further than this from the instance's creation date are not considered.
    window_days: int = 550
    # Cache root for sdists, wheelhouses, index metadata and resolution records.
    cache: Path = field(default_factory=lambda: cache_dir() / "swebench")
    # Seconds allowed to build one testbed (compiling the C extensions on two cores takes about a minute).
    build_timeout: float = 1800.0
    # Seconds allowed for one test run during validation.
    test_timeout: float = 900.0

    def __post_init__(self) -> None:
        assert all(s in SOURCES for s in self.sources), f"unknown source in {self.sources}; known: {SOURCES}"
        assert self.max_candidates >= 1 and self.window_days > 0

    def usable_sources(self) -> tuple[str, ...]:
        """The configured sources this machine can use (release reconstruction needs only the index)."""
        return tuple(s for s in self.sources if self.network or s == "release")
