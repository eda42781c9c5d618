"""State caches: rows and blocks are owned, returned on free, zeroed on reuse; leaks and misuse are caught."""

from __future__ import annotations

import pytest
import torch
from checkpoints import LAYOUTS, tiny_config_dict

from lumotree.serving.cache import CacheConfig, CacheFullError, StateCaches
from lumotree.serving.config import ModelConfig


@pytest.fixture
def caches() -> StateCaches:
    cfg = ModelConfig.from_dict({**tiny_config_dict(LAYOUTS["gdn3_attn1"]), "mtp_num_hidden_layers": 1})
    return StateCaches(cfg, CacheConfig(max_seqs=2, num_blocks=6, block_size=4))


def test_shapes(caches: StateCaches) -> None:
    assert caches.recurrent.state.shape == (3, 2, 4, 16, 16) and caches.recurrent.state.dtype == torch.float32
    assert caches.conv.state.shape == (3, 2, 128, 3)
    assert caches.kv.k.shape == (2, 6, 4, 2, 32)  # one attention layer + one MTP layer


def test_allocate_extend_free_and_reuse_zeroes_rows(caches: StateCaches) -> None:
    a = caches.allocate("a", 5)
    assert len(a.blocks) == 2 and a.capacity(4) == 8
    caches.recurrent.state[:, a.state_row] = 1.0
    caches.conv.state[:, a.state_row] = 1.0
    caches.extend("a", 9)
    assert len(a.blocks) == 3
    caches.extend("a", 3)  # never shrinks
    assert len(a.blocks) == 3
    caches.allocate("b", 1)
    with pytest.raises(CacheFullError):
        caches.allocate("c", 1)  # rows exhausted
    with pytest.raises(CacheFullError):
        caches.extend("b", 100)
    with pytest.raises(ValueError):
        caches.allocate("b", 1)
    caches.free("a")
    c = caches.allocate("c", 1)
    assert c.state_row == a.state_row
    assert (
        caches.recurrent.state[:, c.state_row].abs().sum() == 0
        and caches.conv.state[:, c.state_row].abs().sum() == 0
    )
    caches.assert_no_leaks(allow_live=True)
    caches.free("b")
    caches.free("c")
    caches.assert_no_leaks()
    assert caches.kv.blocks.num_free == 6


def test_leaks_are_detected(caches: StateCaches) -> None:
    caches.allocate("a", 4)
    with pytest.raises(AssertionError, match="still allocated"):
        caches.assert_no_leaks()
    caches.kv.blocks.take()  # a block nobody owns
    assert any("KV blocks" in p for p in caches.leaks())
    with pytest.raises(KeyError):
        caches.free("zzz")


def test_make_batch_slots_and_positions(caches: StateCaches) -> None:
    caches.allocate(0, 2)
    caches.allocate(1, 0)
    batch = caches.make_batch("tree", [0, 1], [[5, 6, 7], [8, 9]], [3, 0], [[-1, 0, 0], [-1, 0]])
    blocks0 = caches.seqs[0].blocks
    assert batch.positions.tolist() == [3, 4, 4, 0, 1]  # context + depth
    assert batch.slot_mapping.tolist()[:3] == [caches.kv.slot(blocks0, p) for p in (3, 4, 5)]
    assert batch.cu_seqlens.tolist() == [0, 3, 5]
    with pytest.raises(AssertionError):
        caches.make_batch("tree", [0], [[1, 2]], [0], [[-1, -1]])  # two roots
