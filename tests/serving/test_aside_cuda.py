"""CUDA only: a tree forward with z's GEMM on a side stream (``serving.model.aside``) gives the logits of the
in-line fused projection, eagerly and replayed from a captured CUDA graph."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from lumotree.serving.cache import CacheConfig, StateCaches
from lumotree.serving.loader import load_model
from lumotree.serving.model.aside import ENV

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_tree_forward_with_z_aside_matches_in_line(
    tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, cfg = load_model(tiny_checkpoints["gdn3_attn1"], "cuda", torch.float32)
    caches = StateCaches(cfg, CacheConfig(max_seqs=2, num_blocks=32, block_size=4), "cuda", torch.float32)
    rng = random.Random(2)
    prompts = [[rng.randrange(300) for _ in range(n)] for n in (9, 4)]
    for s, p in enumerate(prompts):
        caches.allocate(s, len(p) + 16)
    model(caches.make_batch("prefill", [0, 1], prompts, [0, 0]), caches)
    saved = [x.clone() for x in (caches.recurrent.state, caches.conv.state, caches.kv.k, caches.kv.v)]
    trees = [[-1, 0, 1, 0, 3, 3, 1, 2], [-1, 0, 0, 1]]
    tokens = [[rng.randrange(300) for _ in t] for t in trees]
    batch = caches.make_batch("tree", [0, 1], tokens, [len(p) for p in prompts], trees)

    def forward() -> torch.Tensor:
        for dst, src in zip((caches.recurrent.state, caches.conv.state, caches.kv.k, caches.kv.v), saved,
                            strict=True):  # fmt: skip
            dst.copy_(src)
        return model.compute_logits(model(batch, caches))

    logits = {}
    for mode in ("0", "proj", "verify"):
        monkeypatch.setenv(ENV, mode)
        logits[mode] = forward()
    # z's own GEMM may round apart from the fused one's columns: close, not bitwise
    for mode in ("proj", "verify"):
        torch.testing.assert_close(logits[mode], logits["0"], rtol=1e-4, atol=1e-4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, logits["verify"])
