"""HybridModel against transformers' Qwen3_5ForCausalLM (pure-torch fallback) on random tiny checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lumotree.serving.cache import CacheConfig, StateCaches
from lumotree.serving.loader import load_model
from lumotree.serving.model import HybridModel

pytestmark = pytest.mark.usefixtures("hf_torch_fallback")
LAYOUT_NAMES = ["gdn3_attn1", "attn_first", "alternating"]


def _hf(path: Path):
    from transformers import Qwen3_5ForCausalLM

    m = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    return m


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    err = (ours - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item(), f"max error {err:.3g} vs scale {ref.abs().max().item():.3g}"


class Runner:
    """Drives our model the way the engine will: prefill chunks and decode steps over owned cache rows."""

    def __init__(self, model: HybridModel, max_seqs: int = 4) -> None:
        self.model = model
        self.caches = StateCaches(model.config, CacheConfig(max_seqs=max_seqs, num_blocks=64, block_size=8))
        self.ctx: dict[int, int] = {}

    def add(self, sid: int) -> None:
        self.caches.allocate(sid, 0)
        self.ctx[sid] = 0

    def step(self, mode: str, seqs: dict[int, list[int]]) -> list[torch.Tensor]:
        ids = list(seqs)
        batch = self.caches.make_batch(mode, ids, [seqs[s] for s in ids], [self.ctx[s] for s in ids])
        logits = self.model.compute_logits(self.model(batch, self.caches))
        out, start = [], 0
        for s in ids:
            n = len(seqs[s])
            out.append(logits[start : start + n])
            start += n
            self.ctx[s] += n
        return out


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_prefill_and_decode_logits_match_transformers(tiny_checkpoints: dict[str, Path], layout: str) -> None:
    path = tiny_checkpoints[layout]
    hf = _hf(path)
    model, _ = load_model(path)
    gen = torch.Generator().manual_seed(3)
    # Two sequences batched together (continuous batching), different lengths.
    prompts = {
        0: torch.randint(0, 300, (64,), generator=gen).tolist(),
        1: torch.randint(0, 300, (37,), generator=gen).tolist(),
    }
    conts = {s: torch.randint(0, 300, (32,), generator=gen).tolist() for s in prompts}
    run = Runner(model)
    for s in prompts:
        run.add(s)
    pre = run.step("prefill", prompts)
    dec: dict[int, list[torch.Tensor]] = {s: [] for s in prompts}
    for t in range(32):
        outs = run.step("decode", {s: [conts[s][t]] for s in prompts})
        for s, o in zip(prompts, outs, strict=True):
            dec[s].append(o[0])
    for i, s in enumerate(prompts):
        ref = _hf_logits(hf, prompts[s] + conts[s])
        n = len(prompts[s])
        _close(pre[i], ref[:n])
        _close(torch.stack(dec[s]), ref[n:])
    for s in prompts:
        run.caches.free(s)
    run.caches.assert_no_leaks()


@pytest.mark.parametrize("layout", ["attn_first"])
def test_greedy_generation_is_token_identical(tiny_checkpoints: dict[str, Path], layout: str) -> None:
    path = tiny_checkpoints[layout]
    hf = _hf(path)
    model, _ = load_model(path)
    prompt = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, pad_token_id=0)[
            0, 12:
        ].tolist()
    run = Runner(model)
    run.add(0)
    logits = run.step("prefill", {0: prompt})[0][-1]
    ours = []
    for _ in range(64):
        tok = int(torch.argmax(logits))
        ours.append(tok)
        logits = run.step("decode", {0: [tok]})[0][-1]
    assert ours == ref


def test_chunked_prefill_then_decode_equals_one_prefill_on_all_surfaces(
    tiny_checkpoints: dict[str, Path],
) -> None:
    model, cfg = load_model(tiny_checkpoints["alternating"])
    toks = torch.randint(0, 300, (48,), generator=torch.Generator().manual_seed(9)).tolist()
    run = Runner(model)
    run.add(0)
    run.add(1)
    run.step("prefill", {0: toks[:20]})
    run.step("prefill", {0: toks[20:40], 1: toks})  # a chunk continuing state, batched with a full prefill
    for t in toks[40:]:
        run.step("decode", {0: [t]})
    c = run.caches
    r0, r1 = c.seqs[0].state_row, c.seqs[1].state_row
    torch.testing.assert_close(c.recurrent.state[:, r0], c.recurrent.state[:, r1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c.conv.state[:, r0], c.conv.state[:, r1], rtol=1e-4, atol=1e-5)
    assert c.recurrent.state[:, r0].abs().max() > 0 and c.conv.state[:, r0].abs().max() > 0
    bs = c.block_size
    for pos in range(48):
        s0 = c.kv.slot(c.seqs[0].blocks, pos)
        s1 = c.kv.slot(c.seqs[1].blocks, pos)
        for kv in (c.kv.k, c.kv.v):
            flat = kv.view(kv.shape[0], -1, *kv.shape[3:])
            torch.testing.assert_close(flat[:, s0], flat[:, s1], rtol=1e-4, atol=1e-5)
    assert bs == 8
