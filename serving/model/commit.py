"""Publish an accepted tree path to all three state surfaces, on the device, without host reads.

``accepted_rows`` [S, D]: per sequence the accepted path's tree rows (local indices), root (the pending token
of the previous step) first, padded with -1. The next pending token is not in it: it is not state-advanced.

Every surface is published for all layers at once (the record stacks the GDN operands [L, ...] and the pools
are [L, rows, ...]), so the commit is a fixed number of kernels whatever the depth of the model.

- Recurrent: the recorded operands of the path replay through AR decoding's entry point
  (``dispatch.gdn_decode_rows_``) from the pre-tree state, one launch with layers x sequences as its
  batch; padded steps carry g = 0, beta = 0, which leave the state bitwise unchanged (exp(0) = 1, u = 0),
  so the published fp32 state is bitwise that of decoding the path.
- Conv: the new history is the last (kernel - 1) pre-conv inputs along [old history ; path].
- KV: the accepted rows' K/V move from their tree slots to the slots of logical positions context_len + j
  (with spine-contiguous slots the common case copies a row onto itself).
"""

from __future__ import annotations

import torch

from ...kernels import dispatch
from ..cache import StateCaches
from .record import ReplayStack, TreeRecord


def publish_recurrent(
    ops: ReplayStack, rows: torch.Tensor, valid: torch.Tensor, state_rows: torch.Tensor, pool: torch.Tensor,
    scale: float,
) -> None:  # fmt: skip
    """Replay every layer's path in ONE launch: layers x sequences fold into the kernel's batch, whose
    entries never interact, so each (batch, head) computes exactly what a per-layer launch would. Only q, k,
    v, g and beta of ``ops`` are read, at the accepted rows (``dispatch.gdn_replay_rows_``; steps past a
    path's end are skipped). Temporaries in the gather form: the padded operands, the gathered pre-tree
    states and the kernel's final states, each [L * S, ...]; none in the rows form."""
    L, n = pool.shape[:2]
    R = ops.q.shape[1]
    # (layer, sequence) -> row of the [L * rows] pool view: dim-0 row copies run twice as fast as dim-1 ones
    flat_rows = (torch.arange(L, device=pool.device)[:, None] * n + state_rows[None, :]).reshape(-1)
    flat = pool.view(L * n, *pool.shape[2:])
    layer0 = torch.arange(L, device=rows.device).view(L, 1, 1) * R
    steps = torch.where(valid[None], layer0 + rows[None], -1).flatten(0, 1)  # [L * S, D] rows of [L * R]
    q, k, v, g, beta = (x.flatten(0, 1) for x in (ops.q, ops.k, ops.v, ops.g, ops.beta))
    dispatch.gdn_replay_rows_(q, k, v, g, beta, scale, flat, flat_rows, steps)


def _publish_conv(
    ops: ReplayStack, rows: torch.Tensor, lens: torch.Tensor, state_rows: torch.Tensor, conv: torch.Tensor
) -> None:
    """New history of every layer = the last (kernel - 1) pre-conv inputs along [old history ; path]."""
    L, S, D = conv.shape[0], *rows.shape
    C, hist = conv.shape[2:]
    j = lens[:, None] - hist + torch.arange(hist, device=rows.device)[None, :]  # path index of each new tap
    from_path = (j >= 0).view(1, S, 1, hist)
    path_row = rows.gather(1, j.clamp(0, D - 1))  # [S, hist]
    path_tap = ops.conv_in.index_select(1, path_row.reshape(-1)).view(L, S, hist, C).transpose(2, 3)
    old = conv.index_select(1, state_rows)  # [L, S, C, hist]
    old_tap = old.gather(3, (j + hist).clamp(0, hist - 1).view(1, S, 1, hist).expand(L, S, C, hist))
    conv.index_copy_(1, state_rows, torch.where(from_path, path_tap.to(conv.dtype), old_tap))


def commit_tree(record: TreeRecord, accepted_rows: torch.Tensor, caches: StateCaches) -> torch.Tensor:
    """Replay, gather and remap the accepted paths; returns the accepted lengths [S] (context_lens advance by
    it)."""
    batch = record.batch
    S, D = accepted_rows.shape
    assert S == batch.num_seqs and D >= 1
    device = batch.input_ids.device
    acc = accepted_rows.to(device=device, dtype=torch.long)
    valid = acc >= 0
    lens = valid.sum(1)
    rows = batch.cu_seqlens[:-1, None] + acc.clamp_min(0)  # packed row of each path step
    if record.stack is not None:
        publish_recurrent(record.stack, rows, valid, batch.state_rows, caches.recurrent.state, record.scale)
        _publish_conv(record.stack, rows, lens, batch.state_rows, caches.conv.state)

    # KV: every path step j moves from its tree slot to the slot of logical position context_len + j.
    steps = torch.where(valid, torch.arange(D, device=device)[None, :], 0)
    pos = batch.context_lens[:, None] + steps
    bs = caches.block_size
    dst = batch.block_tables.gather(1, pos // bs) * bs + pos % bs
    src = batch.slot_mapping[rows.reshape(-1)].view(S, D)
    # Padded steps repeat step 0's move (a harmless duplicate write) instead of touching other slots.
    src = torch.where(valid, src, src[:, :1]).reshape(-1)
    dst = dst.reshape(-1)
    L, nb = caches.kv.k.shape[:2]
    for cache in (caches.kv.k, caches.kv.v):
        flat = cache.view(L, nb * bs, *cache.shape[3:])
        flat[:, dst] = flat[:, src]
    return lens
