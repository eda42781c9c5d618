"""What the MTP, EAGLE and LumoTree arms share: feeding a feature drafter from prefill and verify feedback.

After a prefill chunk, rows s .. e-1 of the prompt go to the drafter with the token after each (the next
prompt token, or the first sampled token at the end of the prompt). After a verify step, the accepted path
(root first) goes with the next accepted token of each row and the bonus token last. The drafter then holds
every committed row when ``propose`` asks it for drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lumotree.serving.arms.base import PrefillFeedback, StepFeedback
from lumotree.serving.drafters.feature import Drafts, FeatureDrafter
from lumotree.serving.request import Request
from lumotree.serving.tree import TreeDescriptor
from lumotree.serving.upload import to_device


class ChainedArm:
    """Base of the speculative arms: subclasses build the drafter (``make_drafter``) and shape the trees."""

    name = "chained"
    drafter: FeatureDrafter

    def __init__(self, depth: int, draft_vocab: int = 0) -> None:
        """``draft_vocab``: draft among the first N token ids only (0 = all; see ``restrict_vocab``)."""
        if int(draft_vocab) < 0:
            raise ValueError(f"draft_vocab must be >= 0 (0 = the whole vocabulary), got {draft_vocab}")
        self.depth = depth
        self.draft_vocab = int(draft_vocab)

    def max_tree_rows(self) -> int:
        return self.depth + 1

    def start(self, engine: Any) -> None:
        self.device = engine.device
        self.drafter = self.make_drafter(engine)
        # Drafting replays as CUDA graphs through the runner's per-shape graphs where the engine uses them.
        self.drafter.graphs = engine.runner.fn_graphs
        self.drafter.table_width = engine.runner.config.max_blocks_per_seq
        vocab = engine.model.config.vocab_size
        if 0 < self.draft_vocab < vocab:
            # Without a frequency table the lowest ids stand in for the most frequent tokens (BPE merges
            # are numbered in order of frequency).
            ids = torch.arange(self.draft_vocab, device=engine.device)
            self.drafter.restrict_vocab(engine.model.lm_head.weight, ids)

    def make_drafter(self, engine: Any) -> FeatureDrafter:
        raise NotImplementedError

    def on_prefill(self, feedback: PrefillFeedback) -> None:
        for i, r in enumerate(feedback.requests):
            lo, hi = feedback.row_offsets[i], feedback.row_offsets[i + 1]
            s = feedback.start_positions[i]
            e = s + hi - lo
            nxt = r.prompt_ids[s + 1 : e]
            if e < len(r.prompt_ids):
                nxt.append(r.prompt_ids[e])
            else:
                first = feedback.first_tokens[i]
                assert first is not None, "a completed prompt has its first token"
                nxt.append(first)
            self.drafter.feed(r.req_id, s, nxt, feedback.hidden[lo:hi])
        self.drafter.absorb([r.req_id for r in feedback.requests])

    def on_step(self, feedback: StepFeedback) -> None:
        for i, r in enumerate(feedback.requests):
            if r.finished:
                continue
            dev = feedback.accepted_device
            if dev is None:
                rows = to_device(feedback.accepted[i], feedback.hidden.device)
            else:  # the walk's rows are root first, -1 padded: no upload
                rows = dev[i, : len(feedback.accepted[i])]
            rows = rows + feedback.row_offsets[i]
            nxt = feedback.accepted_tokens[i][1:] + [feedback.bonus[i]]
            self.drafter.feed(r.req_id, feedback.context_lens_before[i], nxt, feedback.hidden[rows])

    def drafts(self, requests: Sequence[Request]) -> Drafts:
        return self.drafter.draft([r.req_id for r in requests], [r.context_len for r in requests])

    def propose(self, requests: Sequence[Request]) -> list[TreeDescriptor]:
        """Chains (MTP-k, EAGLE): the top-1 token of every depth, verified as a fanout-1 tree."""
        from lumotree.serving.tree_builder import build_chain

        toks = self.drafts(requests).tokens[:, :, 0]
        return [
            build_chain(r.pending_token, toks[i], r.context_len, self.device) for i, r in enumerate(requests)
        ]

    def release(self, request: Request) -> None:
        self.drafter.release(request.req_id)

    def reset_shared(self) -> None:
        pass  # the feature drafters hold per-request state only
