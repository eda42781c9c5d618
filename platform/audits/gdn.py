"""GDN component audit: the tree scan and the commit replay against native decoding and a float64 recurrence.

Native = every node's root path decoded through the native decode kernel (one batched call: node i is
sequence i, its path right-padded with g = 0, beta = 0 steps that leave the state bitwise unchanged). Per
case (a tree and its random inputs) and value head - a *cell* - the audit counts:
- output cells whose bf16 outputs (every node) equal native's bit for bit, and the same in fp32;
- output cells outside the paired rule E_tree <= 1.10 E_native + 2^-24 M64 + 2^-149 (E = max abs error
  against the float64 per-node recurrence, M64 = max abs of that reference);
- state cells: the fp32 state published by the commit replay (the accepted path's operands replayed through
  the native kernel, padded to the bucket width as the commit does) must equal token-by-token native
  decoding bit for bit, and obey the paired rule against the float64 state.
Calibration and held-out schedules draw different trees and inputs from independent seeds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .report import AuditReport

SHAPES = {
    # (key heads, value heads, K, V)
    "small": (2, 4, 32, 32),
    "27b": (16, 48, 128, 128),
}


@dataclass
class GdnAuditConfig:
    """What the GDN audit runs."""

    shapes: str = "small"
    """``small`` (CPU default) or ``27b`` (48 value / 16 key heads, K = V = 128)."""
    device: str = "cpu"
    kernel: str = "auto"
    """Tree kernel: ``auto`` = what the model dispatches to (Triton scan on CUDA, the per-node reference on
    CPU); ``triton`` = the Triton scan on any device (CPU needs TRITON_INTERPRET=1), native = fla's
    fused-recurrent kernel; ``ref`` = the per-node PyTorch reference."""
    cases: int = 64
    """Cases (tree + inputs) per schedule; cells = cases x value heads."""
    seed: int = 0
    """Calibration uses ``seed``, held-out ``seed + 1000``."""
    max_nodes: int = 64
    """Largest random tree."""


# ------------------------------------------------------------------------------------------- trees


def hydra27_parents() -> list[int]:
    from lumotree.serving.tree import hydra27

    return list(hydra27().parents)


def random_tree(n: int, rng: random.Random, kind: str) -> list[int]:
    """``wide``: parent uniform over earlier nodes (shallow, bushy); ``deep``: parent among the last two."""
    parents = [-1]
    for i in range(1, n):
        lo = max(0, i - 2) if kind == "deep" else 0
        parents.append(rng.randint(lo, i - 1))
    return parents


def tree_schedule(cases: int, rng: random.Random, max_nodes: int) -> list[tuple[str, list[int]]]:
    """hydra27, chains, stars and wide / deep random trees up to ``max_nodes``, cycled to ``cases``."""
    out: list[tuple[str, list[int]]] = []
    kinds = ["hydra27", "chain", "wide", "deep", "star", "wide", "deep", "chain"]
    for i in range(cases):
        kind = kinds[i % len(kinds)]
        if kind == "hydra27":
            out.append(("hydra27", hydra27_parents()))
        elif kind == "chain":
            n = rng.choice([2, 4, 8, 12, 16])
            out.append((f"chain{n}", [-1, *range(n - 1)]))
        elif kind == "star":
            n = rng.randint(3, 17)
            out.append((f"star{n}", [-1] + [0] * (n - 1)))
        else:
            n = rng.randint(8, max_nodes)
            out.append((f"{kind}{n}", random_tree(n, rng, kind)))
    return out


# ------------------------------------------------------------------------------------------ inputs


def gdn_inputs(
    n: int, hk: int, hv: int, dk: int, dv: int, gen: torch.Generator, device: str
) -> dict[str, torch.Tensor]:
    """Operands as the model produces them (fla's ranges): q, k l2-normalised from bf16 conv outputs, v on
    the bf16 grid, g = -exp(A_log) softplus(a + dt_bias) with A = exp(A_log) ~ U(1, 16), beta = sigmoid(b)."""

    def bf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).float()

    def l2(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    a_log = torch.empty(hv).uniform_(1.0, 16.0, generator=gen).log()
    dt_bias = torch.rand(hv, generator=gen) * 2 - 1
    g = -a_log.exp() * torch.nn.functional.softplus(bf(n, hv) + dt_bias)
    ops = {
        "q": l2(bf(n, hk, dk)),
        "k": l2(bf(n, hk, dk)),
        "v": bf(n, hv, dv),
        "g": g,
        "beta": torch.sigmoid(bf(n, hv)),
    }
    return {k: v.to(device) for k, v in ops.items()}


# ------------------------------------------------------------------------------------------ kernels


@dataclass
class Kernels:
    """The tree kernel under audit and the native decode kernel, for one device."""

    tree: Callable[..., tuple[torch.Tensor, Any]]
    """(q, k, v, g, beta [N, ...], parents, state [HV, K, V], scale) -> (o [N, HV, V], _)."""
    decode: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    """(q, k, v, g, beta [B, T, ...], scale, state [B, HV, K, V]) -> (o, final)."""
    name: str


def pick_kernels(kind: str, device: str) -> Kernels:
    from lumotree.kernels import dispatch, gdn_ref

    if kind == "ref":
        return Kernels(gdn_ref.naive_tree_gdn, dispatch.gdn_decode, "naive_tree_gdn vs dispatch.gdn_decode")
    if kind == "triton":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fused

        from lumotree.kernels.tree_scan import tree_gdn

        def decode(q, k, v, g, beta, scale, state):
            return fused(q, k, v, g=g, beta=beta, scale=scale, initial_state=state, output_final_state=True)

        return Kernels(tree_gdn, decode, "tree_scan.tree_gdn vs fla fused_recurrent")
    return Kernels(dispatch.gdn_tree, dispatch.gdn_decode, "dispatch.gdn_tree vs dispatch.gdn_decode")


def root_paths(parents: list[int]) -> list[list[int]]:
    paths: list[list[int]] = []
    for i, p in enumerate(parents):
        paths.append([*(paths[p] if p >= 0 else []), i])
    return paths


def native_outputs(
    ops: dict[str, torch.Tensor], parents: list[int], state: torch.Tensor, scale: float, kern: Kernels
) -> torch.Tensor:
    """o [N, HV, V] of each node decoded natively along its root path (one right-padded batch)."""
    paths = root_paths(parents)
    n, T = len(parents), max(len(p) for p in paths)
    idx = torch.zeros(n, T, dtype=torch.long)
    valid = torch.zeros(n, T, dtype=torch.bool)
    for i, p in enumerate(paths):
        idx[i, : len(p)] = torch.tensor(p)
        valid[i, : len(p)] = True
    dev = state.device
    idx, valid = idx.to(dev), valid.to(dev)

    def gather(x: torch.Tensor) -> torch.Tensor:
        out = x[idx.reshape(-1)].view(n, T, *x.shape[1:])
        return torch.where(valid.view(n, T, *[1] * (x.dim() - 1)), out, torch.zeros((), device=dev))

    o, _ = kern.decode(
        *(gather(ops[k]) for k in ("q", "k", "v", "g", "beta")),
        scale,
        state[None].expand(n, *state.shape).contiguous(),
    )
    last = torch.tensor([len(p) - 1 for p in paths], device=dev)
    return o[torch.arange(n, device=dev), last]


def publish(
    ops: dict[str, torch.Tensor],
    path: list[int],
    width: int,
    state: torch.Tensor,
    scale: float,
    kern: Kernels,
) -> torch.Tensor:
    """The commit's replay: the path's operands padded to ``width`` steps through the native kernel."""
    dev = state.device
    rows = torch.tensor(path + [0] * (width - len(path)), device=dev)
    valid = torch.arange(width, device=dev) < len(path)
    ops_p = [
        torch.where(valid.view(-1, *[1] * (ops[k].dim() - 1)), ops[k][rows], torch.zeros((), device=dev))[
            None
        ]
        for k in ("q", "k", "v", "g", "beta")
    ]
    _, final = kern.decode(*ops_p, scale, state[None].contiguous())
    return final[0]


def decode_stepwise(
    ops: dict[str, torch.Tensor], path: list[int], state: torch.Tensor, scale: float, kern: Kernels
) -> torch.Tensor:
    """Plain decoding: one native call per token."""
    st = state[None].contiguous()
    for i in path:
        _, st = kern.decode(*(ops[k][i][None, None] for k in ("q", "k", "v", "g", "beta")), scale, st)
    return st[0]


def _rule_bound(e_native: torch.Tensor, m64: torch.Tensor) -> torch.Tensor:
    return 1.10 * e_native + 2.0**-24 * m64 + 2.0**-149


def run_case(
    parents: list[int], ops: dict[str, torch.Tensor], state: torch.Tensor, kern: Kernels, rng: random.Random
) -> dict[str, Any]:
    """Per value head: bitwise flags and paired-rule verdicts of outputs and of the published state."""
    from lumotree.kernels.tree_scan_ref import tree_gdn_float64

    dk = ops["k"].shape[-1]
    scale = dk**-0.5
    o_tree, _ = kern.tree(ops["q"], ops["k"], ops["v"], ops["g"], ops["beta"], parents, state, scale)
    o_nat = native_outputs(ops, parents, state, scale, kern)
    # float64 on the device itself (fast on a GPU), results to the host
    o64, st64 = tree_gdn_float64(
        ops["q"], ops["k"], ops["v"], ops["g"], ops["beta"], parents, state, scale, output_node_states=True
    )
    o64 = o64.cpu()
    o_tree, o_nat = o_tree.float().cpu(), o_nat.float().cpu()
    bf_eq = (o_tree.bfloat16() == o_nat.bfloat16()).flatten(-1).all(-1).all(0)  # [HV]
    f32_eq = (o_tree == o_nat).all(-1).all(0)
    e_tree = (o_tree.double() - o64).abs().amax(dim=(0, 2))
    e_nat = (o_nat.double() - o64).abs().amax(dim=(0, 2))
    m64 = o64.abs().amax(dim=(0, 2))
    out_ok = e_tree <= _rule_bound(e_nat, m64)
    # Commit: a random node's root path, padded to the tree's depth bucket as the commit pads.
    node = rng.randrange(len(parents))
    path = root_paths(parents)[node]
    width = max(len(p) for p in root_paths(parents))
    pub = publish(ops, path, width, state, scale, kern).cpu()
    nat = decode_stepwise(ops, path, state, scale, kern).cpu()
    assert st64 is not None
    s64 = st64[node].cpu()
    st_eq = (pub == nat).flatten(1).all(-1)
    es_pub = (pub.double() - s64).abs().flatten(1).amax(-1)
    es_nat = (nat.double() - s64).abs().flatten(1).amax(-1)
    st_ok = es_pub <= _rule_bound(es_nat, s64.abs().flatten(1).amax(-1))
    return {
        "bf16_eq": bf_eq,
        "f32_eq": f32_eq,
        "out_ok": out_ok,
        "e_tree": e_tree,
        "e_native": e_nat,
        "state_eq": st_eq,
        "state_ok": st_ok,
    }


def warm_state(
    hk: int, hv: int, dk: int, dv: int, gen: torch.Generator, device: str, kern: Kernels, steps: int = 8
) -> torch.Tensor:
    """A committed state with realistic magnitudes: native decoding of ``steps`` random tokens from zero."""
    ops = gdn_inputs(steps, hk, hv, dk, dv, gen, device)
    zero = torch.zeros(hv, dk, dv, device=device)
    return decode_stepwise(ops, list(range(steps)), zero, dk**-0.5, kern)


def run_schedule(
    name: str, seed: int, cfg: GdnAuditConfig, kern: Kernels, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    hk, hv, dk, dv = SHAPES[cfg.shapes]
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    acc: dict[str, int] = {
        k: 0 for k in ("cells", "bf16_eq", "f32_eq", "out_bad", "state_cells", "state_eq", "state_bad")
    }
    worst = 0.0
    trees: dict[str, int] = {}
    for tname, parents in tree_schedule(cfg.cases, rng, cfg.max_nodes):
        kind = tname if tname == "hydra27" else tname.rstrip("0123456789")
        trees[kind] = trees.get(kind, 0) + 1
        state = warm_state(hk, hv, dk, dv, gen, cfg.device, kern)
        ops = gdn_inputs(len(parents), hk, hv, dk, dv, gen, cfg.device)
        r = run_case(parents, ops, state, kern, rng)
        acc["cells"] += hv
        acc["bf16_eq"] += int(r["bf16_eq"].sum())
        acc["f32_eq"] += int(r["f32_eq"].sum())
        acc["out_bad"] += int((~r["out_ok"]).sum())
        acc["state_cells"] += hv
        acc["state_eq"] += int(r["state_eq"].sum())
        acc["state_bad"] += int((~r["state_ok"]).sum())
        ratio = r["e_tree"] / (r["e_native"] + 2.0**-149)
        worst = max(worst, float(ratio.max()))
        if progress:
            progress(1)
    return {"schedule": name, "seed": seed, **acc, "max_E_tree/E_native": worst, "trees": trees}


def run_gdn_audit(cfg: GdnAuditConfig, progress: Callable[[int], None] | None = None) -> AuditReport:
    """Both schedules; checks: 0 output cells and 0 state cells outside the paired rule, every published
    state bitwise equal to native decoding."""
    kern = pick_kernels(cfg.kernel, cfg.device)
    hk, hv, dk, dv = SHAPES[cfg.shapes]
    rep = AuditReport(
        "gdn", {**asdict(cfg), "kernels": kern.name, "key_heads": hk, "value_heads": hv, "K": dk, "V": dv}
    )
    rows = [
        run_schedule(n, cfg.seed + off, cfg, kern, progress)
        for n, off in (("calibration", 0), ("held-out", 1000))
    ]
    rep.tables["schedules"] = [
        {k: (", ".join(f"{a} {b}" for a, b in v.items()) if isinstance(v, dict) else v) for k, v in r.items()}
        for r in rows
    ]
    for r in rows:
        s = r["schedule"]
        rep.check(
            f"{s}: output cells outside the paired rule",
            r["out_bad"] == 0,
            r["out_bad"],
            0,
            f"of {r['cells']} cells; bf16 bitwise {r['bf16_eq']}/{r['cells']}, "
            f"fp32 bitwise {r['f32_eq']}/{r['cells']}",
        )
        rep.check(
            f"{s}: published state bitwise = native decoding",
            r["state_eq"] == r["state_cells"],
            r["state_eq"],
            r["state_cells"],
            "state cells (case x value head)",
        )
        rep.check(f"{s}: state cells outside the paired rule", r["state_bad"] == 0, r["state_bad"], 0)
    return rep
