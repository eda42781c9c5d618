"""Byte-level BPE tokenizer for lumo-tiny, saved the way Hugging Face saves one (tokenizer.json + config)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from lumotree.serving.train.chats import CHAT_TEMPLATE

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Qwen2's split pattern: single digits, letter runs with one leading non-letter, whitespace runs kept whole
# (indentation becomes a few tokens), newlines grouped.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Fit byte-level BPE to ``texts``; the result has exactly ``vocab_size`` tokens, specials first."""
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # A small sample can stop short of vocab_size; the model's embedding is sized to the config, never less.
    assert tok.get_vocab_size() <= vocab_size, tok.get_vocab_size()
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    return tok


def tokenizer_config(max_length: int) -> dict[str, object]:
    """tokenizer_config.json as transformers writes it for a Qwen-style fast tokenizer."""
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
        "split_special_tokens": False,
    }


def save_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)  # compact: the 16 MiB budget counts it
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(max_length), indent=2) + "\n")


def eos_ids(tok: Tokenizer) -> list[int]:
    """End-of-turn and end-of-text, the generation stops of the built-in model."""
    ids = [tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)]
    assert all(i is not None for i in ids), "special tokens missing from the vocabulary"
    return [int(i) for i in ids if i is not None]
