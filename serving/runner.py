"""Model runner: builds prefill and decode ``ForwardBatch``es, runs the target, replays decode steps through
CUDA graphs. Tree verification goes through ``verifier.Verifier`` (the one verify/select/commit path).

Decode batches go through static buffers padded to a captured batch size; padded rows point at a private
padding sequence (its own pool row and KV block), so they never touch a real request's state. On CUDA each
size is captured once as a graph; elsewhere (``static_decode``) the same padded path runs eagerly, which lets
CPU tests exercise the padding logic that graphs rely on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lumotree.serving.batch import ForwardBatch
from lumotree.serving.cache import StateCaches
from lumotree.serving.model import HybridModel
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


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor
    hidden: torch.Tensor


class ModelRunner:
    def __init__(self, model: HybridModel, caches: StateCaches, config: RunnerConfig) -> None:
        self.model = model
        self.caches = caches
        self.config = config
        self.device = caches.device
        self.pad = caches.allocate(PAD_SEQ, 1)
        self.graph_error: str | None = None
        use_graphs = config.cuda_graphs and self.device.type == "cuda"
        self.static = use_graphs or config.static_decode
        sizes = sorted({s for s in config.graph_batch_sizes if s < config.max_seqs} | {config.max_seqs})
        self.sizes = sizes
        self.graphs: dict[int, _Graph] = {}
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
            # Warm up on a side stream (allocator and lazy kernel init), then capture.
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    self.model.compute_logits(self.model(batch, self.caches))
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.model(batch, self.caches)
                logits = self.model.compute_logits(hidden)
            pool = graph.pool()
            self.graphs[size] = _Graph(graph, logits, hidden)
        torch.cuda.synchronize()
