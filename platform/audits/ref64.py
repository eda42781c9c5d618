"""A float64 reference of the Qwen3.5 hybrid model, token by token, written independently of the serving
code (only the weights are shared): the yardstick of the model audit.

Per token: zero-centred RMSNorm (x / rms * (1 + w)); GDN layers: q|k|v projection, causal depthwise conv
over (last kernel-1 inputs, this one) + SiLU, l2-normalised q and k (eps 1e-6), g = -exp(A_log)
softplus(a + dt_bias), beta = sigmoid(b), the delta rule S = e^g S; u = beta (v - S^T k); S += k u^T;
o = S^T q K^-0.5, gated RMSNorm w * o / rms(o) * silu(z), out_proj; gated attention: q_proj gives
[query | gate] per head, per-head (1 + w) norms on q and k, partial rotate-half RoPE, grouped heads over
all earlier positions, times sigmoid(gate), o_proj; SwiGLU MLP; final norm; lm_head.
"""

from __future__ import annotations

import math
from typing import Any

import torch

F64 = torch.float64


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


class Reference64:
    """The state surfaces of one sequence in float64, advanced one token at a time."""

    def __init__(self, model: torch.nn.Module) -> None:
        c: Any = model.config
        self.c: Any = c
        self.p = {k: v.detach().to("cpu", F64) for k, v in model.state_dict().items()}
        if "lm_head.weight" not in self.p:
            self.p["lm_head.weight"] = self.p["embed_tokens.weight"]
        self.types = list(c.layer_types)
        self.gdn_index = {li: i for i, li in enumerate(c.gdn_layers)}
        self.attn_index = {li: i for i, li in enumerate(c.attn_layers)}
        hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        self.S = torch.zeros(len(c.gdn_layers), hv, dk, dv, dtype=F64)
        self.conv = torch.zeros(len(c.gdn_layers), c.conv_dim, c.linear_conv_kernel_dim - 1, dtype=F64)
        self.K: list[list[torch.Tensor]] = [[] for _ in c.attn_layers]
        self.V: list[list[torch.Tensor]] = [[] for _ in c.attn_layers]
        rd = c.rotary_dim
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, rd, 2, dtype=F64) / rd))
        self.pos = 0

    def clone(self) -> Reference64:
        other = object.__new__(Reference64)
        other.__dict__.update(self.__dict__)
        other.S, other.conv = self.S.clone(), self.conv.clone()
        other.K, other.V = [list(x) for x in self.K], [list(x) for x in self.V]
        return other

    def _w(self, name: str) -> torch.Tensor:
        return self.p[name]

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        rd = self.inv_freq.numel() * 2
        f = self.pos * self.inv_freq
        emb = torch.cat([f, f])
        cos, sin = emb.cos(), emb.sin()
        xr, xp = x[..., :rd], x[..., rd:]
        rot = torch.cat([-xr[..., rd // 2 :], xr[..., : rd // 2]], -1)
        return torch.cat([xr * cos + rot * sin, xp], -1)

    def _gdn(self, li: int, h: torch.Tensor) -> torch.Tensor:
        c, i, pre = self.c, self.gdn_index[li], f"layers.{li}.linear_attn."
        hk, hv, dk, dv = (
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )
        qkv = self._w(pre + "in_proj_qkv.weight") @ h
        z = (self._w(pre + "in_proj_z.weight") @ h).view(hv, dv)
        b = self._w(pre + "in_proj_b.weight") @ h
        a = self._w(pre + "in_proj_a.weight") @ h
        window = torch.cat([self.conv[i], qkv[:, None]], 1)  # [C, W] oldest first
        self.conv[i] = window[:, 1:]
        mixed = torch.nn.functional.silu((window * self._w(pre + "conv1d.weight")[:, 0, :]).sum(-1))
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv])
        q = q.view(hk, dk)
        k = k.view(hk, dk)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q.repeat_interleave(hv // hk, 0) * dk**-0.5
        k = k.repeat_interleave(hv // hk, 0)
        v = v.view(hv, dv)
        g = -torch.exp(self._w(pre + "A_log")) * torch.nn.functional.softplus(a + self._w(pre + "dt_bias"))
        beta = torch.sigmoid(b)
        S = self.S[i] * torch.exp(g)[:, None, None]
        u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", S, k))
        S = S + k[:, :, None] * u[:, None, :]
        self.S[i] = S
        o = torch.einsum("hkv,hk->hv", S, q)
        y = self._w(pre + "norm.weight") * _rms(o, c.rms_norm_eps) * torch.nn.functional.silu(z)
        return self._w(pre + "out_proj.weight") @ y.reshape(-1)

    def _attn(self, li: int, h: torch.Tensor) -> torch.Tensor:
        c, i, pre = self.c, self.attn_index[li], f"layers.{li}.self_attn."
        hq, hkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim

        def lin(name: str) -> torch.Tensor:
            out = self._w(pre + name + ".weight") @ h
            bias = self.p.get(pre + name + ".bias")
            return out if bias is None else out + bias

        qg = lin("q_proj").view(hq, 2 * d)
        q, gate = qg[:, :d], qg[:, d:]
        q = self._rope(_rms(q, c.rms_norm_eps) * (1 + self._w(pre + "q_norm.weight")))
        k = self._rope(
            _rms(lin("k_proj").view(hkv, d), c.rms_norm_eps) * (1 + self._w(pre + "k_norm.weight"))
        )
        v = lin("v_proj").view(hkv, d)
        self.K[i].append(k)
        self.V[i].append(v)
        K, V = torch.stack(self.K[i]), torch.stack(self.V[i])  # [L, hkv, d]
        qh = q.view(hkv, hq // hkv, d)
        scores = torch.einsum("hgd,lhd->hgl", qh, K) / math.sqrt(d)
        out = torch.einsum("hgl,lhd->hgd", torch.softmax(scores, -1), V).reshape(hq * d)
        out = out * torch.sigmoid(gate.reshape(-1))
        w = self._w(pre + "o_proj.weight") @ out
        bias = self.p.get(pre + "o_proj.bias")
        return w if bias is None else w + bias

    def step(self, token: int) -> torch.Tensor:
        """Advance by one token; returns its next-token logits [V] float64."""
        c = self.c
        x = self.p["embed_tokens.weight"][token].clone()
        for li, t in enumerate(self.types):
            pre = f"layers.{li}."
            h = _rms(x, c.rms_norm_eps) * (1 + self._w(pre + "input_layernorm.weight"))
            x = x + (self._gdn(li, h) if t == "linear_attention" else self._attn(li, h))
            h = _rms(x, c.rms_norm_eps) * (1 + self._w(pre + "post_attention_layernorm.weight"))
            gate = self._w(pre + "mlp.gate_proj.weight") @ h
            up = self._w(pre + "mlp.up_proj.weight") @ h
            x = x + self._w(pre + "mlp.down_proj.weight") @ (torch.nn.functional.silu(gate) * up)
        self.pos += 1
        x = _rms(x, c.rms_norm_eps) * (1 + self.p["norm.weight"])
        return self.p["lm_head.weight"] @ x

    def kv(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [attn layers, len(positions), Hkv, D]."""
        return (
            torch.stack([torch.stack([self.K[i][p] for p in positions]) for i in range(len(self.K))]),
            torch.stack([torch.stack([self.V[i][p] for p in positions]) for i in range(len(self.V))]),
        )
