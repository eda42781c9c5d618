"""The one verifier every arm shares: descriptors in, one tree-mode target forward, exact walk, commit.

``verify`` packs the requests' ``TreeDescriptor``s into a tree-mode ``ForwardBatch`` (rows in descriptor
order: root, spine, the rest; slot of row j = slot of logical position context_len + j, so an accepted spine
prefix is already at its native slots), runs the model, and returns the logits of every row with the
model's replay record. ``select`` runs the sampler's walk over the same descriptors; ``commit`` hands the
walk's accepted rows straight to ``model.commit``. Token ids, logits, the accepted path and the commit stay
on the device: the only host values are tree shapes and lengths, known before the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batch import ForwardBatch
from .cache import StateCaches
from .sampler import Sampler, SamplingParams, TreeBatch
from .sampling.walk import WalkResult
from .tree import TreeDescriptor


@dataclass
class VerifyOutput:
    """What one verification forward leaves for selection and commit."""

    descriptors: list[TreeDescriptor]
    batch: ForwardBatch
    logits: torch.Tensor
    """[R, V] fp32 target logits of every row (rows of request s: batch.cu_seqlens[s] ..)."""
    hidden: torch.Tensor
    """[R, H] final-norm hidden states (the drafter's next input is the accepted leaf's row)."""
    record: Any
    """The model's TreeRecord: replay operands of every GDN layer."""

    def tree_batch(self) -> TreeBatch:
        """The walk's view of the same trees: the forward's own token ids, shape and masks from caches."""
        return TreeBatch.from_topology(
            self.batch.input_ids,
            tuple(d.parents for d in self.descriptors),
            tuple(d.active_mask for d in self.descriptors),
        )


def tree_skeleton(
    caches: StateCaches,
    seq_ids: Sequence[int | str],
    prefix_lens: Sequence[int],
    parents: Sequence[Sequence[int]],
    padded: Sequence[Sequence[int]] | None = None,
) -> ForwardBatch:
    """The tree-mode batch of these shapes with zero token ids: slots, positions and tables from the
    shared builder (host shapes only). The tokens go in afterwards from the device, so the drafter's
    tokens never travel to the host for packing. ``padded``: each tree's rows never sampled."""
    assert len(seq_ids) == len(prefix_lens) == len(parents) and seq_ids
    tokens = [[0] * len(p) for p in parents]
    return caches.make_batch(
        "tree", list(seq_ids), tokens, list(prefix_lens), [list(p) for p in parents], padded=padded
    )


def _shape_key(
    seq_ids: Sequence[int | str], prefix_lens: Sequence[int], parents: Sequence[Sequence[int]],
    padded: Sequence[Sequence[int]] | None,
) -> tuple[Any, ...]:  # fmt: skip
    pad = tuple(tuple(p) for p in padded) if padded is not None else tuple(() for _ in parents)
    return tuple(seq_ids), tuple(prefix_lens), tuple(tuple(p) for p in parents), pad


def tree_forward_batch(
    caches: StateCaches,
    seq_ids: Sequence[int | str],
    descriptors: Sequence[TreeDescriptor],
    skeleton: ForwardBatch | None = None,
) -> ForwardBatch:
    """The tree-mode batch of these requests; each descriptor's prefix_len is its request's context length
    (``skeleton``: the same shapes' ``tree_skeleton``, built ahead)."""
    assert len(seq_ids) == len(descriptors) and descriptors
    if skeleton is None:
        skeleton = tree_skeleton(
            caches, seq_ids, [d.prefix_len for d in descriptors], [d.parents for d in descriptors],
            [d.topology.padded_rows for d in descriptors],
        )  # fmt: skip
    batch = skeleton
    dev = batch.input_ids.device
    ids = [d.token_ids.to(dev) for d in descriptors]
    batch.input_ids = ids[0] if len(ids) == 1 else torch.cat(ids)  # one tree: no copy kernel
    assert batch.positions.shape[0] == batch.input_ids.shape[0]
    return batch


