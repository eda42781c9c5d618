"""Gated full attention: output gate from q_proj, q/k RMSNorm per head, partial RoPE, grouped KV, paged
cache."""

from __future__ import annotations

import torch
from torch import nn

from ...kernels import dispatch
from ...kernels.attention import paged_attention_ref, write_kv
from ..cache import StateCaches
from ..config import ModelConfig
from .context import ForwardContext
from .layers import FusedLinears, RMSNorm, linear, project


class GatedAttention(nn.Module):
    def __init__(self, config: ModelConfig, kv_index: int) -> None:
        super().__init__()
        c = config
        self.kv_index = kv_index
        self.hq, self.hkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.scale = self.d**-0.5
        # q_proj emits, per head, [query (D) | gate (D)].
        self.q_proj = nn.Linear(c.hidden_size, self.hq * self.d * 2, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.hkv * self.d, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.hkv * self.d, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.hq * self.d, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RMSNorm(self.d, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, c.rms_norm_eps)
        self.fused: FusedLinears | None = None

    def fuse(self) -> None:
        """q|k|v as one GEMM (``layers.FusedLinears``); projections with a bias stay separate."""
        if self.q_proj.bias is None:
            self.fused = FusedLinears([self.q_proj, self.k_proj, self.v_proj])

    def forward(self, x: torch.Tensor, ctx: ForwardContext, caches: StateCaches) -> torch.Tensor:
        R = x.shape[0]
        batch = ctx.batch
        qg, k, v = project(x, [self.q_proj, self.k_proj, self.v_proj], self.fused)
        qg = qg.view(R, self.hq, 2 * self.d)
        q_raw, gate = qg[..., : self.d], qg[..., self.d :]
        q = dispatch.norm_rope(q_raw, self.q_norm.weight, ctx.cos, ctx.sin, self.q_norm.eps)
        k = dispatch.norm_rope(
            k.view(R, self.hkv, self.d), self.k_norm.weight, ctx.cos, ctx.sin, self.k_norm.eps
        )
        v = v.view(R, self.hkv, self.d)
        kc, vc = caches.kv.k[self.kv_index], caches.kv.v[self.kv_index]
        write_kv(kc, vc, k, v, batch.slot_mapping)
        if batch.mode == "decode":
            assert ctx.decode_seq_lens is not None
            out = dispatch.gated_decode_attention(
                q, gate, kc, vc, batch.block_tables, ctx.decode_seq_lens, self.scale
            )
        else:
            fused = None
            if ctx.tree is not None:
                fused = dispatch.gated_tree_attention(
                    q, gate, kc, vc, batch.block_tables, batch.context_lens, *ctx.tree, self.scale
                )
            if fused is not None:
                return linear(fused, self.o_proj)
            assert ctx.seq_bounds is not None and ctx.new_visible is not None
            out = paged_attention_ref(
                q, kc, vc, batch.block_tables, batch.slot_mapping, ctx.seq_bounds, ctx.new_visible, self.scale
            )
            out = out.reshape(R, self.hq * self.d) * torch.sigmoid(gate.reshape(R, self.hq * self.d))
        return linear(out, self.o_proj)
