"""``lumotree bench gdn`` runs end to end on CPU at tiny shapes (the GPU run uses the same code path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_gdn_bench_smoke(tmp_path) -> None:
    out = tmp_path / "gdn.json"
    cli = [sys.executable, "-c", "from lumotree.platform.cli import main; main()"]
    cmd = cli + ["bench", "gdn", "--device", "cpu", "--layers", "1",
           "--hv", "2", "--hk", "1", "--dk", "8", "--dv", "8", "--tree", "chain3", "--accept-depth", "2",
           "--warmup", "0", "--iters", "1", "--configs", "8:1:2,8:1:2:2,16:1", "--json",
           "--out", str(out)]  # fmt: skip
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["rows"] == 4 and res["lumotree"]["eager"]["total"]["median_ms"] > 0
    acc = res["accuracy"]
    assert acc["state_bitwise_vs_per_layer_replay"] and acc["max_err_tree_vs_f64"] < 1e-5
    sweep = res["verify_sweep"]  # every plan x every config, each checked against float64
    assert len(sweep) == 15 and all(r["cells_outside_paired_bound"] == 0 for r in sweep)
    plans = ("levels", "flat", "side", "sidecar", "split")
    want = {(plan, bv, pf) for plan in plans for bv, pf in ((8, 1), (8, 2), (16, 1))}
    assert {(r["plan"], r["block_v"], r["prefetch"]) for r in sweep} == want
    bits = {(r["plan"], r["prefetch"]): r["cells_bitwise_vs_native"] for r in sweep if r["block_v"] == 8}
    assert all(bits[p, 2] == bits[p, 1] for p in plans)  # the prefetch depth never changes a bit
    assert {"pytorch_node", "native_path", "fla_paths_replay", "floor"} <= set(res["baselines"])
