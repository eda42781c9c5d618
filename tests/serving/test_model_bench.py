"""The decode benchmark runs end to end at tiny shapes on CPU and reports a sane floor."""

from __future__ import annotations

from lumotree.platform.benches.decode import run


def test_decode_bench_tiny_cpu() -> None:
    out = run("tiny", batch=2, context=20, device_name="cpu", dtype_name="fp32", warmup=1, iters=3, graph=1)
    assert set(out["variants"]) == {"fused", "unfused"} and out["best_mode"] == "eager"
    for res in out["variants"].values():
        assert res["graph"] is None and res["eager"]["n"] == 3 and res["eager"]["median_ms"] > 0
    # 3 GDN + 1 attention layer of the tiny shapes plus an untied lm_head, fp32.
    per_gdn = 64 * (128 + 64 + 4 + 4) + 64 * 64 + 3 * 64 * 128
    per_attn = 64 * (256 + 64 + 64) + 128 * 64 + 3 * 64 * 128
    conv = 128 * 4
    assert out["weight_bytes"] == 4 * (3 * (per_gdn + conv) + per_attn + 300 * 64)
    assert out["floor_ms"] > 0 and out["ratio_to_floor"] > 0
