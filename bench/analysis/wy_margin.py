"""Analysis (CPU): how close each wy verifier form comes to the audit's paired rule, under the interpreter.

Runs ``kernels.tree_wy`` (``TRITON_INTERPRET=1``, set here) on the GDN audit's trees and operands at the
27B key dim and prints, per ``TreeWyConfig.split``, the worst (case, value head) cell's E_tree over its
bound 1.10 E_native + 2^-24 M64 (the rule holds while this stays below 1) and the cells outside. The
interpreter sums fp32 dots in numpy, not on tensor cores, so this is the margin's CPU estimate; ``bench
gdn`` counts the GPU's.

    python bench/analysis/wy_margin.py [TREES]
"""

from __future__ import annotations

import os
import random
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from lumotree.kernels import tree_wy  # noqa: E402
from lumotree.kernels.tree_scan_ref import tree_gdn_float64, tree_gdn_ref  # noqa: E402
from lumotree.platform.audits import gdn as audit  # noqa: E402

SPLITS = (0, 1, 2)


def main(trees: int) -> None:
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    hk, hv, dk, dv = 4, 12, 128, 64
    worst, bad = dict.fromkeys(SPLITS, 0.0), dict.fromkeys(SPLITS, 0)
    cells = 0
    for _name, parents in audit.tree_schedule(trees, rng, 64):
        ops = audit.gdn_inputs(len(parents), hk, hv, dk, dv, gen, "cpu")
        q, k, v, g, beta = (ops[x][None] for x in ("q", "k", "v", "g", "beta"))
        h0 = torch.randn(1, hv, dk, dv, generator=gen) * 0.1
        o_nat, _ = tree_gdn_ref(q, k, v, g, beta, parents, h0, None)
        o64, _ = tree_gdn_float64(q, k, v, g, beta, parents, h0, None)
        bound = 1.10 * (o_nat.double() - o64).abs().amax(dim=(0, 1, 3)) + 2.0**-24 * o64.abs().amax(
            dim=(0, 1, 3)
        )
        cells += hv
        for split in SPLITS:
            cfg = tree_wy.TreeWyConfig(split=split)
            o, _ = tree_wy.tree_gdn_wy(q, k, v, g, beta, parents, h0, None, config=cfg)
            ratio = (o.double() - o64).abs().amax(dim=(0, 1, 3)) / bound
            worst[split] = max(worst[split], float(ratio.max()))
            bad[split] += int((ratio > 1).sum())
    print(f"cells {cells}")
    for split in SPLITS:
        print(f"split {split}: worst E_tree / bound {worst[split]:.3f}, cells outside {bad[split]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 24)
