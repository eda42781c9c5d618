"""Gated DeltaNet layer: projections, causal conv over q|k|v, the delta-rule recurrence, gated norm,
out_proj."""

from __future__ import annotations

import torch
from torch import nn

from ...kernels import dispatch
from ..cache import StateCaches
from ..config import ModelConfig
from .context import ForwardContext
from .layers import FusedLinears, GatedRMSNorm, linear, project
from .record import ReplayStack, TreeRecord


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, pool_index: int) -> None:
        super().__init__()
        c = config
        self.pool_index = pool_index
        self.hk, self.hv = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        self.key_dim, self.value_dim = c.linear_key_dim, c.linear_value_dim
        self.kernel = c.linear_conv_kernel_dim
        self.scale = self.dk**-0.5
        self.in_proj_qkv = nn.Linear(c.hidden_size, c.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, self.hv, bias=False)
        # nn.Conv1d only for the checkpoint's name and shape [C, 1, W]; dispatch.gdn_prep applies it.
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, self.kernel, groups=c.conv_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, c.hidden_size, bias=False)
        self.fused: FusedLinears | None = None

    def _projections(self) -> list[nn.Linear]:
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def fuse(self) -> None:
        """The four input projections as one GEMM (``layers.FusedLinears``)."""
        self.fused = FusedLinears(self._projections())

    def forward(
        self, x: torch.Tensor, ctx: ForwardContext, caches: StateCaches, record: TreeRecord | None
    ) -> torch.Tensor:
        batch = ctx.batch
        R, S = x.shape[0], batch.num_seqs
        li = self.pool_index
        rows = batch.state_rows
        qkv, z, b, a = project(x, self._projections(), self.fused)
        z = z.view(R, self.hv, self.dv)

        conv_pool = caches.conv.state[li]
        conv_w = self.conv1d.weight[:, 0, :]
        heads = (self.hk, self.dk, self.hv, self.dv)
        if batch.mode == "decode":
            q, k, v, g, beta = dispatch.gdn_prep_decode(
                qkv, conv_pool, rows, conv_w, a, b, self.A_log, self.dt_bias, *heads
            )
        else:
            # Tree mode writes its replay operands into the record's stacked buffers (no extra copies).
            stack = None if record is None else self._replay_stack(record, caches, qkv, S)
            hist = conv_pool.index_select(0, rows).transpose(1, 2).reshape(S * (self.kernel - 1), -1)
            src_out = None if stack is None else stack.conv_src[li]
            src = torch.cat([hist.to(qkv.dtype), qkv], dim=0, out=src_out)
            if ctx.conv_last is not None:  # chains advance the conv history to their last rows' window tails
                tail = src[ctx.conv_win[ctx.conv_last, 1:]]  # [S, hist, C]
                conv_pool.index_copy_(0, rows, tail.transpose(1, 2).to(conv_pool.dtype))
            out = None if stack is None else stack.operands(li)
            q, k, v, g, beta = dispatch.gdn_prep(
                src, ctx.conv_win, conv_w, a, b, self.A_log, self.dt_bias, *heads, out=out
            )

        pool = caches.recurrent.state[li]
        if batch.mode == "decode":
            qt, kt, vt, gt, bt = (x[:, None] for x in (q, k, v, g, beta))
            o = dispatch.gdn_decode_rows_(qt, kt, vt, gt, bt, self.scale, pool, rows)[:, 0]
        elif batch.mode == "prefill":
            o, final = dispatch.gdn_prefill(
                q[None], k[None], v[None], g[None], beta[None], self.scale, pool.index_select(0, rows),
                batch.cu_seqlens,
            )  # fmt: skip
            pool.index_copy_(0, rows, final)
            o = o[0]
        else:
            assert batch.parents_host is not None
            o = dispatch.gdn_tree_batch(
                q, k, v, g, beta, batch.parents_host, pool, rows, self.scale, batch.padded_host
            )
        y = self.norm(o, z, x.dtype)
        return linear(y.reshape(R, self.value_dim), self.out_proj)

    def _replay_stack(
        self, record: TreeRecord, caches: StateCaches, qkv: torch.Tensor, S: int
    ) -> ReplayStack:
        """The record's [L, ...] operand buffers, allocated by the forward's first GDN layer."""
        if record.stack is None:
            heads = (self.hk, self.dk, self.hv, self.dv)
            record.stack = ReplayStack.empty(
                caches.recurrent.state.shape[0], qkv.shape[0], S * (self.kernel - 1), qkv.shape[1], heads,
                qkv.dtype, qkv.device,
            )  # fmt: skip
        return record.stack
