"""MTP-k: the model's own MTP layer chained k times (k = 1, 3, 5, 7; default 5), verified as a chain."""

from __future__ import annotations

from typing import Any

from lumotree.serving.arms.chained import ChainedArm
from lumotree.serving.drafters.feature import ChainConfig, FeatureDrafter
from lumotree.serving.drafters.mtp import mtp_drafter


class MTPArm(ChainedArm):
    name = "mtp"

    def __init__(self, mtp_k: int = 5, draft_vocab: int = 0, **_options: Any) -> None:
        if not 1 <= int(mtp_k) <= 16:
            raise ValueError(f"mtp_k must be in 1..16, got {mtp_k}")
        super().__init__(int(mtp_k), draft_vocab)

    def make_drafter(self, engine: Any) -> FeatureDrafter:
        return mtp_drafter(engine.model, engine.caches, ChainConfig(self.depth, 1))
