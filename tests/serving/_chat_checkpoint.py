"""A random tiny checkpoint plus a small byte-level BPE tokenizer (built here with ``tokenizers``) and a
ChatML chat template: everything the server and the CLI need, written in a temporary directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "import numpy as np\nprint(np.arange(10))\n",
    "Hello world! How are you today? Fine, thanks.",
    "for i in range(10):\n    print(i * i)\n",
] * 20


def write_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def chat_checkpoint(src: Path, dst: Path) -> Path:
    """Copy a tiny checkpoint and add a tokenizer whose vocabulary fits the model's."""
    shutil.copytree(src, dst)
    vocab = json.loads((dst / "config.json").read_text())["vocab_size"]
    write_tokenizer(dst, vocab)
    return dst
