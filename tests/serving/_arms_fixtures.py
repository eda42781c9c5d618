"""Checkpoints for the arm tests: a random transformers Qwen3.5 model plus random ``mtp.*`` weights (shapes
from the config) and a random EAGLE head in ``eagle/``; ``write_arms_checkpoint`` writes all three."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from checkpoints import LAYOUTS, _attn_layer_shapes, hf_model, tiny_config_dict

SMALL = {"gdn1_attn1": ["linear_attention", "full_attention"]}
"""Cheaper layouts for the sampling test (one GDN layer: the CPU tree reference steps node by node)."""


def write_arms_checkpoint(
    path: Path, seed: int = 0, vocab: int = 300, layout: str = "gdn3_attn1", eagle_inner: int = 96
) -> Path:
    from safetensors.torch import load_file, save_file

    from lumotree.serving.drafters.eagle import EagleHead, eagle_config

    cfg = tiny_config_dict(LAYOUTS.get(layout, SMALL.get(layout)), vocab=vocab)
    hf_model(cfg, seed).save_pretrained(path, safe_serialization=True)
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 7)
    h = cfg["hidden_size"]
    extra = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
             "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}  # fmt: skip
    p = "model.layers.3."
    extra.update({f"mtp.layers.0.{k[len(p) :]}": v for k, v in _attn_layer_shapes(cfg).items()})
    for k, shape in extra.items():
        tensors[k] = torch.randn(shape, generator=gen) * (0.2 if len(shape) == 1 else 0.08)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(seed + 11)
    head = EagleHead(eagle_config(raw, eagle_inner))
    with torch.no_grad():
        for t in head.parameters():  # norms start at zero (1 + w): randomise everything
            t.copy_(torch.randn(t.shape, generator=gen) * (0.2 if t.dim() == 1 else 0.08))
    head.save_pretrained(path / "eagle", dtype=torch.float32)
    return path
