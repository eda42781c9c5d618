"""Random small Qwen3.5 checkpoints written by transformers' own ``Qwen3_5ForCausalLM`` (the test oracle)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

LAYOUTS = {
    "gdn3_attn1": ["linear_attention"] * 3 + ["full_attention"],
    "attn_first": ["full_attention", "linear_attention", "linear_attention"],
    "alternating": ["linear_attention", "full_attention"] * 2,
}


def tiny_config_dict(layer_types: list[str], tie: bool = False, vocab: int = 300) -> dict:
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": len(layer_types),
        "layer_types": layer_types,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tie,
        "eos_token_id": vocab - 1,
    }


def hf_model(cfg: dict, seed: int = 0):  # -> Qwen3_5ForCausalLM
    """A transformers model with every weight random (norm weights too, so the 1 + w convention is tested)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    model = Qwen3_5ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 4, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.dim() == 1:
                p.copy_(
                    torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if "linear_attn.norm" in name else 0.0)
                )
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)
    return model


def write_checkpoint(
    path: Path, layer_types: list[str], seed: int = 0, tie: bool = False, mtp: bool = False
) -> Path:
    """Save a random transformers model to ``path`` (config.json + model.safetensors); with ``mtp`` add random
    ``mtp.*`` tensors (one full-attention layer) and ``mtp_num_hidden_layers: 1``. Returns ``path``."""
    cfg = tiny_config_dict(layer_types, tie=tie)
    model = hf_model(cfg, seed)
    model.save_pretrained(path, safe_serialization=True)
    if mtp:
        add_mtp_weights(path, cfg, torch.Generator().manual_seed(seed + 7))
    return path


def add_mtp_weights(path: Path, cfg: dict, gen: torch.Generator) -> dict:
    """Add random ``mtp.*`` tensors (one full-attention layer) to the checkpoint at ``path`` and set
    ``mtp_num_hidden_layers: 1`` in its config; returns the new config."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    h = cfg["hidden_size"]
    layer = {k[len("model.layers.3.") :]: v for k, v in _attn_layer_shapes(cfg).items()}
    extra = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
             "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}  # fmt: skip
    extra.update({f"mtp.layers.0.{k}": v for k, v in layer.items()})
    for k, shape in extra.items():
        tensors[k] = torch.randn(shape, generator=gen) * (0.2 if len(shape) == 1 else 0.08)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(raw))
    return dict(raw)


def _attn_layer_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, d, ff = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    p = "model.layers.3."
    return {
        p + "self_attn.q_proj.weight": (hq * d * 2, h), p + "self_attn.k_proj.weight": (hkv * d, h),
        p + "self_attn.v_proj.weight": (hkv * d, h), p + "self_attn.o_proj.weight": (h, hq * d),
        p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
        p + "mlp.gate_proj.weight": (ff, h), p + "mlp.up_proj.weight": (ff, h),
        p + "mlp.down_proj.weight": (h, ff),
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
    }  # fmt: skip
