"""Source releases of a project on the package index: their dates, their sdists, and candidates per instance.

Release dates come from the index's own metadata (the simple API's JSON form, PEP 691/700 upload times),
cached so a later run works without the network. Sdists are fetched with ``pip download`` under a clean
environment: the host's pip configuration (find-links, constraints, extra indexes) must never choose what we
build.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from packaging.version import InvalidVersion, Version

from lumotree.tasks.swebench.config import SwebenchConfig


@dataclass(frozen=True)
class Release:
    """One final release with a source distribution."""

    version: str  # as on the index, e.g. "5.1.1"
    uploaded: datetime  # upload time of its sdist (UTC)
    filename: str  # the sdist's file name
    url: str = ""  # where the index serves it
    sha256: str = ""  # the index's digest of it, checked after download
    requires_python: str = ""  # the release's Python requirement as the index lists it ("" when none)

    def __post_init__(self) -> None:
        assert self.uploaded.tzinfo is not None, "upload times are compared across zones: keep them aware"


def clean_pip_env() -> dict[str, str]:
    """The host environment without any pip configuration (variables or files)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def index_url(config: SwebenchConfig) -> str:
    if config.index_url:
        return config.index_url.rstrip("/")
    from pip._internal.models.index import PyPI

    return PyPI.simple_url.rstrip("/")


def parse_time(text: str) -> datetime:
    """An ISO time (``Z`` suffix allowed) as an aware UTC datetime."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def list_releases(config: SwebenchConfig) -> list[Release]:
    """Final, non-yanked releases of ``config.project`` with an sdist, oldest first (cached metadata)."""
    cache = config.cache / "index" / f"{config.project}.json"
    data = None
    try:
        req = urllib.request.Request(
            f"{index_url(config)}/{config.project}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    except OSError as exc:
        if not cache.is_file():
            raise RuntimeError(
                f"cannot read the release list of {config.project!r} from the index: {exc}"
            ) from exc
        data = json.loads(cache.read_text())
    releases: dict[str, Release] = {}
    prefix = f"{config.project}-"
    for f in data.get("files", []):
        name = f.get("filename", "")
        if not name.endswith(".tar.gz") or f.get("yanked") or not f.get("upload-time"):
            continue
        ver = name[len(prefix) : -len(".tar.gz")] if name.lower().startswith(prefix) else ""
        try:
            parsed = Version(ver)
        except InvalidVersion:
            continue
        if parsed.is_prerelease or parsed.is_devrelease:
            continue
        url = urllib.parse.urljoin(f"{index_url(config)}/{config.project}/", f.get("url", ""))
        sha = f.get("hashes", {}).get("sha256", "")
        pyreq = f.get("requires-python") or ""
        releases[ver] = Release(ver, parse_time(f["upload-time"]), name, url, sha, pyreq)
    return sorted(releases.values(), key=lambda r: r.uploaded)


def supports_python(release: Release, python: str) -> bool:
    """Whether the release declares support for ``python`` (releases declaring nothing are given a try)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return not release.requires_python or SpecifierSet(release.requires_python).contains(python + ".0")
    except InvalidSpecifier:
        return True


def major_minor(version: str) -> tuple[int, int]:
    """``"5.1"`` / ``"v5.3"`` / ``"4.3.post1"`` -> (5, 1); (0, 0) when unparsable."""
    try:
        rel = Version(version.lstrip("v")).release
    except InvalidVersion:
        return (0, 0)
    return (rel[0], rel[1] if len(rel) > 1 else 0)


def candidate_releases(
    releases: list[Release], version: str, created_at: str, window_days: int
) -> list[Release]:
    """Releases that may hold an instance's base state, nearest to its creation date first.

    The repository's version at the base commit is a lower bound (a release older than it cannot contain the
    code the tests exercise); releases before the date likely still have the bug (patch forward), releases
    after it may have the fix (patch in reverse). Distance in time is the only ordering: which one is right is
    decided by trying, never assumed.
    """
    created = parse_time(created_at)
    floor = major_minor(version)
    keep = [
        r
        for r in releases
        if major_minor(r.version) >= floor and abs((r.uploaded - created).days) <= window_days
    ]
    return sorted(keep, key=lambda r: (abs((r.uploaded - created).total_seconds()), r.version))


def fetch_sdist(config: SwebenchConfig, release: Release) -> Path:
    """The release's sdist in the cache, downloaded once from the index and checked against its digest.

    The file is fetched as published (``pip download`` of an sdist would run its build backend to read the
    metadata, which for a compiled project means building numpy from source first).
    """
    dest = config.cache / "sdists"
    path = dest / release.filename
    if path.is_file():
        return path
    assert release.url, f"{release.filename}: the index listed no URL"
    dest.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(release.url, timeout=300) as resp:
        data = resp.read()
    digest = hashlib.sha256(data).hexdigest()
    if release.sha256 and digest != release.sha256:
        raise RuntimeError(f"{release.filename}: sha256 {digest} differs from the index's {release.sha256}")
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.rename(path)
    return path


def extract_sdist(sdist: Path, dest: Path) -> Path:
    """Unpack ``sdist`` into ``dest`` and return the source tree (the archive's single top folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    assert len(tops) == 1, f"{sdist.name}: expected one top folder, got {[p.name for p in tops]}"
    return tops[0]
