"""The scan probe's chain kernel (``bench/analysis/scan_probe.py``) computes the GDN chain in every variant:
outputs and final state against the per-node reference, under TRITON_INTERPRET=1 at small shapes."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated: set before it is loaded

import pytest
import torch

from lumotree.kernels.tree_scan_ref import states_of, tree_gdn_ref

PROBE = Path(__file__).resolve().parents[2] / "bench" / "analysis" / "scan_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("scan_probe", PROBE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NAMES = ["scan_like", "touch", "direct_rows", "no_prefetch", "qk_columns", "no_store", "no_output"]


@pytest.mark.parametrize("variant", NAMES)
def test_probe_variant_computes_the_chain(probe, variant: str) -> None:
    assert set(probe.VARIANTS) == set(NAMES)
    gen = torch.Generator().manual_seed(1)
    R, T, H, HV, D = 7, 5, 1, 2, 16
    l2 = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q, k = l2(torch.randn(R, H, D, generator=gen)), l2(torch.randn(R, H, D, generator=gen))
    v = torch.randn(R, HV, D, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(R, HV, generator=gen) + 3.0)
    beta = torch.sigmoid(torch.randn(R, HV, generator=gen))
    h0 = 0.1 * torch.randn(HV, D, D, generator=gen)
    rows = [0, 2, 3, 5, 6] if probe.VARIANTS[variant]["INDIRECT"] else list(range(T))
    ref = tree_gdn_ref(*(x[rows] for x in (q, k, v, g, beta)), [-1, 0, 1, 2, 3], h0, D**-0.5,
                       output_node_states=True)  # fmt: skip
    o = torch.full_like(v, float("nan"))
    state = h0.clone()
    probe.launch(variant, q, k, v, g, beta, o, state, torch.tensor(rows, dtype=torch.int32), D**-0.5)
    torch.testing.assert_close(state, states_of(ref)[-1], rtol=1e-5, atol=1e-6)
    if probe.VARIANTS[variant]["STORE"]:
        torch.testing.assert_close(o[rows], ref[0], rtol=1e-5, atol=1e-6)
        assert o[[1, 4]].isnan().all() if 1 not in rows else True  # rows off the chain are never written
    else:
        assert o.isnan().all()


def test_probe_runs_end_to_end_on_cpu(probe) -> None:
    res = probe.main(layers=1, hv=2, hk=1, d=16, lengths=(1, 3), device="cpu", warmup=0, iters=1)
    names = (*probe.VARIANTS, "served_scan", "scan_like_hot", "served_scan_hot")
    assert set(names) <= set(res)
    assert all(res[n]["us_per_launch"][1] > 0 and "us_per_node" in res[n] for n in names)
