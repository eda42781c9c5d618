"""Plain autoregressive decoding: every tree is a bare root, so the engine uses the fast decode mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lumotree.serving.arms.base import PrefillFeedback, StepFeedback
from lumotree.serving.request import Request
from lumotree.serving.tree import TreeDescriptor


class ARArm:
    """No drafter: one token per step, sampled by the same walk every arm uses."""

    name = "ar"

    def __init__(self, **_options: Any) -> None:
        pass  # AR has no knobs; arm options of other arms are ignored

    def max_tree_rows(self) -> int:
        return 1

    def start(self, engine: Any) -> None:
        pass

    def on_prefill(self, feedback: PrefillFeedback) -> None:
        pass

    def propose(self, requests: Sequence[Request]) -> list[TreeDescriptor]:
        return [TreeDescriptor.root(r.pending_token, r.context_len) for r in requests]

    def on_step(self, feedback: StepFeedback) -> None:
        pass

    def release(self, request: Request) -> None:
        pass

    def reset_shared(self) -> None:
        pass
