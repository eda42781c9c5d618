"""Checkpoints for the arm tests: a random transformers Qwen3.5 model plus random ``mtp.*`` weights (shapes
from the config) and a random EAGLE head in ``eagle/``; ``write_arms_checkpoint`` writes all three."""

from __future__ import annotations

from pathlib import Path

import torch
from checkpoints import LAYOUTS, add_mtp_weights, hf_model, tiny_config_dict

SMALL = {"gdn1_attn1": ["linear_attention", "full_attention"]}
"""Cheaper layouts for the sampling test (one GDN layer: the CPU tree reference steps node by node)."""


def write_arms_checkpoint(
    path: Path, seed: int = 0, vocab: int = 300, layout: str = "gdn3_attn1", eagle_inner: int = 96
) -> Path:
    from lumotree.serving.drafters.eagle import EagleHead, eagle_config

    cfg = tiny_config_dict(LAYOUTS.get(layout, SMALL.get(layout)), vocab=vocab)
    hf_model(cfg, seed).save_pretrained(path, safe_serialization=True)
    gen = torch.Generator().manual_seed(seed + 7)
    raw = add_mtp_weights(path, cfg, gen)
    torch.manual_seed(seed + 11)
    head = EagleHead(eagle_config(raw, eagle_inner))
    with torch.no_grad():
        for t in head.parameters():  # norms start at zero (1 + w): randomise everything
            t.copy_(torch.randn(t.shape, generator=gen) * (0.2 if t.dim() == 1 else 0.08))
    head.save_pretrained(path / "eagle", dtype=torch.float32)
    return path
