"""Publish an accepted tree path to all three state surfaces, on the device, without host reads.

``accepted_rows`` [S, D]: per sequence the accepted path's tree rows (local indices), root (the pending token
of
the previous step) first, padded with -1. The next pending token is not in it: it is not state-advanced.

- Recurrent: the recorded operands of the path replay through the native decode kernel
  (``dispatch.gdn_decode``) from the pre-tree state; padded steps carry g = 0, beta = 0, which leave the state
  bitwise unchanged (exp(0) = 1, u = 0), so the published fp32 state is bitwise that of decoding the path.
- Conv: the new history is the last (kernel - 1) pre-conv inputs along [old history ; path].
- KV: the accepted rows' K/V move from their tree slots to the slots of logical positions context_len + j
  (with spine-contiguous slots the common case copies a row onto itself).
"""

from __future__ import annotations

import torch

from ...kernels import dispatch
from ..cache import StateCaches
from .record import TreeRecord


def _pad_gather(x: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x [R, ...] gathered at rows [S, D] -> [S, D, ...], zero where not valid."""
    out = x[rows.reshape(-1)].view(*rows.shape, *x.shape[1:])
    mask = valid.view(*valid.shape, *([1] * (x.dim() - 1)))
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))


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
    state_rows = batch.state_rows

    hist = caches.config.linear_conv_kernel_dim - 1
    j = (
        lens[:, None] - hist + torch.arange(hist, device=device)[None, :]
    )  # path index of each new history tap
    from_path = j >= 0
    path_row = rows.gather(1, j.clamp(0, D - 1))
    for li, rep in enumerate(record.layers):
        pool = caches.recurrent.state[li]
        _, final = dispatch.gdn_decode(
            _pad_gather(rep.q, rows, valid), _pad_gather(rep.k, rows, valid), _pad_gather(rep.v, rows, valid),
            _pad_gather(rep.g, rows, valid), _pad_gather(rep.beta, rows, valid), record.scale,
            pool.index_select(0, state_rows),
        )  # fmt: skip
        pool.index_copy_(0, state_rows, final)

        conv = caches.conv.state[li]
        old = conv.index_select(0, state_rows).transpose(1, 2)  # [S, hist, C]
        old_tap = old.gather(1, (j + hist).clamp(0, hist - 1)[..., None].expand(-1, -1, old.shape[-1]))
        new = torch.where(from_path[..., None], rep.conv_in[path_row].to(conv.dtype), old_tap)
        conv.index_copy_(0, state_rows, new.transpose(1, 2).contiguous())

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
