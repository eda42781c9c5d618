"""EAGLE-style feature-level draft head for the hybrid target (weights in ``<model>/eagle/``).

Row t: ``fc([embed(token_{t+1}), f_t])`` -> one full-attention decoder layer -> ``norm`` -> the target's
shared lm_head, where ``f_t`` is the target's hidden state at t (after its final norm) or, when drafting a
chain, the head's own previous output. The head predicts ``f_{t+1}`` and token t+2. Row t takes position t
(vLLM's convention). Qwen3.5's MTP layer is the same shape with RMSNorms in front of ``fc``: one class serves
both.

Checkpoint: ``eagle/config.json`` is a ``qwen3_5_text`` config with one ``full_attention`` layer (so the
serving ``ModelConfig`` parses it and the serving decoder layer can be built from it) plus an ``eagle`` block;
``eagle/model.safetensors`` holds ``fc.weight``, ``layers.0.*`` and ``norm.weight`` (no embedding or lm_head).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

EAGLE_DIR = "eagle"


def text_config(cfg: dict[str, Any]) -> Any:
    """transformers' ``Qwen3_5TextConfig`` from a config.json dict."""
    from transformers import Qwen3_5TextConfig

    # Only fields transformers knows: the MTP/EAGLE extras are read from the dict by our own modules.
    extras = ("architectures", "model_type", "torch_dtype", "eagle", "full_attention_interval",
              "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")  # fmt: skip
    known = {k: v for k, v in cfg.items() if k not in extras}
    return Qwen3_5TextConfig(**known)


