"""LumoTree: MTP top-3 per depth plus suffix drafting, spent on a tree that the one verifier checks.

``tree="hydra27"``: the paper's fixed 32-row shape (MTP spine + two runner-ups per depth 1-5, suffix tail at
depths 6-11, suffix rescue chains under the root's runner-ups; rows left without a candidate stay padded and
never enter sampling). ``tree="adaptive"``: the 32 rows go to the candidates of highest path confidence (MTP
probabilities and suffix vote shares), see ``tree_builder.build_adaptive``.

Drafting reads the MTP candidates on the host once per step (the tree shape depends on them and on suffix
matches); verification, selection and commit then read the descriptor without host round trips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lumotree.serving.arms.base import PrefillFeedback, StepFeedback
from lumotree.serving.arms.chained import ChainedArm
from lumotree.serving.drafters.feature import ChainConfig, FeatureDrafter
from lumotree.serving.drafters.mtp import mtp_drafter
from lumotree.serving.drafters.suffix import SuffixCache, SuffixConfig, SuffixDrafter
from lumotree.serving.request import Request
from lumotree.serving.tree import TreeDescriptor, hydra27
from lumotree.serving.tree_builder import AdaptiveConfig, build_adaptive, build_fixed, look_ahead_fixed
from lumotree.serving.upload import Readback, Staging

TREES = ("hydra27", "adaptive")


class LumoTreeArm(ChainedArm):
    name = "lumotree"

    def __init__(
        self, tree: str = "hydra27", mtp_k: int = 5, topk: int = 3, draft_vocab: int = 0, **_options: Any
    ) -> None:
        if tree not in TREES:
            raise ValueError(f"unknown tree {tree!r}; choose one of {', '.join(TREES)}")
        super().__init__(int(mtp_k), draft_vocab)
        self.tree = tree
        self.topk = topk
        self.adaptive = AdaptiveConfig()
        self.suffix_cache = SuffixCache(SuffixConfig())
        self.suffix: dict[str, SuffixDrafter] = {}
        self.verifier: Any = None
        """The engine's verifier, to build a fixed tree's batch while its drafts are computed."""
        self.staging = Staging()
        self.readback = Readback()

    def max_tree_rows(self) -> int:
        return hydra27().num_rows if self.tree == "hydra27" else self.adaptive.budget

    def start(self, engine: Any) -> None:
        super().start(engine)
        self.verifier = getattr(engine, "verifier", None)

    def make_drafter(self, engine: Any) -> FeatureDrafter:
        return mtp_drafter(engine.model, engine.caches, ChainConfig(self.depth, self.topk))

    def on_prefill(self, feedback: PrefillFeedback) -> None:
        super().on_prefill(feedback)
        for r in feedback.requests:
            if r.req_id not in self.suffix:
                self.suffix[r.req_id] = SuffixDrafter(r.prompt_ids, cache=self.suffix_cache)

    def on_step(self, feedback: StepFeedback) -> None:
        super().on_step(feedback)
        for r, toks in zip(feedback.requests, feedback.accepted_tokens, strict=True):
            self.suffix[r.req_id].extend(toks)  # committed: the root and the accepted drafts

    def propose(self, requests: Sequence[Request]) -> list[TreeDescriptor]:
        d = self.drafts(requests)
        self.readback.start(d.tokens)  # queued ahead of the staging copies below: they do not delay it
        staged = None
        if self.tree == "hydra27":  # host work while the drafter runs
            if self.verifier is not None:
                shape, padded = hydra27().parents, hydra27().padded_rows
                self.verifier.prepare([r.req_id for r in requests], [r.context_len for r in requests],
                                      [shape] * len(requests), [padded] * len(requests))  # fmt: skip
                staged = self.verifier.staged_input()
            for r in requests:
                look_ahead_fixed(hydra27(), r.pending_token, self.depth, self.topk, self.suffix[r.req_id])
        tokens = self.readback.tolist()  # the drafting step's one host read (the fixed tree needs no probs)
        probs = d.probs.tolist() if self.tree == "adaptive" else [None] * len(requests)
        out = []
        n = hydra27().num_rows
        for i, (r, tk, pr) in enumerate(zip(requests, tokens, probs, strict=True)):
            sfx = self.suffix[r.req_id]
            if self.tree == "hydra27":
                # ids straight into the verify graph's input: one copy after the drafts reach the host
                dst = None if staged is None else staged[i * n : (i + 1) * n]
                out.append(build_fixed(hydra27(), r.pending_token, tk, sfx, r.context_len, self.device,
                                       dst, self.staging))  # fmt: skip
            else:
                out.append(
                    build_adaptive(r.pending_token, tk, pr, sfx, r.context_len, self.adaptive, self.device)
                )
        return out

    def release(self, request: Request) -> None:
        super().release(request)
        sfx = self.suffix.pop(request.req_id, None)
        if sfx is not None:
            sfx.finish()

    def reset_shared(self) -> None:
        assert not self.suffix, "the cross-request cache is reset between requests only"
        self.suffix_cache = SuffixCache(self.suffix_cache.config)
