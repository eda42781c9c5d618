"""``HybridModel``: the Qwen3.5 text model (GDN + gated attention) over packed batches and explicit caches."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..batch import ForwardBatch
from ..cache import StateCaches
from ..config import LINEAR, ModelConfig
from .attention import GatedAttention
from .commit import commit_tree
from .context import ForwardContext, build_context
from .gdn import GatedDeltaNet
from .layers import MLP, RMSNorm, fuse_projections, linear, rope_inv_freq
from .record import TreeRecord


class DecoderLayer(nn.Module):
    """Pre-norm residual block: token mixer (GDN or gated attention) then SwiGLU MLP."""

    def __init__(self, config: ModelConfig, layer_type: str, state_index: int) -> None:
        super().__init__()
        self.layer_type = layer_type
        if layer_type == LINEAR:
            self.linear_attn = GatedDeltaNet(config, state_index)
        else:
            self.self_attn = GatedAttention(config, state_index)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, ctx: ForwardContext, caches: StateCaches, record: TreeRecord | None
    ) -> torch.Tensor:
        x, out = self.mix(x, None, ctx, caches, record)
        return x + out

    def mix(
        self,
        x: torch.Tensor,
        pending: torch.Tensor | None,
        ctx: ForwardContext,
        caches: StateCaches,
        record: TreeRecord | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, this layer's MLP output not yet added to it). ``pending``, the previous
        layer's MLP output, is added inside this layer's input norm: one kernel fewer per layer in decode,
        and the same rounding (the sum is rounded to the activation dtype either way)."""
        if pending is None:
            h = self.input_layernorm(x)
        else:
            h, x = self.input_layernorm.add_forward(pending, x)
        if self.layer_type == LINEAR:
            h = self.linear_attn(h, ctx, caches, record)
        else:
            h = self.self_attn(h, ctx, caches)
        normed, x = self.post_attention_layernorm.add_forward(h, x)
        return x, self.mlp(normed)


class MTP(nn.Module):
    """Multi-token prediction head (``mtp.*``): fc over [norm(embed(token)), norm(hidden)], full-attention
    decoder
    layers whose KV lives after the model's own attention layers, a final norm; embedding and lm_head
    shared."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        n_attn = len(config.attn_layers)
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(config, "full_attention", n_attn + i) for i in range(config.mtp_num_hidden_layers)
        )
        self.norm = RMSNorm(h, config.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        ctx: ForwardContext,
        caches: StateCaches,
        step: int = 0,
    ) -> torch.Tensor:
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = linear(x, self.fc)
        x = self.layers[step % len(self.layers)](x, ctx, caches, None)
        return self.norm(x)


class HybridModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        gdn_index = {layer: i for i, layer in enumerate(c.gdn_layers)}
        attn_index = {layer: i for i, layer in enumerate(c.attn_layers)}
        self.layers = nn.ModuleList(
            DecoderLayer(c, t, gdn_index[i] if t == LINEAR else attn_index[i])
            for i, t in enumerate(c.layer_types)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.mtp: MTP | None = MTP(c) if c.mtp_num_hidden_layers > 0 else None
        # RoPE inverse frequencies stay fp32 whatever dtype the weights take (kept outside the module's
        # buffers so .to(bfloat16) cannot round them), one copy per device.
        self._inv_freq: dict[torch.device, torch.Tensor] = {}
        self.tree_record: TreeRecord | None = None
        """The replay operands of the latest tree-mode forward."""

    def fuse_projections(self) -> HybridModel:
        """Give every layer's same-input projections one weight block each (GDN qkv|z|b|a, attention q|k|v,
        MLP gate|up): fewer, larger GEMMs per step (see ``layers.fuse_projections``)."""
        fuse_projections(self)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            freq = rope_inv_freq(self.config.rotary_dim, self.config.rope_theta, device)
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return freq  # only valid inside the graph being captured: do not cache it
            self._inv_freq[device] = freq
        return self._inv_freq[device]

    def context(self, batch: ForwardBatch) -> ForwardContext:
        return build_context(batch, self.config, self.inv_freq(batch.input_ids.device), self.dtype)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, caches: StateCaches) -> torch.Tensor:
        """Hidden states [R, H] after the final norm. Prefill/decode advance the recurrent and conv rows and
        write KV; tree mode writes only the tree rows' K/V and leaves its replay operands in
        ``self.tree_record``."""
        ctx = self.context(batch)
        record = TreeRecord(batch, self.config.linear_key_head_dim**-0.5) if batch.mode == "tree" else None
        x, pending = self.embed_tokens(batch.input_ids), None
        for layer in cast("list[DecoderLayer]", self.layers):
            x, pending = layer.mix(x, pending, ctx, caches, record)
        if record is not None:
            self.tree_record = record
        return self.norm(x) if pending is None else self.norm.add_forward(pending, x)[0]

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, V] fp32 logits."""
        return linear(hidden, self.lm_head).float()

    @torch.no_grad()
    def forward_mtp(
        self, batch: ForwardBatch, hidden: torch.Tensor, caches: StateCaches, step: int = 0
    ) -> torch.Tensor:
        """One MTP pass: row r predicts the token after ``batch.input_ids[r]`` from the target's hidden [R,
        H] of
        the previous position. Returns the MTP hidden [R, H] (logits via ``compute_logits``). Writes MTP
        KV."""
        assert self.mtp is not None, "this checkpoint has no MTP layers"
        return self.mtp(self.embed_tokens(batch.input_ids), hidden, self.context(batch), caches, step)

    @torch.no_grad()
    def commit(self, record: TreeRecord, accepted_rows: torch.Tensor, caches: StateCaches) -> torch.Tensor:
        """Publish each sequence's accepted path (see ``commit.commit_tree``); returns accepted lengths
        [S]."""
        return commit_tree(record, accepted_rows, caches)
