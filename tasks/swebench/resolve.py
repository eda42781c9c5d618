"""Finding an instance's base state offline: candidate releases, patch directions, proof by validation.

The procedure, the same for every instance of the schema (no table of instance ids anywhere):
1. list the project's releases from the index; keep those not older than the instance's version and near its
   creation date, nearest first;
2. reject, without building, every release the gold and test patches apply to neither forward nor in reverse,
   or that lacks a test the instance names;
3. order the survivors by distance, one release per minor series before a second of the same series (series
   share build behaviour, so a broken series costs one build, not five);
4. build each (a testbed per release, shared by every instance that picks it), take the reverse-applying
   patches out, and validate: with the empty patch every FAIL_TO_PASS fails and every PASS_TO_PASS passes;
   with the gold patch the instance is resolved. The first candidate that validates is the instance's
   environment. The decision is recorded in the cache (keyed by the instance's content), so a second run goes
   straight to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lumotree.tasks.api import Instance, grade
from lumotree.tasks.rootfs import build_lock, content_hash, image_exists
from lumotree.tasks.swebench.config import SwebenchConfig
from lumotree.tasks.swebench.images import git_image, instance_image, prebuilt_image, testbed_image
from lumotree.tasks.swebench.releases import (
    Release,
    candidate_releases,
    extract_sdist,
    fetch_sdist,
    list_releases,
    major_minor,
    supports_python,
)
from lumotree.tasks.swebench.source import check_release
from lumotree.tasks.swebench.specs import era_for, test_command

PROCEDURE = 1  # bump when the procedure changes: recorded decisions are then made again


class ResolveError(RuntimeError):
    """No candidate release validated; the message lists every candidate and why it was rejected."""


@dataclass
class Attempt:
    release: str
    direction: str  # "F", "R" or "" when rejected before building
    outcome: str  # "valid", "static", "build", "invalid"
    reason: str = ""


@dataclass
class Resolution:
    """The environment chosen for one instance and how it was found."""

    instance_id: str
    key: str  # content hash of what the decision depends on
    source: str  # "prebuilt", "git" or "release"
    release: str  # the release (source "release"), the base commit ("git") or the official image ("prebuilt")
    direction: str  # "F": gold applied forward (the release has the bug); "R": reversed; "" other sources
    era: str
    image: str
    attempts: list[Attempt] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.direction in ("F", "R", "") and self.image
        assert (self.source == "release") == (self.direction != ""), "only releases have a direction"


def instance_key(instance: Instance) -> str:
    fields = ("instance_id", "patch", "test_patch", "version", "created_at", "FAIL_TO_PASS", "PASS_TO_PASS")
    return content_hash(PROCEDURE, {f: getattr(instance, f) for f in fields}, test_command(instance))


def _record_path(config: SwebenchConfig, instance: Instance) -> Path:
    return config.cache / "resolutions" / f"{instance.instance_id}-{instance_key(instance)}.json"


def recorded(config: SwebenchConfig, instance: Instance) -> Resolution | None:
    """The recorded decision for this instance, when its image still exists."""
    path = _record_path(config, instance)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["attempts"] = [Attempt(**a) for a in data.get("attempts", [])]
    res = Resolution(**data)
    return res if image_exists(res.image) else None


def _series_interleave(releases: list[Release]) -> list[Release]:
    ranks: dict[tuple[int, int], int] = {}
    keyed = []
    for i, r in enumerate(releases):
        s = major_minor(r.version)
        ranks[s] = ranks.get(s, -1) + 1
        keyed.append((ranks[s], i, r))
    return [r for _, _, r in sorted(keyed, key=lambda t: (t[0], t[1]))]


def _source_tree(config: SwebenchConfig, release: Release) -> Path:
    folder = config.cache / "src" / release.version
    with build_lock(f"swebench-src-{release.version}"):
        if not (folder / ".complete").is_file():
            if folder.exists():
                import shutil

                shutil.rmtree(folder)
            extract_sdist(fetch_sdist(config, release), folder / "tree")
            (folder / ".complete").write_text("")
    return next(p for p in (folder / "tree").iterdir() if p.is_dir())


def _failed_builds(config: SwebenchConfig) -> Path:
    return config.cache / "failed-builds.json"


def _build_failure(config: SwebenchConfig, key: str) -> str | None:
    path = _failed_builds(config)
    return json.loads(path.read_text()).get(key) if path.is_file() else None


def _remember_build_failure(config: SwebenchConfig, key: str, reason: str) -> None:
    path = _failed_builds(config)
    with build_lock("swebench-failed-builds"):
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[key] = reason
        path.write_text(json.dumps(data, indent=1, sort_keys=True))


def check_validity(instance: Instance, image: str, config: SwebenchConfig) -> str:
    """ "" when the image is a sound environment for the instance, else the reason it is not."""
    cmd = test_command(instance)
    from lumotree.tasks.sandbox import SandboxConfig

    sandbox = SandboxConfig(timeout=config.test_timeout)
    empty = grade(instance, "", image, test_command=cmd, config=sandbox)
    if not empty.patch_applied:
        return f"the test patch does not apply to the base state: {empty.reason}"
    f2p_passing = empty.fail_to_pass.get("success", [])
    if f2p_passing:
        return f"{len(f2p_passing)} FAIL_TO_PASS test(s) already pass without the fix, e.g. {f2p_passing[0]}"
    p2p_failing = empty.pass_to_pass.get("failure", [])
    if p2p_failing:
        return f"{len(p2p_failing)} PASS_TO_PASS test(s) fail before the fix, e.g. {p2p_failing[0]}"
    gold = grade(instance, instance.patch, image, test_command=cmd, config=sandbox)
    if not gold.resolved:
        return f"the gold patch does not resolve it: {gold.reason}"
    return ""


def resolve(instance: Instance, config: SwebenchConfig, *, log: Any = None) -> Resolution:
    """The validated environment of ``instance`` (recorded decision, else the procedure above)."""
    done = recorded(config, instance)
    if done is not None:
        return done
    say = log or (lambda _msg: None)
    attempts: list[Attempt] = []
    for source in config.usable_sources():
        if source == "release":
            return _from_releases(instance, config, attempts, say, log)
        res = _from_network(instance, config, source, attempts, log)
        if res is not None:
            return _save(config, instance, res, attempts)
    raise ResolveError(f"{instance.instance_id}: no usable source validated: {_summary(attempts)}")


def _save(config: SwebenchConfig, instance: Instance, res: Resolution, attempts: list[Attempt]) -> Resolution:
    res.attempts = attempts
    path = _record_path(config, instance)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(res), indent=1))
    return res


def _summary(attempts: list[Attempt]) -> str:
    tried = [a for a in attempts if a.outcome != "static"]
    return "; ".join(
        f"{a.release} {a.direction}: {a.outcome}: {a.reason[:300]}".replace("  ", " ") for a in tried
    )


def _from_network(
    instance: Instance, config: SwebenchConfig, source: str, attempts: list[Attempt], log: Any
) -> Resolution | None:
    """The official image, or a clone at the base commit; None (with the reason recorded) when unusable."""
    era = era_for(instance.version.lstrip("v") or "0")
    try:
        if source == "prebuilt":
            if not instance.image:
                attempts.append(Attempt("prebuilt", "", "build", "the instance names no image"))
                return None
            image, what = prebuilt_image(instance.image, log=log), instance.image
        else:
            image = git_image(config, era, instance.repo, instance.base_commit, log=log)
            what = instance.base_commit
    except Exception as exc:  # noqa: BLE001 - an unreachable registry or host: fall through to the next source
        attempts.append(Attempt(source, "", "build", f"{type(exc).__name__}: {str(exc)[-300:]}"))
        return None
    why = check_validity(instance, image, config)
    attempts.append(Attempt(source, "", "valid" if not why else "invalid", why))
    return (
        None
        if why
        else Resolution(instance.instance_id, instance_key(instance), source, what, "", era.name, image)
    )


def _from_releases(
    instance: Instance, config: SwebenchConfig, attempts: list[Attempt], say: Any, log: Any
) -> Resolution:
    releases = candidate_releases(
        list_releases(config), instance.version, instance.created_at, config.window_days
    )
    survivors = []
    for rel in releases:
        if not supports_python(rel, era_for(rel.version).python):
            py = era_for(rel.version).python
            attempts.append(
                Attempt(rel.version, "", "static", f"requires Python {rel.requires_python}, not {py}")
            )
            continue
        directions, why = check_release(instance, _source_tree(config, rel))
        if directions is None:
            attempts.append(Attempt(rel.version, "", "static", why))
        else:
            survivors.append((rel, directions))
    order = _series_interleave([r for r, _ in survivors])
    by_version = dict((r.version, d) for r, d in survivors)
    for rel in order[: config.max_candidates]:
        directions = by_version[rel.version]
        era = era_for(rel.version)
        label = directions.label()
        build_key = content_hash(rel.filename, rel.sha256, era.name, era.pins)
        failure = _build_failure(config, build_key)
        if failure:
            attempts.append(Attempt(rel.version, label, "build", failure))
            continue
        say(f"{instance.instance_id}: trying {rel.version} ({label}, {era.name})")
        try:
            testbed = testbed_image(config, era, rel.version, fetch_sdist(config, rel), log=log)
        except RuntimeError as exc:
            reason = f"release {rel.version} does not build in {era.name}: {str(exc)[-600:]}"
            _remember_build_failure(config, build_key, reason)
            attempts.append(Attempt(rel.version, label, "build", reason))
            continue
        patches = directions.reversed_patches(instance)
        image = instance_image(testbed, era, patches, f"{instance.instance_id} on {rel.version}", log=log)
        why = check_validity(instance, image, config)
        attempts.append(Attempt(rel.version, label, "valid" if not why else "invalid", why))
        if why:
            say(f"{instance.instance_id}: {rel.version} {label} rejected: {why}")
            continue
        res = Resolution(
            instance.instance_id, instance_key(instance), "release", rel.version, label, era.name, image
        )
        return _save(config, instance, res, attempts)
    tried = [a for a in attempts if a.outcome != "static"]
    summary = _summary(attempts)
    statics = sum(a.outcome == "static" for a in attempts)
    raise ResolveError(
        f"{instance.instance_id}: no release validated ({len(releases)} near its date, {statics} rejected by "
        f"the static checks, {len(order)} passed them, {len(tried)} tried): {summary or 'nothing to try'}"
    )
