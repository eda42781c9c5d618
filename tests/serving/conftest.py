"""Serving fixtures: transformers' pure-torch Qwen3.5 as the oracle, and random tiny checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import LAYOUTS, write_checkpoint  # noqa: E402

_FLA_SWAPPED = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                "causal_conv1d_update")  # fmt: skip


@pytest.fixture
def hf_torch_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make transformers' Qwen3.5 run its pure-torch GDN and conv even when fla is importable.

    transformers binds fla's Triton kernels at import time when fla imports, and those fail on a CPU machine.
    The wrappers keep the reference function as ``__wrapped__``; we put it back for the test.
    """
    import transformers.models.qwen3_5.modeling_qwen3_5 as mq

    for name in _FLA_SWAPPED:
        fn = getattr(mq, name)
        monkeypatch.setattr(mq, name, getattr(fn, "__wrapped__", fn))


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One random checkpoint per layer layout (the gdn3_attn1 one also carries random mtp.* weights)."""
    root = tmp_path_factory.mktemp("ckpt")
    return {
        name: write_checkpoint(
            root / name, layers, seed=i, mtp=(name == "gdn3_attn1"), tie=(name == "attn_first")
        )
        for i, (name, layers) in enumerate(LAYOUTS.items())
    }
