"""Decoding arms: ``make_arm(name, **options)`` builds one; speculative arms live in their own modules."""

from __future__ import annotations

import importlib
from typing import Any

from lumotree.serving.arms.base import Arm, DraftTree, PrefillFeedback, StepFeedback

# name -> "module:factory"; speculative arms register here as they land (imported lazily).
ARMS: dict[str, str] = {
    "ar": "lumotree.serving.arms.ar:ARArm",
    "mtp": "lumotree.serving.arms.mtp:MTPArm",
    "eagle": "lumotree.serving.arms.eagle:EagleArm",
    "lumotree": "lumotree.serving.arms.lumotree:LumoTreeArm",
}


def make_arm(name: str, **options: Any) -> Arm:
    """Build an arm by name; options (``mtp_k``, ``tree``, ``eagle_path``...) go to its factory."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; choose one of {', '.join(ARMS)}")
    module, factory = ARMS[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise ValueError(f"arm {name!r} is not available in this build ({module} is missing)") from e
        raise
    arm = getattr(mod, factory)(**options)
    assert isinstance(arm, Arm), f"{module}.{factory} does not implement the Arm protocol"
    return arm


__all__ = ["ARMS", "Arm", "DraftTree", "PrefillFeedback", "StepFeedback", "make_arm"]
