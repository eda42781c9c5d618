"""Validate instances: the gold patch must resolve and the empty patch must not, in the suite's image."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from lumotree.tasks.api import Instance, Suite
from lumotree.tasks.grading import grade


@dataclass(frozen=True)
class Validation:
    """One instance's validation row (the keys of ``lumotree tasks validate --json``)."""

    instance_id: str
    env_ok: bool  # the image was built (or found) and a sandbox started
    gold_resolved: bool
    empty_resolved: bool
    valid: bool  # gold resolves and empty does not
    reason: str  # why it is not valid; "" when valid

    def __post_init__(self) -> None:
        assert self.valid == (self.env_ok and self.gold_resolved and not self.empty_resolved), self
        assert self.valid == (self.reason == ""), self


def validate_instance(suite: Suite, instance: Instance, *, build: bool = True) -> Validation:
    iid = instance.instance_id
    try:
        image = suite.image_for(instance, build=build)
    except Exception as exc:  # noqa: BLE001 - an unbuildable environment is a finding, not a crash
        return Validation(iid, False, False, False, False, f"environment: {type(exc).__name__}: {exc}"[:2000])
    cmd = suite.test_command(instance)
    gold = grade(instance, instance.patch, image, test_command=cmd)
    if gold.reason.startswith("environment:"):
        return Validation(iid, False, False, False, False, gold.reason)
    empty = grade(instance, "", image, test_command=cmd)
    reasons = []
    if not gold.resolved:
        reasons.append(f"gold patch does not resolve: {gold.reason}")
    if empty.resolved:
        reasons.append("empty patch resolves: the tests do not detect the bug")
    valid = not reasons
    return Validation(iid, True, gold.resolved, empty.resolved, valid, "; ".join(reasons))


def validate(
    suite: Suite,
    instances: list[Instance],
    *,
    build: bool = True,
    progress: Callable[[Validation], Any] | None = None,
) -> dict[str, Any]:
    """``{"instances": [row...], "valid_count": n}`` for ``instances`` of ``suite``, one at a time."""
    rows = []
    for inst in instances:
        row = validate_instance(suite, inst, build=build)
        rows.append(row)
        if progress is not None:
            progress(row)
    return {"instances": [asdict(r) for r in rows], "valid_count": sum(r.valid for r in rows)}