class Verifier:
    """Verify, select and commit draft trees for a batch of requests on one model."""

    def __init__(
        self, model: Any, caches: StateCaches, sampler: Sampler | None = None, runner: Any | None = None
    ) -> None:
        self.model = model
        self.caches = caches
        self.sampler = sampler or Sampler(model.config.vocab_size, caches.device)
        self.runner = runner
        """The engine's ``ModelRunner``: tree forward and commit replay as CUDA graphs through it."""
        self._ahead: tuple[Any, ForwardBatch] | None = None
        """(shape key, batch) of ``prepare``."""

    def prepare(
        self, seq_ids: Sequence[int | str], prefix_lens: Sequence[int], parents: Sequence[Sequence[int]],
        padded: Sequence[Sequence[int]] | None = None,
    ) -> None:  # fmt: skip
        """Build the batch of trees whose shapes are known before their tokens (a fixed tree), while the
        drafter still runs on the device; the next ``verify`` of exactly these shapes (and padded rows,
        ``TreeTopology.padded_rows``) uses it."""
        skeleton = tree_skeleton(self.caches, seq_ids, prefix_lens, parents, padded)
        self._ahead = (_shape_key(seq_ids, prefix_lens, parents, padded), skeleton)
        if self.runner is not None:
            self.runner.stage_tree(skeleton)

    def staged_input(self) -> torch.Tensor | None:
        """[R] the token buffer the prepared batch's verify graph reads, when ``prepare`` could stage one:
        a drafter that writes its tokens there saves the step a copy."""
        if self._ahead is None or self.runner is None:
            return None
        return self.runner.staged_input(self._ahead[1])  # type: ignore[no-any-return]

    def verify(self, seq_ids: Sequence[int | str], descriptors: Sequence[TreeDescriptor]) -> VerifyOutput:
        ahead, self._ahead = self._ahead, None
        key = _shape_key(seq_ids, [d.prefix_len for d in descriptors], [d.parents for d in descriptors],
                         [d.topology.padded_rows for d in descriptors])  # fmt: skip
        batch = tree_forward_batch(
            self.caches, seq_ids, descriptors, ahead[1] if ahead and ahead[0] == key else None
        )
        if self.runner is not None:
            hidden, logits, record = self.runner.tree_forward(batch)
        else:
            hidden = self.model(batch, self.caches)
            logits, record = self.model.compute_logits(hidden), self.model.tree_record
        return VerifyOutput(list(descriptors), batch, logits, hidden, record)

    def select(
        self,
        out: VerifyOutput,
        params: Sequence[SamplingParams],
        seeds: torch.Tensor,
        out_pos: torch.Tensor,
        history: torch.Tensor | None = None,
    ) -> WalkResult:
        """The exact target-only walk over the verified trees."""
        return self.sampler.walk(out.tree_batch(), out.logits, history, params, seeds, out_pos)

    def commit(self, out: VerifyOutput, walk: WalkResult) -> torch.Tensor:
        """Publish each request's accepted path (device tensor, root first); returns accepted lengths [S]."""
        if self.runner is not None:
            return self.runner.commit(out.record, walk.accepted)  # type: ignore[no-any-return]
        return self.model.commit(out.record, walk.accepted, self.caches)

    def step(
        self,
        seq_ids: Sequence[int | str],
        descriptors: Sequence[TreeDescriptor],
        params: Sequence[SamplingParams],
        seeds: torch.Tensor,
        out_pos: torch.Tensor,
        history: torch.Tensor | None = None,
    ) -> tuple[VerifyOutput, WalkResult, torch.Tensor]:
        """verify -> select -> commit with no host read in between."""
        out = self.verify(seq_ids, descriptors)
        walk = self.select(out, params, seeds, out_pos, history)
        return out, walk, self.commit(out, walk)
