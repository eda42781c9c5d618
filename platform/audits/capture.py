"""Shared by the model and sampler audits: load a checkpoint, make prefixes, run one sequence's forwards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Code-like snippets as prefixes when the checkpoint ships a tokenizer (random token ids otherwise).
SNIPPETS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "import numpy as np\n\nclass Table:\n    def __init__(self, rows):\n        self.rows =",
    "for i in range(10):\n    print(i * i)\n# the sum of squares is",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "    with open(path) as f:\n        for line in f:\n            if line.startswith(",
    "from astropy import units as u\nq = 3 * u.m\nprint(q.to(",
]


@dataclass
class Loaded:
    """A model ready for audits."""

    model: Any
    """The HybridModel."""
    config: Any
    """Its ModelConfig."""
    path: Path
    tokenizer: Any
    """A Tokenizer, or None when the checkpoint has none."""
    device: str


def load(model: str, device: str, dtype: str | None = None) -> Loaded:
    from lumotree.serving.builtin import resolve_model
    from lumotree.serving.loader import load_model

    path = resolve_model(model)
    m, cfg = load_model(path, device, dtype)
    tok = None
    if (path / "tokenizer.json").is_file():
        try:
            from lumotree.serving.tokenizer import Tokenizer

            tok = Tokenizer(path)
        except Exception:  # a tokenizer we cannot read only costs the prefixes their realism
            tok = None
    return Loaded(m, cfg, path, tok, device)


def prefixes(loaded: Loaded, count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` prompts of at most ``length`` tokens: the snippets tokenized, or seeded random ids."""
    vocab = loaded.config.vocab_size
    out = []
    gen = torch.Generator().manual_seed(seed)
    for i in range(count):
        if loaded.tokenizer is not None:
            ids = list(loaded.tokenizer.encode(SNIPPETS[i % len(SNIPPETS)]))[-length:]
            if len(ids) >= 4:
                out.append([int(t) for t in ids])
                continue
        out.append(torch.randint(0, vocab, (length,), generator=gen).tolist())
    return out


class Sequence1:
    """One sequence in its own ``StateCaches``: prefill, decode, tree forwards, commit."""

    def __init__(
        self,
        loaded: Loaded,
        capacity: int,
        block_size: int = 16,
        seq_id: int = 0,
        caches: Any = None,
    ) -> None:
        from lumotree.serving.cache import CacheConfig, StateCaches

        self.model: Any = loaded.model
        self.caches: Any = caches or StateCaches(
            loaded.config,
            CacheConfig(max_seqs=4, num_blocks=capacity // block_size + 8, block_size=block_size),
            device=loaded.device,
            dtype=loaded.model.dtype,
        )
        self.sid = seq_id
        self.caches.allocate(seq_id, capacity)
        self.ctx = 0
        """Tokens committed to the state surfaces."""

    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Commit ``tokens``; returns the logits of the last one [V]."""
        b = self.caches.make_batch("prefill", [self.sid], [tokens], [self.ctx])
        h = self.model(b, self.caches)
        self.ctx += len(tokens)
        return self.model.compute_logits(h[-1:])[0]

    def decode(self, token: int) -> torch.Tensor:
        b = self.caches.make_batch("decode", [self.sid], [[token]], [self.ctx])
        h = self.model(b, self.caches)
        self.ctx += 1
        return self.model.compute_logits(h)[0]

    def tree(self, tokens: list[int], parents: list[int]) -> tuple[torch.Tensor, object, object]:
        """Tree forward rooted at the pending token ``tokens[0]``: (logits [N, V], record, batch)."""
        b = self.caches.make_batch("tree", [self.sid], [tokens], [self.ctx], [parents])
        h = self.model(b, self.caches)
        return self.model.compute_logits(h), self.model.tree_record, b

    @property
    def row(self) -> int:
        return self.caches.seqs[self.sid].state_row

    @property
    def blocks(self) -> list[int]:
        return self.caches.seqs[self.sid].blocks

    def kv_at(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [attn layers, len(positions), Hkv, D] at logical positions."""
        c = self.caches.kv
        slots = torch.tensor([c.slot(self.blocks, p) for p in positions], device=c.k.device)
        L, nb, bs = c.k.shape[:3]
        n_attn = len(self.model.config.attn_layers)  # type: ignore[attr-defined]  # MTP layers follow
        return tuple(x.view(L, nb * bs, *x.shape[3:])[:n_attn, slots] for x in (c.k, c.v))

    def gdn_state(self) -> torch.Tensor:
        return self.caches.recurrent.state[:, self.row]

    def conv_state(self) -> torch.Tensor:
        return self.caches.conv.state[:, self.row]
