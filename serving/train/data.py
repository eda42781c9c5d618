"""Token streams and batches: documents joined by ``<|endoftext|>``, random windows for training, fixed ones
for held-out evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer


@dataclass
class TokenData:
    """The two token streams (int32, 1-D); every document ends with the end-of-text id."""

    train: torch.Tensor
    heldout: torch.Tensor

    def __post_init__(self) -> None:
        assert self.train.dim() == 1 and self.heldout.dim() == 1, "streams are 1-D"
        assert self.train.dtype == torch.int32 and self.heldout.dtype == torch.int32


def encode_stream(tok: Tokenizer, docs: list[str], eot_id: int, chunk: int = 4096) -> torch.Tensor:
    pieces: list[torch.Tensor] = []
    for i in range(0, len(docs), chunk):
        for enc in tok.encode_batch(docs[i : i + chunk], add_special_tokens=False):
            pieces.append(torch.tensor(enc.ids + [eot_id], dtype=torch.int32))
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32)


def train_batch(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length] int64 windows at offsets drawn from the CPU generator ``gen``, gathered on the
    stream's device (keep the stream on the GPU: one gather per step, no host copies)."""
    assert stream.numel() > length, f"stream of {stream.numel()} tokens is shorter than one window ({length})"
    starts = torch.randint(0, stream.numel() - length, (batch, 1), generator=gen).to(stream.device)
    return stream[starts + torch.arange(length, device=stream.device)].long()


def eval_windows(stream: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """[count, length] windows spread evenly over the held-out stream (the same every evaluation)."""
    assert stream.numel() > length, f"held-out stream of {stream.numel()} tokens is shorter than {length}"
    span = stream.numel() - length
    starts = [round(i * span / max(1, count - 1)) for i in range(count)] if count > 1 else [0]
    return torch.stack([stream[s : s + length] for s in starts]).long()
