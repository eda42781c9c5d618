"""The three state surfaces of a hybrid model, as explicit objects that requests own rows of.

- ``RecurrentStatePool``: fp32 GDN states [gdn_layers, rows, Hv, K, V].
- ``ConvStatePool``: the last (kernel - 1) pre-conv inputs [gdn_layers, rows, conv_dim, kernel - 1], oldest
first.
- ``PagedKVCache``: K and V [attn_layers, num_blocks, block_size, Hkv, D]; slot = block * block_size + offset.
``StateCaches`` bundles them: a sequence owns one pool row and a list of KV blocks; ``free`` returns them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .batch import ForwardBatch, Mode
from .config import ModelConfig


class CacheFullError(RuntimeError):
    """No free pool row or KV block is left."""


class _FreeList:
    """Ids 0..n-1 handed out lowest first; double frees and foreign ids are errors."""

    def __init__(self, n: int, name: str) -> None:
        self.n, self.name = n, name
        self._free = list(range(n - 1, -1, -1))
        self._used: set[int] = set()

    def take(self) -> int:
        if not self._free:
            raise CacheFullError(f"no free {self.name} (all {self.n} in use)")
        i = self._free.pop()
        self._used.add(i)
        return i

    def give(self, i: int) -> None:
        if i not in self._used:
            raise ValueError(f"{self.name} {i} is not allocated")
        self._used.remove(i)
        self._free.append(i)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> set[int]:
        return set(self._used)


class _RowPool:
    """A [layers, rows, ...] state tensor whose rows are handed out one per live sequence, zeroed."""

    def __init__(self, state: torch.Tensor, what: str) -> None:
        self.state = state
        self.rows = _FreeList(state.shape[1], what)

    def alloc(self) -> int:
        r = self.rows.take()
        self.state[:, r].zero_()
        return r

    def free(self, row: int) -> None:
        self.rows.give(row)


class RecurrentStatePool(_RowPool):
    """fp32 GDN recurrent states, one row per live sequence; a row is zeroed when handed out."""

    def __init__(
        self, layers: int, rows: int, heads: int, k: int, v: int, device: torch.device | str
    ) -> None:
        state = torch.zeros(layers, rows, heads, k, v, dtype=torch.float32, device=device)
        super().__init__(state, "recurrent-state row")


class ConvStatePool(_RowPool):
    """Pre-conv inputs of the last (kernel - 1) committed tokens per GDN layer, oldest first; zero when
    fresh."""

    def __init__(
        self, layers: int, rows: int, conv_dim: int, hist: int, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        super().__init__(
            torch.zeros(layers, rows, conv_dim, hist, dtype=dtype, device=device), "conv-state row"
        )


class PagedKVCache:
    """Paged K/V per attention layer (MTP layers after the model's own)."""

    def __init__(
        self,
        layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        shape = (layers, num_blocks, block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.blocks = _FreeList(num_blocks, "KV block")

    def slot(self, block_table: Sequence[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size


@dataclass(frozen=True)
class CacheConfig:
    """Sizes of the state surfaces."""

    max_seqs: int = 8
    """Rows of the recurrent and conv pools = most sequences alive at once."""
    num_blocks: int = 256
    """KV blocks shared by all sequences."""
    block_size: int = 16
    """Tokens per KV block."""
    mtp_kv: bool = True
    """Reserve KV layers for the model's MTP decoder layers (if the config has any)."""


@dataclass
class SeqSlots:
    """What one sequence owns: its pool row and its KV blocks (logical order)."""

    seq_id: int | str
    state_row: int
    blocks: list[int] = field(default_factory=list)

    def capacity(self, block_size: int) -> int:
        return len(self.blocks) * block_size


class StateCaches:
    """Recurrent pool + conv pool + paged KV for one model; sequences allocate, extend and free."""

    def __init__(
        self,
        config: ModelConfig,
        cache: CacheConfig | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        cache = cache or CacheConfig()
        self.config, self.cache_config = config, cache
        self.device, self.dtype = torch.device(device), dtype
        ng = len(config.gdn_layers)
        self.num_kv_layers = len(config.attn_layers) + (config.mtp_num_hidden_layers if cache.mtp_kv else 0)
        self.recurrent = RecurrentStatePool(
            ng, cache.max_seqs, config.linear_num_value_heads, config.linear_key_head_dim,
            config.linear_value_head_dim, device,
        )  # fmt: skip
        self.conv = ConvStatePool(
            ng, cache.max_seqs, config.conv_dim, config.linear_conv_kernel_dim - 1, device, dtype
        )
        self.kv = PagedKVCache(
            self.num_kv_layers, cache.num_blocks, cache.block_size, config.num_key_value_heads,
            config.head_dim, device, dtype,
        )  # fmt: skip
        self.seqs: dict[int | str, SeqSlots] = {}

    @property
    def block_size(self) -> int:
        return self.cache_config.block_size

    def _blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def allocate(self, seq_id: int | str, num_tokens: int) -> SeqSlots:
        """A fresh sequence: zeroed recurrent and conv rows (one shared index) and KV room for
        ``num_tokens``."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} is already allocated")
        need = self._blocks_for(num_tokens)
        if need > self.kv.blocks.num_free:
            raise CacheFullError(f"{need} KV blocks needed, {self.kv.blocks.num_free} free")
        row = self.recurrent.alloc()
        conv_row = self.conv.alloc()
        assert row == conv_row, "recurrent and conv pools hand out rows in lockstep"
        slots = SeqSlots(seq_id, row, [self.kv.blocks.take() for _ in range(need)])
        self.seqs[seq_id] = slots
        return slots

    def extend(self, seq_id: int | str, num_tokens: int) -> SeqSlots:
        """Grow a sequence's KV room to at least ``num_tokens`` tokens in all."""
        slots = self.seqs[seq_id]
        need = self._blocks_for(num_tokens) - len(slots.blocks)
        if need > self.kv.blocks.num_free:
            raise CacheFullError(f"{need} more KV blocks needed, {self.kv.blocks.num_free} free")
        slots.blocks.extend(self.kv.blocks.take() for _ in range(max(0, need)))
        return slots

    def free(self, seq_id: int | str) -> None:
        slots = self.seqs.pop(seq_id)
        self.recurrent.free(slots.state_row)
        self.conv.free(slots.state_row)
        for b in slots.blocks:
            self.kv.blocks.give(b)

    def leaks(self) -> list[str]:
        """Inconsistencies between what sequences own and what the pools think is in use (empty = clean)."""
        problems = []
        rows = {s.state_row for s in self.seqs.values()}
        blocks = [b for s in self.seqs.values() for b in s.blocks]
        if rows != self.recurrent.rows.used:
            problems.append(
                f"recurrent rows in use {sorted(self.recurrent.rows.used)} != owned {sorted(rows)}"
            )
        if rows != self.conv.rows.used:
            problems.append(f"conv rows in use {sorted(self.conv.rows.used)} != owned {sorted(rows)}")
        if len(blocks) != len(set(blocks)):
            problems.append("a KV block is owned twice")
        if set(blocks) != self.kv.blocks.used:
            problems.append(f"KV blocks in use {len(self.kv.blocks.used)} != owned {len(set(blocks))}")
        return problems

    def assert_no_leaks(self, allow_live: bool = False) -> None:
        """Raise if the books disagree, or (unless ``allow_live``) if any sequence still holds resources."""
        problems = self.leaks()
        if not allow_live and self.seqs:
            problems.append(f"sequences still allocated: {sorted(map(str, self.seqs))}")
        if problems:
            raise AssertionError("state cache leak: " + "; ".join(problems))

    def make_batch(
        self,
        mode: Mode,
        seq_ids: Sequence[int | str],
        tokens: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        parents: Sequence[Sequence[int]] | None = None,
        table_width: int | None = None,
        padded: Sequence[Sequence[int]] | None = None,
    ) -> ForwardBatch:
        """A ``ForwardBatch`` for these sequences, growing their KV room to hold the new rows (block tables
        padded to ``table_width`` when given; ``padded``: tree rows never sampled, see ``ForwardBatch``)."""
        for sid, toks, ctx in zip(seq_ids, tokens, context_lens, strict=True):
            self.extend(sid, ctx + len(toks))
        return ForwardBatch.build(
            mode,
            tokens,
            context_lens,
            [self.seqs[s].state_row for s in seq_ids],
            [self.seqs[s].blocks for s in seq_ids],
            self.block_size,
            parents,
            self.device,
            table_width,
            padded,
        )
