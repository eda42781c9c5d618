"""Command line shared by ``lumotree train`` and ``python -m lumotree.serving.train`` (no typer needed)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from lumotree.serving.train.config import TrainConfig, tiny_test_config
from lumotree.serving.train.pipeline import STAGES, run

COMMANDS = {"tokenizer": ("tokenizer",), "model": ("model",), "eagle": ("eagle",), "all": STAGES}


def make_config(
    out: str,
    device: str = "cpu",
    steps: int = 0,
    minutes: float = 5.0,
    seed: int = 0,
    batch_size: int | None = None,
    seq_len: int | None = None,
    corpus_mb: float | None = None,
    tiny: bool = False,
) -> TrainConfig:
    """The run's config: defaults (or the tiny test shapes) with the command-line overrides applied."""
    cfg = tiny_test_config(out) if tiny else TrainConfig(out=out)
    cfg.device, cfg.steps, cfg.minutes, cfg.seed = device, steps, minutes, seed
    if batch_size is not None:
        cfg.batch_size = batch_size
    if seq_len is not None:
        cfg.seq_len = seq_len
    if corpus_mb is not None:
        cfg.corpus.max_total_bytes = int(corpus_mb * 1_000_000)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lumotree.serving.train", description="Train lumo-tiny.")
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument("--out", required=True, help="output folder (the model lands in OUT/lumo-tiny)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=0, help="model steps (0 = use --minutes)")
    p.add_argument("--minutes", type=float, default=5.0, help="training wall-time budget, model + EAGLE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--corpus-mb", type=float, default=None, help="cap on source bytes taken into the corpus")
    p.add_argument("--tiny", action="store_true", help="test-sized model and corpus (seconds on CPU)")
    a = p.parse_args(argv)
    cfg = make_config(
        a.out, a.device, a.steps, a.minutes, a.seed, a.batch_size, a.seq_len, a.corpus_mb, a.tiny
    )
    run(cfg, COMMANDS[a.command])
    return 0
