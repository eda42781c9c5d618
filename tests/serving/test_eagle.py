"""The EAGLE draft head: checkpoint round trip, causality, a config/weight layout the serving model reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lumotree.serving.drafters.eagle import EagleHead, eagle_config
from lumotree.serving.train.config import ModelDims
from lumotree.serving.train.lm import hf_config

DIMS = ModelDims(
    vocab_size=300, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, eagle_intermediate_size=80,
)  # fmt: skip


@pytest.fixture
def head() -> EagleHead:
    torch.manual_seed(0)
    h = EagleHead(eagle_config(hf_config(DIMS, [2], 0), DIMS.eagle_intermediate_size)).eval()
    for p in h.parameters():  # norms start at zero (1 + w); randomise everything so the checks bite
        torch.nn.init.normal_(p, std=0.05)
    return h


def _inputs(seed: int, t: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    e, f = torch.randn(2, t, 64, generator=g), torch.randn(2, t, 64, generator=g)
    return e, f, torch.arange(t).expand(2, t)


def test_save_load_roundtrip(head: EagleHead, tmp_path: Path) -> None:
    head.save_pretrained(tmp_path / "eagle", dtype=torch.float32)
    back = EagleHead.from_pretrained(tmp_path / "eagle")
    e, f, pos = _inputs(0)
    with torch.no_grad():
        assert torch.equal(head(e, f, pos), back(e, f, pos))
    names = set(head.head.state_dict())
    assert (
        "fc.weight" in names
        and "norm.weight" in names
        and any(n.startswith("layers.0.self_attn") for n in names)
    )
    assert not any("embed" in n or "lm_head" in n for n in names), "embedding and lm_head are the target's"


def test_rows_see_only_the_past(head: EagleHead) -> None:
    e, f, pos = _inputs(1)
    e2, f2 = e.clone(), f.clone()
    e2[:, 7:] += 1.0
    f2[:, 7:] -= 1.0
    with torch.no_grad():
        a, b = head(e, f, pos), head(e2, f2, pos)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-3)


def test_config_and_layer_weights_fit_the_serving_decoder_layer(head: EagleHead, tmp_path: Path) -> None:
    from lumotree.serving.config import ModelConfig
    from lumotree.serving.model.model import DecoderLayer

    head.save_pretrained(tmp_path / "eagle")
    cfg = ModelConfig.from_pretrained(tmp_path / "eagle")
    assert cfg.layer_types == ("full_attention",) and cfg.intermediate_size == 80
    assert json.loads((tmp_path / "eagle" / "config.json").read_text())["eagle"]["shares"] == [
        "embed_tokens",
        "lm_head",
    ]
    layer = DecoderLayer(cfg, "full_attention", 0)
    state = {
        k.removeprefix("layers.0."): v for k, v in head.head.state_dict().items() if k.startswith("layers.0.")
    }
    layer.load_state_dict(state, strict=True)
