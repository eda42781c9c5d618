"""Incremental detokenization: append token ids, get the new text, never emit half a UTF-8 character."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


# Tokens of prompt context decoded with the first output tokens, so leading-space rules apply as in full text.
_CONTEXT = 4


class IncrementalDetokenizer:
    """Decodes a sliding window (prefix_offset..end) and emits what grew beyond the already-read part."""

    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int]) -> None:
        self.tok = tokenizer
        self.ids: list[int] = list(prompt_ids[-_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix) :]
        return ""
