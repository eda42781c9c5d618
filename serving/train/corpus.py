"""Training text: Python files of the running interpreter's stdlib and installed packages, split by file.

Files are found under the stdlib and site-packages folders of ``sys.prefix``, keyed by ``stdlib/<rel>`` or
``site/<rel>`` so that the key (and therefore the train/held-out split) does not depend on where Python lives.
A file is held out when ``sha256(key) % 100 < heldout_percent``; files go in hash order up to the cap,
so the choice is deterministic on one machine and the split of a given file is the same on every machine.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lumotree.serving.train.chats import transcript
from lumotree.serving.train.config import CorpusConfig

EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__", ".git", "lumotree"}


@dataclass(frozen=True)
class SourceFile:
    """One Python file of the corpus."""

    key: str
    """Machine-independent name: ``stdlib/<relative path>`` or ``site/<relative path>``."""
    text: str
    """File contents (UTF-8)."""
    heldout: bool
    """True when the file belongs to the held-out split."""


@dataclass
class Corpus:
    """Chosen files and the documents (source + synthetic transcripts) built from them, per split."""

    files: list[SourceFile]
    train_docs: list[str]
    heldout_docs: list[str]
    chat_docs: dict[str, int]

    def manifest(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for split, docs in (("train", self.train_docs), ("heldout", self.heldout_docs)):
            chosen = [f for f in self.files if f.heldout == (split == "heldout")]
            out[split] = {
                "files": len(chosen),
                "file_bytes": sum(len(f.text.encode()) for f in chosen),
                "documents": len(docs),
                "chat_documents": self.chat_docs[split],
                "bytes": sum(len(d.encode()) for d in docs),
            }
        return out


def path_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def is_heldout(key: str, percent: int) -> bool:
    return path_hash(key) % 100 < percent


def source_roots() -> list[tuple[str, Path]]:
    """(tag, folder) pairs: the stdlib and the (deduplicated) site-packages folders of this interpreter."""
    paths = sysconfig.get_paths()
    roots: list[tuple[str, Path]] = [("stdlib", Path(paths["stdlib"]))]
    seen = {Path(paths["stdlib"]).resolve()}
    for name in ("purelib", "platlib"):
        p = Path(paths[name])
        if p.is_dir() and p.resolve() not in seen:
            seen.add(p.resolve())
            roots.append(("site", p))
    return roots


def _candidates(cfg: CorpusConfig) -> Iterator[tuple[str, Path]]:
    for tag, root in source_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(
                d for d in dirnames if d not in EXCLUDED_DIRS and not d.endswith(".dist-info")
            )
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if cfg.min_file_bytes <= size <= cfg.max_file_bytes:
                    yield f"{tag}/{path.relative_to(root).as_posix()}", path


def _readable(path: Path, cfg: CorpusConfig) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text or max((len(line) for line in text.splitlines()), default=0) > cfg.max_line_chars:
        return None
    return text


def choose_files(cfg: CorpusConfig) -> list[SourceFile]:
    """Files in hash order until ``max_total_bytes``; duplicates (same content) kept once."""
    keyed = sorted(_candidates(cfg), key=lambda kp: (path_hash(kp[0]), kp[0]))
    chosen: list[SourceFile] = []
    seen_digests: set[bytes] = set()
    total = 0
    for key, path in keyed:
        text = _readable(path, cfg)
        if text is None:
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if digest in seen_digests:
            continue
        seen_digests.add(digest)
        chosen.append(SourceFile(key=key, text=text, heldout=is_heldout(key, cfg.heldout_percent)))
        total += len(text.encode())
        if total >= cfg.max_total_bytes:
            break
    chosen.sort(key=lambda f: f.key)
    if not any(f.heldout for f in chosen) or all(f.heldout for f in chosen):
        raise RuntimeError(f"corpus split is degenerate ({len(chosen)} files); raise max_total_bytes")
    return chosen


def build_corpus(cfg: CorpusConfig, seed: int) -> Corpus:
    """Source documents plus synthetic agent transcripts (each from a file of the same split)."""
    files = choose_files(cfg)
    rng = random.Random(seed)
    docs: dict[str, list[str]] = {"train": [], "heldout": []}
    chats = {"train": 0, "heldout": 0}
    # chat_fraction of all documents are transcripts: n_chat / (n_files + n_chat) = fraction.
    ratio = cfg.chat_fraction / max(1e-9, 1.0 - cfg.chat_fraction)
    by_split = {s: [f for f in files if f.heldout == (s == "heldout")] for s in docs}
    for split, split_files in by_split.items():
        docs[split].extend(f.text for f in split_files)
        n_chat = round(len(split_files) * ratio)
        for i in range(n_chat):
            f = split_files[rng.randrange(len(split_files))]
            docs[split].append(transcript(f.key, f.text, random.Random(f"{seed}:{split}:{i}")))
            chats[split] += 1
        random.Random(f"{seed}:{split}").shuffle(docs[split])
    return Corpus(files=files, train_docs=docs["train"], heldout_docs=docs["heldout"], chat_docs=chats)