class FeatureHead(nn.Module):
    """fc over [embedding, feature] + decoder layers + norm. ``pre_norms``: Qwen's MTP layout (mtp.*)."""

    def __init__(self, config: Any, num_layers: int, pre_norms: bool) -> None:
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        assert num_layers >= 1, num_layers
        layer_cfg = copy.deepcopy(config)
        layer_cfg.layer_types = ["full_attention"] * num_layers
        layer_cfg.num_hidden_layers = num_layers
        h, eps = config.hidden_size, config.rms_norm_eps
        if pre_norms:
            self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
            self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_norms = pre_norms
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(Qwen3_5DecoderLayer(layer_cfg, i) for i in range(num_layers))
        self.norm = Qwen3_5RMSNorm(h, eps=eps)

    def forward(
        self, next_embeds: torch.Tensor, features: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """[B, T, H] embeddings of tokens t+1 and features at t -> [B, T, H] features for t+1 (causal)."""
        assert next_embeds.shape == features.shape, (next_embeds.shape, features.shape)
        if self.pre_norms:
            next_embeds, features = self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(features)
        x = self.fc(torch.cat([next_embeds, features], dim=-1))
        for layer in self.layers:
            x = layer(x, position_embeddings=rope)
        return self.norm(x)


def eagle_config(target_config: dict[str, Any], intermediate_size: int) -> dict[str, Any]:
    """eagle/config.json from the target's config.json: its attention shapes, one full-attention layer."""
    cfg = dict(target_config)
    cfg.update(
        architectures=["LumoEagleHead"],
        num_hidden_layers=1,
        layer_types=["full_attention"],
        intermediate_size=intermediate_size,
        mtp_num_hidden_layers=0,
        eagle={"inputs": ["embed(token_t+1)", "target_hidden_t"], "shares": ["embed_tokens", "lm_head"]},
    )
    cfg.pop("full_attention_interval", None)
    return cfg


def rope_grids(positions: torch.Tensor) -> torch.Tensor:
    """[B, T] text positions -> the (3, B, T) grids Qwen3.5's rotary takes (older transformers index that
    axis)."""
    return positions.expand(3, *positions.shape[-2:]) if positions.ndim == 2 else positions


class EagleHead(nn.Module):
    """The draft head; ``embed`` and ``lm_head`` stay the target's and are passed in, never stored."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        assert config["layer_types"] == ["full_attention"], config["layer_types"]
        self.config_dict = config
        tc = text_config(config)
        tc._attn_implementation = "sdpa"
        self.head = FeatureHead(tc, num_layers=1, pre_norms=False)
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

        self.rotary = Qwen3_5TextRotaryEmbedding(tc)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(x, rope_grids(positions))

    def forward(
        self, next_embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """[B, T, H] x2, positions [B, T] -> predicted next features [B, T, H] (for the target lm_head)."""
        return self.head(next_embeds, features, self.rope(features, positions))

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(self.config_dict, indent=2) + "\n")
        weights = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.head.state_dict().items()}
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> EagleHead:
        """Load ``<path>/config.json`` + ``model.safetensors`` (``path`` is the eagle folder itself)."""
        from safetensors.torch import load_file

        p = Path(path)
        if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
            raise FileNotFoundError(f"{p}: an EAGLE head needs config.json and model.safetensors")
        head = cls(json.loads((p / "config.json").read_text()))
        state = load_file(str(p / "model.safetensors"))
        missing, unexpected = head.head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{p}/model.safetensors: missing {missing}, unexpected {unexpected}")
        return head.to(device=device, dtype=dtype).eval()


class EagleLayer(nn.Module):
    """The head on the serving stack (paged KV of its own, the same attention kernels as the target):
    ``fc`` -> one full-attention ``DecoderLayer`` -> ``norm``; loads ``eagle/model.safetensors`` as is."""

    def __init__(self, config: Any) -> None:  # config: serving ModelConfig of eagle/config.json
        super().__init__()
        from ..model.layers import RMSNorm
        from ..model.model import DecoderLayer

        h = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(config, "full_attention", 0)])
        self.norm = RMSNorm(h, config.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, ctx: Any, caches: Any) -> torch.Tensor:
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.norm(self.layers[0](x, ctx, caches, None))

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str, dtype: torch.dtype) -> EagleLayer:
        from safetensors.torch import load_file

        from ..config import ModelConfig

        p = Path(path)
        if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
            raise FileNotFoundError(f"{p}: an EAGLE head needs config.json and model.safetensors")
        layer = cls(
            ModelConfig.from_dict(json.loads((p / "config.json").read_text()), str(p / "config.json"))
        )
        state = load_file(str(p / "model.safetensors"))
        layer.load_state_dict(state, strict=True)
        from ..model.layers import fuse_projections

        layer = layer.to(device=device, dtype=dtype).eval()
        fuse_projections(layer)
        return layer


def random_eagle_layer(target_config: Any, device: torch.device | str, dtype: torch.dtype, std: float = 0.02,
                       intermediate_size: int | None = None) -> EagleLayer:  # fmt: skip
    """A random head with the target's shapes (benchmarks: its cost does not depend on its weights)."""
    import dataclasses

    cfg = dataclasses.replace(
        target_config, layer_types=("full_attention",), mtp_num_hidden_layers=0,
        intermediate_size=intermediate_size or target_config.intermediate_size,
    )  # fmt: skip
    layer = EagleLayer(cfg).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            _ = p.zero_() if p.dim() == 1 else p.normal_(0.0, std)
    from ..model.layers import fuse_projections

    fuse_projections(layer)
    return layer.eval()


def eagle_drafter(model: Any, head: EagleLayer | str | Path, max_seqs: int, num_blocks: int, block_size: int,
                  steps: int = 7) -> Any:  # fmt: skip
    """A chained drafter (``steps`` head passes, top-1) over an EAGLE head (a layer or its folder), own KV."""
    from ..cache import CacheConfig, StateCaches
    from .feature import ChainConfig, FeatureDrafter

    device = next(model.parameters()).device
    if not isinstance(head, EagleLayer):
        head = EagleLayer.from_pretrained(head, device, model.dtype)
    if head.config.hidden_size != model.config.hidden_size:
        raise ValueError(f"EAGLE head hidden size {head.config.hidden_size} != the target's")
    caches = StateCaches(
        head.config, CacheConfig(max_seqs=max_seqs, num_blocks=num_blocks, block_size=block_size),
        device, model.dtype,
    )  # fmt: skip
    layer_module = head

    def layer(embeds: torch.Tensor, feats: torch.Tensor, batch: Any, c: Any) -> torch.Tensor:
        return layer_module(embeds, feats, model.context(batch), c)

    drafter = FeatureDrafter(
        layer, model.embed_tokens, model.compute_logits, caches, ChainConfig(steps, 1), True
    )
    drafter.head = head  # type: ignore[attr-defined]  # keep the module alive with the drafter
    return drafter
