"""EAGLE: a feature-level draft head on the target's hidden states, a top-1 chain of 7 head steps.

Counting as SGLang does (``--speculative-num-steps 7 --speculative-eagle-topk 1
--speculative-num-draft-tokens 8``): 7 head passes propose 7 draft tokens; with the root (the pending token
the previous step drew from the target) the verify chain has 8 tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lumotree.serving.arms.chained import ChainedArm
from lumotree.serving.drafters.eagle import EAGLE_DIR, EagleLayer, eagle_drafter
from lumotree.serving.drafters.feature import FeatureDrafter


class EagleArm(ChainedArm):
    name = "eagle"

    def __init__(
        self,
        eagle_path: str | Path | None = None,
        eagle_steps: int = 7,
        eagle_head: EagleLayer | None = None,
        draft_vocab: int = 0,
        **_options: Any,
    ) -> None:
        """``eagle_path``: the head's folder (default ``<model>/eagle``); ``eagle_head``: a built head."""
        super().__init__(int(eagle_steps), draft_vocab)
        self.eagle_path = eagle_path
        self.eagle_head = eagle_head

    def make_drafter(self, engine: Any) -> FeatureDrafter:
        path: Any = self.eagle_head if self.eagle_head is not None else self.eagle_path
        if path is None:
            from lumotree.serving.builtin import resolve_model

            path = resolve_model(engine.config.model) / EAGLE_DIR
        cc = engine.caches.cache_config
        return eagle_drafter(  # type: ignore[no-any-return]
            engine.model, path, cc.max_seqs, cc.num_blocks, cc.block_size, steps=self.depth
        )
