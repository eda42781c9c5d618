"""Analysis (CPU, no GPU needed): registers, spills and fp64 MMA count of the matrix-form verifier on sm_90.

Compiles ``kernels.tree_wy._tree_wy_kernel`` at the 27B GDN heads for each launch config (BT rows, BV value
tile, KC key chunk, warps) with the installed Triton (pipelining depth: env STAGES, else the served one),
counts ``mma.sync ... f64`` instructions per shape in its PTX and reads ptxas' register and spill report.
Prints one line per config: whole-K fp64 tiles spill, the chunked key loop does not, which is why
``wy_block_k`` exists.

    python bench/analysis/wy_registers.py [--served] [BT:BV:KC:warps[:BZ] ...]

BZ > 0 compiles the grouped form (``TreeWyConfig.group_rows``) with BZ zeroed rows per group.

By default q, k and v are bf16 and l2-normalised in the kernel; ``--served`` compiles the model's operands
instead (fp32 q, k, v normalised by ``gdn_prep``), whose 32-bit key chunks Triton's pipeliner loads ahead.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lumotree.kernels import tree_wy

CONFIGS = (
    "32:32:128:4",
    "32:32:16:8",
    "32:64:16:4",
    "32:64:16:8",
    "32:64:32:4",
    "32:128:16:8",
    "64:64:16:4",
    "16:64:16:4:2",
    "16:128:16:4:2",
)
SIGNATURE = {
    **dict.fromkeys(("q", "k", "v", "o"), "*bf16"),
    **dict.fromkeys(("g", "beta", "h0"), "*fp32"),
    "scale": "fp32",
    **dict.fromkeys(("h0_idx", "cu", "slot_rows", "group_seq", "zero_rows"), "*i32"),
    "anc": "*i64",
    "keep": "*i8",
}


def ptxas() -> str:
    """The ptxas Triton itself uses for sm_90 (the newest one it bundles)."""
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name in ("ptxas-blackwell", "ptxas"):
        if os.path.exists(path := os.path.join(bindir, name)):
            return path
    raise SystemExit("no ptxas bundled with this Triton")


def report(bt: int, bv: int, kc: int, warps: int, bz: int = 0, served: bool = False) -> str:
    fn = tree_wy._tree_wy_kernel
    consts = dict(H=16, HV=48, K=128, V=128, BK=128, KC=kc, BT=bt, BV=bv, SQUARINGS=3, GROUPED=bz > 0, BZ=bz,
                  USE_QK_L2NORM_IN_KERNEL=not served)  # fmt: skip
    signature = {**SIGNATURE, **(dict.fromkeys(("q", "k", "v", "o"), "*fp32") if served else {})}
    src = ASTSource(fn, {**signature, **dict.fromkeys(consts, "constexpr")},
                    constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})  # fmt: skip
    ptx = triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options=dict(
            num_warps=warps, num_stages=int(os.environ.get("STAGES", tree_wy.TreeWyConfig.num_stages))
        ),
    ).asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        res = subprocess.run([ptxas(), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)  # fmt: skip
    info = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    # sm_90 has fp64 MMA in shapes m8n8k4 and m16n8k{4,8,16}; Triton versions differ in the one they emit
    mma = collections.Counter(re.findall(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)\.row\.col\.f64", ptx))
    shapes = ", ".join(f"{n} {s}" for s, n in mma.items()) or "0"
    used = f"{regs.group(1) if regs else '?'} registers, {spill.group(1) if spill else '?'} bytes spilled"
    return f"BT {bt} BV {bv} KC {kc} warps {warps} BZ {bz}: {shapes} fp64 mma, {used}"


def main(args: list[str]) -> None:
    served = "--served" in args
    configs = [a for a in args if a != "--served"] or list(CONFIGS)
    operands = "served fp32 operands" if served else "bf16 operands, in-kernel l2norm"
    print(f"triton {triton.__version__}, sm_90, 27B heads (K = V = 128), {operands}")
    for text in configs:
        bt, bv, kc, warps, bz, *_ = (*(int(x) for x in text.split(":")), 0)
        print(report(bt, bv, kc, warps, bz, served), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
