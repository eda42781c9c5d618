"""The MTP drafter: the model's own ``mtp.*`` layer (fc over [norm(embed(token)), norm(hidden)], one
full-attention decoder layer, shared lm_head) chained k times. Its KV layer lives in the engine's cache after
the model's attention layers, so it shares the request's block table; see ``feature`` for the schedule."""

from __future__ import annotations

import torch

from ..batch import ForwardBatch
from ..cache import StateCaches
from ..model import HybridModel
from .feature import ChainConfig, FeatureDrafter


def mtp_drafter(model: HybridModel, caches: StateCaches, config: ChainConfig) -> FeatureDrafter:
    """A chained drafter over ``model.mtp`` writing its KV into ``caches`` (which must reserve MTP KV)."""
    mtp = model.mtp
    if mtp is None:
        raise ValueError(
            "this checkpoint has no MTP layer (mtp.* weights): the mtp and lumotree arms need one"
        )
    n_kv = len(model.config.attn_layers) + model.config.mtp_num_hidden_layers
    assert caches.num_kv_layers >= n_kv, "the cache reserves no KV layer for the MTP layer"

    def layer(embeds: torch.Tensor, feats: torch.Tensor, batch: ForwardBatch, c: StateCaches) -> torch.Tensor:
        return mtp(embeds, feats, model.context(batch), c)

    return FeatureDrafter(layer, model.embed_tokens, model.compute_logits, caches, config, own_caches=False)
