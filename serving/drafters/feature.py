"""Chained feature-level drafting, shared by the MTP layer and the EAGLE head.

Both drafters are one decoder layer over ``fc([embed(x_{t+1}), f_t])``: row t sits at position t, reads the
token after it and the target's hidden state ``f_t`` (after the final norm), and predicts ``x_{t+2}`` through
the target's lm_head (vLLM's convention). The layer has its own KV (the MTP's KV layers follow the model's
attention layers in the engine's cache; the EAGLE head gets a cache of its own).

Per step and request:
- *extend*: one pass over the rows committed since the last draft (the prompt after prefill; after a verify
  step the accepted path, root first, each with the next accepted token and the bonus last). These rows carry
  the target's own features, so their KV is exactly what a drafter run alongside plain decoding would hold:
  accepted rows keep their (recomputed) KV, and whatever a rejected draft wrote at those positions is
  overwritten. The last row's output gives the depth-1 candidates.
- *chain*: ``depth - 1`` more passes, each on the previous pass's top token and the drafter's own output
  feature, at the next position (decode mode, one row per request). Their KV is scratch beyond the committed
  prefix and gets overwritten by the next extend.

All requests of a step go through each pass together; tokens and features stay on the device (the only host
values are row counts and positions), so the chain has no host sync.

With ``graphs`` set (the runner's ``StaticGraphs``), a step whose pending rows fit ``W`` rows per request
runs extend + chain as one CUDA graph per (requests, W): the extend pass becomes a fixed-width chain (a
fanout-1 tree: causal over the prefix and its own rows) whose padding rows write scratch K/V past the
committed prefix, which the chain passes overwrite before anything reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..batch import ForwardBatch
from ..cache import StateCaches
from ..graphs import StaticGraphs
from ..upload import to_device

Layer = Callable[[torch.Tensor, torch.Tensor, ForwardBatch, StateCaches], torch.Tensor]
"""(embeds [R, H], features [R, H], batch, caches) -> output features [R, H] (writes the layer's KV)."""


@dataclass(frozen=True)
class ChainConfig:
    """Shape of one chained draft."""

    depth: int = 5
    """Drafter passes = draft tokens along the top-1 spine (MTP-k: k; EAGLE: 7)."""
    topk: int = 1
    """Candidates kept per depth (3 for the hydra27 tree); the chain itself follows the top one."""

    def __post_init__(self) -> None:
        assert self.depth >= 1 and self.topk >= 1, self


@dataclass
class Drafts:
    """Candidates of every request, depth by depth along the top-1 spine (device tensors)."""

    tokens: torch.Tensor
    """[S, depth, topk] int64, most probable first."""
    probs: torch.Tensor
    """[S, depth, topk] fp32 drafter probabilities (softmax of its logits)."""


@dataclass
class _Pending:
    start: int
    """Position of the first row not yet run through the drafter."""
    tokens: list[int] = field(default_factory=list)
    """Token x_{t+1} of each row t."""
    features: list[torch.Tensor] = field(default_factory=list)
    """Target features f_t of the rows, in chunks."""


class FeatureDrafter:
    """Extend + chain over a feature layer; ``embed`` and ``logits`` are the target's (shared) ones."""

    def __init__(
        self,
        layer: Layer,
        embed: Callable[[torch.Tensor], torch.Tensor],
        logits: Callable[[torch.Tensor], torch.Tensor],
        caches: StateCaches,
        config: ChainConfig,
        own_caches: bool,
    ) -> None:
        self.layer, self.embed, self.logits = layer, embed, logits
        self.caches, self.config, self.own_caches = caches, config, own_caches
        self._pending: dict[str, _Pending] = {}
        self.graphs: StaticGraphs | None = None
        """Fixed-shape drafting through these graphs (set by the arm from the engine's runner)."""
        self.table_width = 0
        """Block-table width of the fixed-shape batches."""
        self.vocab_ids: torch.Tensor | None = None
        """Token id of each drafter logit column when the vocabulary is restricted (``restrict_vocab``)."""

    def feed(self, seq_id: str, start: int, next_tokens: Sequence[int], features: torch.Tensor) -> None:
        """Queue rows start .. start + n - 1 (n = len(next_tokens) = features.shape[0])."""
        assert features.shape[0] == len(next_tokens) > 0, (features.shape, len(next_tokens))
        p = self._pending.get(seq_id)
        if p is None:
            p = self._pending[seq_id] = _Pending(start)
            if self.own_caches and seq_id not in self.caches.seqs:
                self.caches.allocate(seq_id, start + len(next_tokens))
        assert p.start + len(p.tokens) == start, "drafter rows must be fed in position order"
        p.tokens.extend(int(t) for t in next_tokens)
        p.features.append(features)

    def has_pending(self, seq_id: str) -> bool:
        return seq_id in self._pending

    def draft(self, seq_ids: Sequence[str], context_lens: Sequence[int]) -> Drafts:
        """Run extend + chain for these sequences; ``context_lens[s]`` = position of the pending token."""
        pend = [self._pending.pop(s) for s in seq_ids]
        for p, ctx in zip(pend, context_lens, strict=True):
            assert p.start + len(p.tokens) == ctx, "the drafter must have seen every committed row"
        ids = list(seq_ids)
        n = max(len(p.tokens) for p in pend)
        width = self.config.depth + 1 if n <= self.config.depth + 1 else 1 << (n - 1).bit_length()
        if self.graphs is not None and width <= 32:
            return self._draft_static(ids, pend, list(context_lens), width)
        h, batch = self._extend(ids, pend)
        h = h[batch.cu_seqlens[1:] - 1]
        toks, probs = [], []
        top = self._top(h)
        for j in range(1, self.config.depth + 1):
            toks.append(top[0])
            probs.append(top[1])
            if j == self.config.depth:
                break
            batch = self.caches.make_batch("decode", ids, [[0]] * len(ids), [c + j - 1 for c in context_lens])
            batch.input_ids = top[0][:, 0].contiguous()
            h = self.layer(self.embed(batch.input_ids), h, batch, self.caches)
            top = self._top(h)
        return Drafts(torch.stack(toks, 1), torch.stack(probs, 1))

    def absorb(self, seq_ids: Sequence[str]) -> None:
        """Run the extend pass now over all pending rows but the last of each sequence (their KV is written,
        their outputs are not needed): called after prefill, so the prompt's drafter pass is prefill work (as
        in vLLM) and the first decode step drafts on the fixed-shape path like every other step."""
        ids = [s for s in seq_ids if s in self._pending and len(self._pending[s].tokens) > 1]
        if not ids:
            return
        heads, tails = [], []
        for sid in ids:
            p = self._pending[sid]
            f = torch.cat(p.features) if len(p.features) > 1 else p.features[0]
            n = len(p.tokens) - 1
            heads.append(_Pending(p.start, p.tokens[:n], [f[:n]]))
            tails.append(_Pending(p.start + n, p.tokens[n:], [f[n:]]))
        self._extend(ids, heads)
        self._pending.update(zip(ids, tails, strict=True))

    def _extend(self, ids: list[str], pend: list[_Pending]) -> tuple[torch.Tensor, ForwardBatch]:
        """One eager pass over the pending rows (prefill mode): writes their KV, returns all rows' outputs."""
        batch = self.caches.make_batch("prefill", ids, [p.tokens for p in pend], [p.start for p in pend])
        feats = torch.cat([f for p in pend for f in p.features])
        return self.layer(self.embed(batch.input_ids), feats, batch, self.caches), batch

    def _draft_static(self, ids: list[str], pend: list[_Pending], ctxs: list[int], width: int) -> Drafts:
        """Extend (padded to ``width`` rows per request) + chain on fixed shapes, through ``self.graphs``."""
        assert self.graphs is not None
        S, depth = len(ids), self.config.depth
        for sid, c in zip(ids, ctxs, strict=True):  # the chain passes write KV up to ctx + depth - 2
            self.caches.extend(sid, c + depth - 1)
        chain = [-1, *range(width - 1)]
        ext = self.caches.make_batch(
            "tree", ids, [p.tokens + [0] * (width - len(p.tokens)) for p in pend], [p.start for p in pend],
            [chain] * S, table_width=self.table_width,
        )  # fmt: skip
        h = pend[0].features[0].shape[1]
        feats = ext.input_ids.new_zeros((S, width, h), dtype=pend[0].features[0].dtype)
        for s, p in enumerate(pend):
            f = torch.cat(p.features) if len(p.features) > 1 else p.features[0]
            feats[s, : f.shape[0]] = f
        bs = self.caches.block_size
        host: list[list[int]] = [[s * width + len(p.tokens) - 1 for s, p in enumerate(pend)]]
        for j in range(1, depth):  # chain pass j: one row per request at position ctx + j - 1
            pos = [c + j - 1 for c in ctxs]
            blocks = [self.caches.seqs[sid].blocks for sid in ids]
            host += [pos, [b[x // bs] * bs + x % bs for b, x in zip(blocks, pos, strict=True)]]
        small = to_device([x for row in host for x in row], ext.input_ids.device).view(len(host), S)
        inputs = [ext.input_ids, ext.positions, ext.slot_mapping, ext.state_rows, ext.context_lens,
                  ext.block_tables, feats.view(S * width, h), small]  # fmt: skip

        def run(x: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            ids_, pos_, slots_, rows_, ctx_, tables_, feats_, small_ = x
            b = ForwardBatch("tree", ids_, pos_, ext.cu_seqlens, rows_, ctx_, slots_, tables_, ext.parents,
                             ext.seq_lens_host, ext.context_lens_host, ext.parents_host)  # fmt: skip
            out = self.layer(self.embed(ids_), feats_, b, self.caches)[small_[0]]
            top = self._top(out)
            toks, probs = [top[0]], [top[1]]
            cu = torch.arange(S + 1, device=ids_.device)
            for j in range(1, depth):
                tok = top[0][:, 0].contiguous()
                pos, slot = small_[2 * j - 1], small_[2 * j]
                b = ForwardBatch("decode", tok, pos, cu, rows_, pos, slot, tables_)
                out = self.layer(self.embed(tok), out, b, self.caches)
                top = self._top(out)
                toks.append(top[0])
                probs.append(top[1])
            return torch.stack(toks, 1), torch.stack(probs, 1)

        tokens, probs = self.graphs(("draft", S, width, self.table_width), run, inputs)
        return Drafts(tokens, probs)

    def _top(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.softmax(self.logits(h).float(), -1)
        val, idx = p.topk(self.config.topk, dim=-1)
        return (idx if self.vocab_ids is None else self.vocab_ids[idx]), val

    def restrict_vocab(self, lm_head: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Draft over ``token_ids`` only (their rows of ``lm_head`` [V, H] are copied): each drafter pass
        then reads a [n, H] slice instead of the whole lm_head (FR-Spec, SGLang's hot-token map). Drafts are
        verified by the target as always, so outputs do not change; only acceptance may."""
        ids = token_ids.to(device=lm_head.device, dtype=torch.long)
        weight = lm_head.index_select(0, ids).contiguous()
        self.logits = lambda h: torch.nn.functional.linear(h, weight).float()
        self.vocab_ids = ids

    def release(self, seq_id: str) -> None:
        self._pending.pop(seq_id, None)
        if self.own_caches and seq_id in self.caches.seqs:
            self.caches.free(seq_id)
