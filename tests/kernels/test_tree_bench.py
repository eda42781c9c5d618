"""``lumotree bench gdn`` runs end to end on CPU at tiny shapes (the GPU run uses the same code path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated: the config test imports the scan


def test_gdn_bench_smoke(tmp_path) -> None:
    out = tmp_path / "gdn.json"
    cli = [sys.executable, "-c", "from lumotree.platform.cli import main; main()"]
    cmd = cli + ["bench", "gdn", "--device", "cpu", "--layers", "1",
           "--hv", "2", "--hk", "1", "--dk", "8", "--dv", "8", "--tree", "chain3", "--accept-depth", "2",
           "--warmup", "0", "--iters", "1", "--configs", "16:1:2", "--wy-configs", "16:4:16", "--json",
           "--out", str(out)]  # fmt: skip
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["rows"] == 4 and res["lumotree"]["eager"]["total"]["median_ms"] > 0
    acc = res["accuracy"]
    assert acc["state_bitwise_vs_per_layer_replay"] and acc["max_err_tree_vs_f64"] < 1e-5
    # each path plan x (16:1:2, the served 8:1:1 added) and wy x (16:4:16, the served 64:4:16 added), all
    # checked against float64
    sweep = res["verify_sweep"]
    assert len(sweep) == 12 and all(r["cells_outside_paired_bound"] == 0 for r in sweep)
    want = {(plan, bv) for plan in ("levels", "flat", "side", "sidecar", "split") for bv in (8, 16)}
    assert {(r["plan"], r["block_v"]) for r in sweep if r["plan"] != "wy"} == want
    assert {r["wy_block_v"] for r in sweep if r["plan"] == "wy"} == {16, 64}
    per_plan = res["verify_fastest_within_rule_per_plan"]  # what scripts/gpu-bench.sh serves arms_wy with
    assert set(per_plan) == {"levels", "flat", "side", "sidecar", "split", "wy"}
    assert all(
        best["plan"] == plan and best["cells_outside_paired_bound"] == 0 for plan, best in per_plan.items()
    )
    assert per_plan["wy"]["wy_block_v"] in (16, 64) and res["verify_fastest_within_rule"] in per_plan.values()
    assert {"pytorch_node", "native_path", "fla_paths_replay", "floor"} <= set(res["baselines"])
    chains = res["chain_sweep"]  # the served verify over chains of 1, 2 and 4 of the tree's rows
    assert chains["lengths"] == [1, 2, 4] and len(chains["verify_ms"]) == 3
    assert chains["plans"] == ["sidecar"] * 3  # auto scans short chains (TreeScanConfig.scan_max_chain)
    # a fit's sign is a timing (the served wy verifies a whole chain at once): only its presence is checked
    assert all(t > 0 for t in chains["verify_ms"]) and {"per_node_ms", "intercept_ms"} <= set(chains)


def test_gdn_bench_plans_option() -> None:
    cli = [sys.executable, "-c", "from lumotree.platform.cli import main; main()"]
    cmd = cli + ["bench", "gdn", "--device", "cpu", "--plans", "flat,bogus"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "bogus" in proc.stderr


def test_gdn_bench_config_syntax() -> None:
    """``--configs`` items: positional BV:warps[:tiles], then knob=value pairs; bad items are refused."""
    from lumotree.platform.benches.gdn import _config_text, _parse_config

    cfg = _parse_config("8:1:2/maxnreg=128")
    assert (cfg["block_v"], cfg["num_warps"], cfg["tiles"], cfg["maxnreg"]) == (8, 1, 2, 128)
    assert _config_text(cfg) == "8:1:2/maxnreg=128" and _config_text(_parse_config("16:2")) == "16:2:1"
    for bad in ("8", "8:1:3", "8:1/bogus=1", "8:1/maxnreg=x", "8:1/maxnreg=300", "8:1:1:1"):
        with pytest.raises(ValueError):
            _parse_config(bad)


def test_gdn_bench_wy_config_syntax() -> None:
    """``--wy-configs`` items: BV:warps[:BK[:stages[:group]]], the rest at the served defaults; bad items
    are refused."""
    from lumotree.kernels.tree_scan import TreeScanConfig
    from lumotree.platform.benches.gdn import _config_text, _parse_wy_config

    base = TreeScanConfig()
    assert _parse_wy_config("64:8:128") == {"wy_block_v": 64, "wy_num_warps": 8, "wy_block_k": 128,
                                            "wy_num_stages": base.wy_num_stages,
                                            "wy_group_rows": base.wy_group_rows}  # fmt: skip
    assert _parse_wy_config("16:4")["wy_block_k"] == base.wy_block_k
    assert _parse_wy_config("64:4:16:4:16") == {"wy_block_v": 64, "wy_num_warps": 4, "wy_block_k": 16,
                                                "wy_num_stages": 4, "wy_group_rows": 16}  # fmt: skip
    assert _config_text(_parse_wy_config("32:4:64:2:0")) == "32:4:64:2:0"
    for bad in (
        "32",
        "24:4",
        "32:0",
        "32:4:8",
        "32:4:64:0",
        "32:4:16:3:8",
        "32:4:16:3:24",
        "32:4:16:3:0:2",
        "a:b",
    ):
        with pytest.raises(ValueError):
            _parse_wy_config(bad)
