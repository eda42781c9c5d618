"""Model runner: builds prefill and decode ``ForwardBatch``es, runs the target, replays decode steps through
CUDA graphs. Tree verification goes through ``verifier.Verifier`` (the one verify/select/commit path), which
runs its tree forward and its commit here so that they replay as CUDA graphs too.

Decode batches go through static buffers padded to a captured batch size; padded rows point at a private
padding sequence (its own pool row and KV block), so they never touch a real request's state. On CUDA each
size is captured once as a graph; elsewhere (``static_decode``) the same padded path runs eagerly, which lets
CPU tests exercise the padding logic that graphs rely on.

Tree verification: one graph per tree topology (the per-sequence parent lists of the batch: hydra27 and
the chains repeat every step), over static buffers sized to that topology. Capture runs on the step's real
batch - a tree forward only writes the tree rows' scratch K/V - and the commit graph of the same topology is
captured against the padding sequence (its replay would otherwise publish twice). Topologies beyond
``max_tree_graphs`` run eagerly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lumotree.kernels import dispatch
from lumotree.serving.batch import ForwardBatch, TreeKey
from lumotree.serving.cache import StateCaches
from lumotree.serving.graphs import StaticGraphs, capture
from lumotree.serving.model import HybridModel
from lumotree.serving.model.record import TreeRecord
from lumotree.serving.request import Request
from lumotree.serving.scheduler import PrefillChunk

log = logging.getLogger(__name__)

PAD_SEQ = "__pad__"


@dataclass(frozen=True)
class RunnerConfig:
    """How the runner executes decode steps."""

    max_seqs: int
    """Largest decode batch."""
    max_blocks_per_seq: int
    """Width of the static block tables (model length + tree rows, in blocks)."""
    cuda_graphs: bool = True
    """Capture decode steps as CUDA graphs (CUDA only)."""
    static_decode: bool = False
    """Use the padded static-buffer decode path even without graphs (tests, debugging)."""
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    """Decode batch sizes to capture (clipped to max_seqs; max_seqs is always included)."""
    max_tree_graphs: int = 16
    """Tree topologies captured for verification and commit; further ones run eagerly. The drafting and walk
    graphs (one per batch structure each, a few widths for drafting) get four times as many entries."""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor
    hidden: torch.Tensor


@dataclass
class _TreeGraph:
    """Static buffers and graphs of one tree topology."""

    batch: ForwardBatch
    graph: torch.cuda.CUDAGraph | None = None
    hidden: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    record: TreeRecord | None = None
    accepted: torch.Tensor | None = None
    """[S, depth + 1] static input of the commit graph."""
    commit_graph: torch.cuda.CUDAGraph | None = None
    lens: torch.Tensor | None = None
    staged: ForwardBatch | None = None
    """The batch whose shape fields ``stage_tree`` already copied in (its tokens still to come)."""


class ModelRunner:
    def __init__(self, model: HybridModel, caches: StateCaches, config: RunnerConfig) -> None:
        self.model = model
        self.caches = caches
        self.config = config
        self.device = caches.device
        self.pad = caches.allocate(PAD_SEQ, 1)
        self.graph_error: str | None = None
        """The first failed capture's error (decode, tree, commit or drafter graphs); None while all held."""
        use_graphs = config.cuda_graphs and self.device.type == "cuda"
        self.static = use_graphs or config.static_decode
        sizes = sorted({s for s in config.graph_batch_sizes if s < config.max_seqs} | {config.max_seqs})
        self.sizes = sizes
        self.graphs: dict[int, _Graph] = {}
        self.tree_graphs: dict[TreeKey, _TreeGraph] = {}
        probe = torch.zeros(1, device=self.device)
        # Tree graphs need the fused tree-attention kernel: the reference reads host context lengths.
        self.tree_capture = use_graphs and dispatch.use_fused(probe)
        self._pool: tuple[int, int] | None = None
        self._last_tree: _TreeGraph | None = None
        self.fn_graphs = (
            StaticGraphs(
                self.tree_capture, lambda: self._pool, self.disable_capture, 4 * config.max_tree_graphs
            )
            if self.static
            else None
        )
        """Per-key graphs of other fixed-shape device work (the drafters' passes); None = eager."""
        if self.static:
            self._alloc_static(sizes[-1])
        if use_graphs:
            try:
                self._capture(sizes)
            except Exception as e:  # a model whose decode is not capturable still serves, eagerly
                self.graph_error = f"{type(e).__name__}: {e}"
                log.warning("CUDA graph capture failed, decoding eagerly: %s", self.graph_error)
                self.graphs.clear()
                torch.cuda.synchronize()

    # ---------------------------------------------------------------- prefill
    def prefill(self, chunks: Sequence[PrefillChunk]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Run prompt chunks. Returns (hidden [R, H], logits [S, V] of each chunk's last row, row offsets)."""
        reqs = [c.request for c in chunks]
        batch = self.caches.make_batch(
            "prefill",
            [r.req_id for r in reqs],
            [r.prompt_ids[c.start : c.start + c.length] for r, c in zip(reqs, chunks, strict=True)],
            [c.start for c in chunks],
        )
        hidden = self.model(batch, self.caches)
        offsets = [0]
        for c in chunks:
            offsets.append(offsets[-1] + c.length)
        last = torch.tensor([o - 1 for o in offsets[1:]], device=self.device)
        return hidden, self.model.compute_logits(hidden[last]), offsets

    # ---------------------------------------------------------------- decode
    def decode(self, reqs: Sequence[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per request (its pending token). Returns (logits [B, V], hidden [B, H])."""
        if not self.static or len(reqs) > self.sizes[-1]:
            batch = self.caches.make_batch(
                "decode",
                [r.req_id for r in reqs],
                [[r.pending_token] for r in reqs],
                [r.context_len for r in reqs],
            )
            hidden = self.model(batch, self.caches)
            return self.model.compute_logits(hidden), hidden
        b = len(reqs)
        size = next(s for s in self.sizes if s >= b)
        self._fill(reqs, size)
        g = self.graphs.get(size)
        if g is not None and g.graph is not None:
            g.graph.replay()
            return g.logits[:b], g.hidden[:b]
        hidden = self.model(self._static_batch(size), self.caches)
        return self.model.compute_logits(hidden)[:b], hidden[:b]

    def _alloc_static(self, n: int) -> None:
        dev, long = self.device, torch.long
        self.buf_ids = torch.zeros(n, dtype=long, device=dev)
        self.buf_pos = torch.zeros(n, dtype=long, device=dev)
        self.buf_rows = torch.full((n,), self.pad.state_row, dtype=long, device=dev)
        self.buf_ctx = torch.zeros(n, dtype=long, device=dev)
        self.buf_slots = torch.full((n,), self.pad.blocks[0] * self.caches.block_size, dtype=long, device=dev)
        self.buf_tables = torch.zeros(n, self.config.max_blocks_per_seq, dtype=long, device=dev)
        self.buf_tables[:, 0] = self.pad.blocks[0]
        self.buf_cu = torch.arange(n + 1, dtype=long, device=dev)
        # One pinned host staging area: a single copy per field and step.
        self.host = torch.zeros(5, n, dtype=long, pin_memory=dev.type == "cuda")
        self.host_tables = torch.zeros(
            n, self.config.max_blocks_per_seq, dtype=long, pin_memory=dev.type == "cuda"
        )

    def _static_batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(
            mode="decode",
            input_ids=self.buf_ids[:size],
            positions=self.buf_pos[:size],
            cu_seqlens=self.buf_cu[: size + 1],
            state_rows=self.buf_rows[:size],
            context_lens=self.buf_ctx[:size],
            slot_mapping=self.buf_slots[:size],
            block_tables=self.buf_tables[:size],
        )

    def _fill(self, reqs: Sequence[Request], size: int) -> None:
        bs = self.caches.block_size
        pad_slot = self.pad.blocks[0] * bs
        h, ht = self.host, self.host_tables
        h[0, :size] = 0
        h[1, :size] = 0
        h[2, :size] = self.pad.state_row
        h[3, :size] = 0
        h[4, :size] = pad_slot
        ht[:size] = 0
        ht[:size, 0] = self.pad.blocks[0]
        for i, r in enumerate(reqs):
            ctx = r.context_len
            slots = self.caches.extend(r.req_id, ctx + 1)
            blocks = slots.blocks
            assert len(blocks) <= ht.shape[1], "sequence longer than the static block tables"
            h[0, i], h[1, i], h[2, i], h[3, i] = r.pending_token, ctx, slots.state_row, ctx
            h[4, i] = blocks[ctx // bs] * bs + ctx % bs
            ht[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        for buf, row in zip(
            (self.buf_ids, self.buf_pos, self.buf_rows, self.buf_ctx, self.buf_slots), h, strict=True
        ):
            buf[:size].copy_(row[:size], non_blocking=True)
        self.buf_tables[:size].copy_(ht[:size], non_blocking=True)

    def _capture(self, sizes: list[int]) -> None:
        pool = None
        for size in reversed(sizes):
            self._fill([], size)
            batch = self._static_batch(size)
            graph, (hidden, logits) = capture(functools.partial(self._logits, batch), pool)
            pool = graph.pool()
            self.graphs[size] = _Graph(graph, logits, hidden)
        self._pool = pool
        torch.cuda.synchronize()

    # ---------------------------------------------------------------- tree verification
    def tree_forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, TreeRecord]:
        """Tree-mode forward: (hidden [R, H], logits [R, V], replay record), through the topology's graph
        when one is (or can be) captured."""
        assert batch.mode == "tree" and batch.parents_host is not None
        self._last_tree = None
        key = batch.tree_key
        tg = self.tree_graphs.get(key)
        if tg is None and self.static and len(self.tree_graphs) < self.config.max_tree_graphs:
            tg = self.tree_graphs[key] = self._new_tree(batch)
            if self.tree_capture:
                try:
                    self._capture_tree(tg, batch)
                except Exception as e:  # a failed capture leaves its pool recording: no more captures
                    log.warning(
                        "tree graph capture failed, verifying eagerly: %s: %s",
                        type(e).__name__,
                        e,
                        exc_info=True,
                    )
                    tg.graph = tg.commit_graph = None
                    self.disable_capture(f"{type(e).__name__}: {e}")
        if tg is None:
            hidden = self.model(batch, self.caches)
            assert self.model.tree_record is not None
            return hidden, self.model.compute_logits(hidden), self.model.tree_record
        if tg.staged is batch:  # staged while the drafter ran: only the tokens are new (unless the drafter
            if batch.input_ids.data_ptr() != tg.batch.input_ids.data_ptr():  # uploaded them in place)
                tg.batch.input_ids.copy_(batch.input_ids, non_blocking=True)
        else:
            self._fill_tree(tg, batch)
        tg.staged = None
        if tg.graph is not None:
            tg.graph.replay()
        else:
            tg.hidden = self.model(tg.batch, self.caches)
            tg.logits = self.model.compute_logits(tg.hidden)
            tg.record = self.model.tree_record
        assert tg.hidden is not None and tg.logits is not None and tg.record is not None
        self._last_tree = tg
        return tg.hidden, tg.logits, tg.record

    def stage_tree(self, batch: ForwardBatch) -> None:
        """Copy a tree batch's shape fields (positions, slots, state rows, tables) into its topology's
        static buffers ahead of ``tree_forward``, which then copies only the token ids. Called while the
        drafter still runs, so that after the drafts reach the host nothing but the tokens stands between
        them and the verify graph. The copies queue behind the drafter on the stream; the previous verify and
        commit, the only readers of these buffers, finished with the previous step."""
        tg = self.tree_graphs.get(batch.tree_key)
        if tg is not None and tg.graph is not None:
            self._fill_tree(tg, batch)
            tg.staged = batch

    def staged_input(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The static token buffer of the graph that ``stage_tree`` prepared for ``batch``, if any."""
        tg = self.tree_graphs.get(batch.tree_key)
        return tg.batch.input_ids if tg is not None and tg.staged is batch else None

    def disable_capture(self, error: str) -> None:
        """Stop capturing new graphs after a failed capture (``error``); captured ones keep replaying."""
        self.graph_error = self.graph_error or error
        self.tree_capture = False
        if self.fn_graphs is not None:
            self.fn_graphs.capture_graphs = False
        torch.cuda.synchronize()

    def commit(self, record: TreeRecord, accepted: torch.Tensor) -> torch.Tensor:
        """Publish the accepted rows [S, D] of the latest tree forward (see ``model.commit``)."""
        tg = self._last_tree
        if (
            tg is None or record is not tg.record or tg.commit_graph is None or tg.accepted is None
            or accepted.shape[1] > tg.accepted.shape[1]
        ):  # fmt: skip
            return self.model.commit(record, accepted, self.caches)
        if accepted.shape[1] < tg.accepted.shape[1]:  # a shorter path bucket: pad with -1 steps
            tg.accepted.fill_(-1)
        tg.accepted[:, : accepted.shape[1]].copy_(accepted)
        tg.commit_graph.replay()
        assert tg.lens is not None
        return tg.lens

    def _new_tree(self, batch: ForwardBatch) -> _TreeGraph:
        dev, long = self.device, torch.long
        R, S = batch.num_rows, batch.num_seqs
        static = ForwardBatch(
            mode="tree",
            input_ids=torch.zeros(R, dtype=long, device=dev),
            positions=torch.zeros(R, dtype=long, device=dev),
            cu_seqlens=batch.cu_seqlens.clone(),
            state_rows=torch.zeros(S, dtype=long, device=dev),
            context_lens=torch.zeros(S, dtype=long, device=dev),
            slot_mapping=torch.zeros(R, dtype=long, device=dev),
            block_tables=torch.zeros(S, self.config.max_blocks_per_seq, dtype=long, device=dev),
            parents=batch.parents.clone() if batch.parents is not None else None,
            seq_lens_host=list(batch.seq_lens_host or []),
            context_lens_host=list(batch.context_lens_host or []),
            parents_host=[list(p) for p in batch.parents_host or []],
            padded_host=None if batch.padded_host is None else list(batch.padded_host),
        )
        return _TreeGraph(static)

    def _fill_tree(self, tg: _TreeGraph, batch: ForwardBatch) -> None:
        sb = tg.batch
        for name in ("input_ids", "positions", "state_rows", "context_lens", "slot_mapping"):
            getattr(sb, name).copy_(getattr(batch, name), non_blocking=True)
        w = batch.block_tables.shape[1]
        assert w <= sb.block_tables.shape[1], "sequence longer than the static block tables"
        sb.block_tables[:, :w].copy_(batch.block_tables, non_blocking=True)
        sb.context_lens_host = list(batch.context_lens_host or [])

    def _fill_pad(self, tg: _TreeGraph) -> None:
        """Point the static batch at the padding sequence (commit capture must not publish real state)."""
        sb, bs = tg.batch, self.caches.block_size
        base = self.pad.blocks[0] * bs
        sb.state_rows.fill_(self.pad.state_row)
        sb.context_lens.zero_()
        sb.block_tables.fill_(self.pad.blocks[0])
        sb.slot_mapping.copy_(base + torch.arange(sb.num_rows, device=self.device) % bs)

    def _logits(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(batch, self.caches)
        return hidden, self.model.compute_logits(hidden)

    def _capture_tree(self, tg: _TreeGraph, batch: ForwardBatch) -> None:
        # A tree forward writes only its rows' scratch K/V, so warming up on the real batch is harmless.
        self._fill_tree(tg, batch)
        sb = tg.batch
        graph, (hidden, logits) = capture(lambda: self._logits(sb), self._pool)
        record = self.model.tree_record
        assert record is not None
        tg.graph, tg.hidden, tg.logits, tg.record = graph, hidden, logits, record
        depth = max(max(_depths(p)) for p in sb.parents_host or [])
        tg.accepted = torch.full((sb.num_seqs, depth + 1), -1, dtype=torch.long, device=self.device)
        tg.accepted[:, 0] = 0
        self._fill_pad(tg)
        acc = tg.accepted
        tg.commit_graph, tg.lens = capture(lambda: self.model.commit(record, acc, self.caches), self._pool)
        torch.cuda.synchronize()


def _depths(parents: Sequence[int]) -> list[int]:
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth
