"""The Triton kernels of the GPU path (tree scan, rows decode, fused row kernels) compile for the H200 (sm_90)
on a machine without a GPU.

The interpreter runs the kernels' semantics on CPU but accepts code the compiler rejects; compiling ahead
of time catches that before any GPU time is spent. Runs in a subprocess: the interpreter flag other tests
set is read when kernels are decorated.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lumotree.kernels import gdn_decode, gdn_prep, norm, tree_scan, tree_wy


def build(fn, sig, consts):
    src = ASTSource(fn, {**sig, **dict.fromkeys(consts, "constexpr")},
                    constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def typed(**groups):
    return {n: t for t, names in groups.items() for n in names.split()}


sig = typed(**{"*bf16": "q k v o", "*fp32": "g beta h0 cut", "fp32": "scale", "i32": "L GM NZ",
               "*i32": "h0_idx nodes lens start write cutidx side sided group zero"})
for bv, tiles, side, cuts, packed in ((8, 1, 0, False, False), (8, 1, 2, False, False),
                                      (8, 2, 0, True, False), (8, 2, 2, False, True), (8, 1, 1, False, False),
                                      (16, 1, 0, True, False), (8, 1, 2, False, True)):
    build(tree_scan._tree_scan_kernel, sig, dict(H=16, HV=48, K=128, V=128, BK=128, BV=bv, TILES=tiles,
                                                 USE_QK_L2NORM_IN_KERNEL=False, HAS_CUT=cuts,
                                                 SIDE=side, PACKED=packed))
wy = typed(**{"*bf16": "q k v o", "*fp32": "g beta h0", "fp32": "scale",
               "*i32": "h0_idx cu slot_rows group_seq zero_rows", "*i64": "anc", "*i8": "keep"})
served = {**wy, **typed(**{"*fp32": "q k v o"})}  # the model's operands: fp32 tiles converted in place
wy_tiles = ((16, 32, 32, 0, 0), (32, 64, 16, 0, 0), (64, 16, 32, 0, 0), (32, 32, 128, 0, 0),
            (32, 64, 16, 1, 0), (16, 64, 16, 1, 2), (16, 128, 16, 1, 2))  # the last two: grouped plans
for bt, bv, kc, fp32, bz in wy_tiles:  # fp64 dots: Hopper's DMMA
    ttgir = build(tree_wy._tree_wy_kernel, served if fp32 else wy,
                  dict(H=16, HV=48, K=128, V=128, BK=128, KC=kc, BT=bt, BV=bv, SQUARINGS=3, GROUPED=bz > 0,
                       BZ=bz, USE_QK_L2NORM_IN_KERNEL=not fp32)).asm["ttgir"]
    # Triton 3.6 (the H200's) aborts on fp64 dot operands of kWidth > 1, which bf16 loads ask for
    # unless tree_wy._fp64_operand ends the trace; newer Tritons lower them, so check the layout itself
    widths = set(re.findall(r"xf64, #ttg\.dot_op<\{opIdx = \d, parent = #\w+, kWidth = (\d+)", ttgir))
    assert widths == {"1"}, (bt, bv, kc, widths)
    # at the served tile, one warp layout for every product, over columns: [warps, 1] would waste half of
    # each 16-row MMA on [32, 32] products (chained dots take the last one's layout: a [BT, BV] product)
    warps = set(re.findall(r"nvidia_mma<\{[^}]*warpsPerCTA = \[(\d+, \d+)\]", ttgir))
    assert (bt, bv) != (32, 64) or warps == {"1, 4"}, (bt, bv, warps)
rows = typed(**{"*fp32": "q k v g beta o pool", "*i64": "rows steps", "fp32": "scale", "i32": "T"})
for replay in (False, True):
    build(gdn_decode._decode_rows_kernel, rows, dict(H=16, HV=48, K=128, V=128, BK=128, BV=8, STEPS=replay))
build(norm._gated_norm_kernel, typed(**{"*bf16": "OUT Z W Y", "i32": "SZR SZH HZ D", "fp32": "eps"}),
      dict(BLOCK=128))
build(norm._silu_mul_kernel, typed(**{"*bf16": "G U Y", "i32": "SG SU N"}), dict(BLOCK=1024))
prep = typed(**{"*bf16": "CW A B", "*fp32": "ALOG DTB Q K_ V_ G BETA", "i32": "SA SB C HK HV DK DV"})
build(gdn_prep._prep_kernel, {**prep, **typed(**{"*bf16": "SRC", "*i64": "WIN"})}, dict(W=4, BLOCK=128))
decode = typed(**{"*bf16": "X CS", "*i64": "ROWS"})
build(gdn_prep._prep_decode_kernel, {**prep, **decode}, dict(W=4, BLOCK=128))
print("ok")
"""


def test_kernels_compile_for_sm90() -> None:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 and ("ptxas" in proc.stderr.lower() and "not found" in proc.stderr.lower()):
        pytest.skip("no ptxas for the CUDA backend on this machine")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
