"""The network training optimizes: the Qwen3.5 text model plus its MTP layer, in Hugging Face weight names.

Training needs a cache-free, full-sequence, differentiable forward. transformers' ``Qwen3_5ForCausalLM`` is
exactly that (and the oracle our serving model is tested against), so the trunk is built from it; the MTP
layer follows vLLM's / Qwen's ``mtp.*`` layout: ``fc`` over ``[pre_fc_norm_embedding(embed(token_{t+1})),
pre_fc_norm_hidden(hidden_t)]``, one full-attention decoder layer, ``norm``, then the shared lm_head. Row t
predicts token t+2 and takes position t (vLLM's convention: a draft row keeps its hidden state's position).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lumotree.serving.drafters.eagle import FeatureHead, rope_grids, text_config
from lumotree.serving.train.config import ModelDims


def hf_config(dims: ModelDims, eos_token_ids: list[int], pad_token_id: int) -> dict[str, Any]:
    """config.json of the model, ``qwen3_5_text`` as transformers writes it (plus Qwen's MTP fields)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_hidden_layers,
        "layer_types": dims.layer_types(),
        "full_attention_interval": dims.full_attention_interval,
        "num_attention_heads": dims.num_attention_heads,
        "num_key_value_heads": dims.num_key_value_heads,
        "head_dim": dims.head_dim,
        "linear_num_key_heads": dims.linear_num_key_heads,
        "linear_num_value_heads": dims.linear_num_value_heads,
        "linear_key_head_dim": dims.linear_key_head_dim,
        "linear_value_head_dim": dims.linear_value_head_dim,
        "linear_conv_kernel_dim": dims.linear_conv_kernel_dim,
        "hidden_act": "silu",
        "max_position_embeddings": dims.max_position_embeddings,
        "rms_norm_eps": dims.rms_norm_eps,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": dims.rope_theta,
            "partial_rotary_factor": dims.partial_rotary_factor,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": dims.tie_word_embeddings,
        "mtp_num_hidden_layers": dims.mtp_num_hidden_layers,
        "mtp_use_dedicated_embeddings": False,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_token_ids,
        "pad_token_id": pad_token_id,
        "torch_dtype": "bfloat16",
    }


def use_torch_gdn() -> None:
    """Make transformers' Qwen3.5 use its pure-PyTorch GDN and conv (fla's Triton kernels need a GPU).

    transformers picks fla at import time when it is importable; on CPU that path fails, so the module's
    kernel globals are pointed back at the wrapped PyTorch functions.
    """
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
        fn = getattr(m, name)
        setattr(m, name, getattr(fn, "__wrapped__", fn))


class TrainLM(nn.Module):
    """Trunk + MTP with the losses' building blocks; ``hf_state_dict`` gives the shipped weight names."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        from transformers import Qwen3_5ForCausalLM

        self.config_dict = cfg
        config = text_config(cfg)
        config._attn_implementation = "sdpa"
        self.lm = Qwen3_5ForCausalLM(config)
        n_mtp = cfg["mtp_num_hidden_layers"]
        self.mtp = FeatureHead(config, n_mtp, pre_norms=True) if n_mtp > 0 else None
        if self.mtp is not None:
            self.mtp.apply(self.lm._init_weights)

    @property
    def embed(self) -> nn.Embedding:
        return self.lm.model.embed_tokens

    def rope(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        return self.lm.model.rotary_emb(x, rope_grids(pos))

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B, T, H] trunk output after the final norm (as the serving model's forward returns)."""
        return self.lm.model(input_ids=input_ids, use_cache=False).last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden)

    def mtp_step(self, next_embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """One MTP pass: embeddings of tokens t+1, features at t -> MTP features (logits via ``logits``)."""
        assert self.mtp is not None, "config has no MTP layer"
        return self.mtp(next_embeds, hidden, self.rope(hidden))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under the checkpoint's names; a tied lm_head is not stored (as transformers saves it)."""
        out = {k: v for k, v in self.lm.state_dict().items()}
        if self.config_dict["tie_word_embeddings"]:
            out.pop("lm_head.weight", None)
        if self.mtp is not None:
            out.update({f"mtp.{k}": v for k, v in self.mtp.state_dict().items()})
        return out
