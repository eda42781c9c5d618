"""``ForwardBatch``: the packed rows of one model forward, for prefill, decode or tree verification."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from .upload import to_device

Mode = Literal["prefill", "decode", "tree"]
TreeKey = tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]
"""(parents, padded rows) per sequence: ``ForwardBatch.tree_key``."""


@dataclass
class ForwardBatch:
    """Rows of S sequences packed back to back (R rows in all). Device tensors; ``*_host`` lists mirror the
    structure on the host for prefill and tree mode (decode needs none, so it can be replayed by a CUDA
    graph)."""

    mode: Mode
    """prefill: each sequence's rows are a chain continuing its committed state; decode: one row per sequence;
    tree: each sequence's rows form a tree rooted at its pending token."""
    input_ids: torch.Tensor
    """[R] token ids."""
    positions: torch.Tensor
    """[R] RoPE positions (context_len + index for chains, context_len + depth for trees)."""
    cu_seqlens: torch.Tensor
    """[S+1] row range of each sequence."""
    state_rows: torch.Tensor
    """[S] each sequence's row in the recurrent and conv pools."""
    context_lens: torch.Tensor
    """[S] tokens already committed to state/KV before this forward."""
    slot_mapping: torch.Tensor
    """[R] KV slot each row's K/V is written to."""
    block_tables: torch.Tensor
    """[S, max_blocks] KV blocks of each sequence in logical order (padded with 0)."""
    parents: torch.Tensor | None = None
    """[R] tree mode: parent row index local to the sequence, -1 = the committed state; parents before
    children."""
    seq_lens_host: list[int] | None = None
    """Rows per sequence (required for prefill and tree)."""
    context_lens_host: list[int] | None = None
    """``context_lens`` on the host (required for prefill and tree)."""
    parents_host: list[list[int]] | None = None
    """Per-sequence local parents on the host (tree mode)."""
    padded_host: list[tuple[int, ...]] | None = None
    """Tree mode: per sequence, local rows never sampled (``TreeTopology.padded_rows``). The GDN scan skips
    them and leaves their output zero, so their logits mean nothing; None = every row computed."""

    def __post_init__(self) -> None:
        R = self.input_ids.shape[0]
        S = self.state_rows.shape[0]
        assert self.mode in ("prefill", "decode", "tree"), self.mode
        assert self.positions.shape == (R,) and self.slot_mapping.shape == (R,)
        assert self.cu_seqlens.shape == (S + 1,) and self.context_lens.shape == (S,)
        assert self.block_tables.dim() == 2 and self.block_tables.shape[0] == S
        if self.mode == "decode":
            assert R == S, "decode has one row per sequence"
        else:
            assert self.seq_lens_host is not None and self.context_lens_host is not None, (
                "host lengths needed"
            )
            assert len(self.seq_lens_host) == S and sum(self.seq_lens_host) == R
            assert all(n > 0 for n in self.seq_lens_host), "every sequence needs at least one row"
        if self.mode == "tree":
            assert self.parents is not None and self.parents.shape == (R,)
            assert self.parents_host is not None and len(self.parents_host) == S
            for par in self.parents_host:
                assert all(-1 <= p < i for i, p in enumerate(par)), "parents must precede children"
                assert par and par[0] == -1 and all(p >= 0 for p in par[1:]), "one root at row 0"
            assert self.padded_host is None or len(self.padded_host) == S, "padded rows per sequence"

    @property
    def tree_key(self) -> TreeKey:
        """What a tree-mode forward's launches depend on besides its tensors: the shapes and padded rows
        (the key of its CUDA graphs)."""
        parents = tuple(tuple(p) for p in self.parents_host or [])
        padded = self.padded_host if self.padded_host is not None else [()] * len(parents)
        return parents, tuple(tuple(p) for p in padded)

    @property
    def num_seqs(self) -> int:
        return int(self.state_rows.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def build(
        cls,
        mode: Mode,
        tokens: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        state_rows: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        parents: Sequence[Sequence[int]] | None = None,
        device: torch.device | str = "cpu",
        table_width: int | None = None,
        padded: Sequence[Sequence[int]] | None = None,
    ) -> ForwardBatch:
        """Pack per-sequence token lists. Row j of a sequence is stored at the slot of logical position
        context_len + j (for trees too: the spine-contiguous layout that makes committing a spine free).
        ``table_width`` pads the block tables to a fixed width."""
        S = len(tokens)
        assert len(context_lens) == S and len(state_rows) == S and len(block_tables) == S
        if mode == "tree":
            assert parents is not None and len(parents) == S
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        cu = [0]
        for s in range(S):
            n, ctx = len(tokens[s]), context_lens[s]
            assert (ctx + n + block_size - 1) // block_size <= len(block_tables[s]), "KV capacity too small"
            if mode == "tree":
                par = list(parents[s])  # type: ignore[index]
                assert len(par) == n
                depth: list[int] = []
                for p in par:
                    depth.append(0 if p < 0 else depth[p] + 1)
                pos.extend(ctx + d for d in depth)
            else:
                pos.extend(range(ctx, ctx + n))
            for j in range(ctx, ctx + n):
                slots.append(block_tables[s][j // block_size] * block_size + j % block_size)
            ids.extend(tokens[s])
            cu.append(cu[-1] + n)
        width = max(1, max((len(b) for b in block_tables), default=1))
        if table_width is not None:  # fixed-shape tables (CUDA graphs)
            assert width <= table_width, f"{width} blocks do not fit a table of {table_width}"
            width = table_width
        table = [x for b in block_tables for x in (*b, *[0] * (width - len(b)))]
        par_flat = [p for ps in parents for p in ps] if mode == "tree" and parents is not None else []
        # One queued upload for every field (a torch.tensor(..., device=cuda) each would wait for the stream)
        fields = (ids, pos, cu, list(state_rows), list(context_lens), slots, table, par_flat)
        flat = to_device([x for f in fields for x in f], device)
        ids_, pos_, cu_, rows_, ctx_, slots_, table_, par_ = flat.split([len(f) for f in fields])
        return cls(
            mode=mode,
            input_ids=ids_,
            positions=pos_,
            cu_seqlens=cu_,
            state_rows=rows_,
            context_lens=ctx_,
            slot_mapping=slots_,
            block_tables=table_.view(S, width),
            parents=par_ if mode == "tree" else None,
            seq_lens_host=[len(x) for x in tokens],
            context_lens_host=list(context_lens),
            parents_host=[list(p) for p in parents] if mode == "tree" and parents is not None else None,
            padded_host=None if padded is None else [tuple(p) for p in padded],
        )
