"""Fill ``TreeDescriptor``s from drafter outputs: hydra27 (fixed shape), chains, and an adaptive tree.

Drafter outputs for one request: the root (pending token), MTP top-k tokens per depth ``[D, k]`` with their
probabilities (depth d is predicted under the spine: the top choice at every shallower depth), and the
request's suffix drafter. Suffix lookups need token values on the host, so MTP tokens are read once per step
(before verification; nothing here sits between acceptance and publication).

Fill rule shared by every fixed shape: a row whose route is ``(0,)*(d-1) + (j,)`` with d <= D is the MTP's
rank-j token at depth d; the other rows form all-zero chains under such an anchor and take the suffix
continuation of the anchor's root path. Rows left without a token are inactive this step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .drafters.suffix import SuffixDrafter
from .tree import TreeDescriptor, TreeTopology, chain
from .upload import Staging, to_device

PAD_TOKEN = 0
"""Token id of inactive rows (they run through the model but are never sampled)."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """Knobs of the adaptive tree."""

    budget: int = 32
    """Rows of the tree, root included."""
    max_anchors: int = 4
    """MTP nodes (highest path confidence first) whose root path is continued by suffix matching."""
    suffix_len: int = 12
    """Longest suffix chain asked per anchor."""
    suffix_weight: float = 1.0
    """Multiplier on suffix-chain confidences (a vote share is an optimistic acceptance estimate)."""
    min_confidence: float = 1e-4
    """Candidates below this path confidence are not worth a row."""


def _host_tokens(x: torch.Tensor | Sequence[Sequence[int]]) -> list[list[int]]:
    return x.tolist() if isinstance(x, torch.Tensor) else [list(r) for r in x]


def _mtp_route(route: tuple[int, ...], depth: int, width: int) -> bool:
    return 0 < len(route) <= depth and all(r == 0 for r in route[:-1]) and route[-1] < width


def _fixed_plan(
    topology: TreeTopology, depth: int, width: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, list[int]]]]:
    """Per shape (cached on the topology): MTP rows (row, depth index, rank) and, per MTP anchor, the active
    rows of the all-zero chain under it, shallowest first."""
    key = ("fixed_plan", depth, width)
    if key in topology._cache:
        return topology._cache[key]  # type: ignore[no-any-return]
    mtp_rows: list[tuple[int, int, int]] = []
    below: dict[int, list[int]] = {}  # anchor row -> chain rows under it
    for r, route in enumerate(topology.routes[1:], 1):
        if _mtp_route(route, depth, width):
            mtp_rows.append((r, len(route) - 1, route[-1]))
            continue
        anchor = r
        while not (anchor == 0 or _mtp_route(topology.routes[anchor], depth, width)):
            anchor = topology.parents[anchor]
        if anchor != 0 and all(x == 0 for x in route[len(topology.routes[anchor]) :]):
            below.setdefault(anchor, []).append(r)
    chains = [
        (a, [r for r in sorted(rows, key=lambda r: len(topology.routes[r])) if topology.default_active[r]])
        for a, rows in below.items()
    ]
    topology._cache[key] = (mtp_rows, chains)
    return mtp_rows, chains


def build_fixed(
    topology: TreeTopology,
    root: int,
    mtp_tokens: torch.Tensor | Sequence[Sequence[int]],
    suffix: SuffixDrafter | None,
    prefix_len: int,
    device: torch.device | str = "cpu",
    out: torch.Tensor | None = None,
    staging: Staging | None = None,
) -> TreeDescriptor:
    """Fill a fixed tree shape (hydra27: MTP spine + two runner-ups per depth 1-5, suffix spine tail at
    depths 6-11, suffix rescue chains under root runner-ups 1 and 2). With ``out`` and ``staging`` the token
    ids go straight into ``out`` (the verify graph's own input buffer, see ``Verifier.staged_input``)."""
    mtp = _host_tokens(mtp_tokens)
    depth, width = len(mtp), len(mtp[0]) if mtp else 0
    n = topology.num_rows
    toks: list[int | None] = [None] * n
    toks[0] = int(root)
    mtp_rows, below = _fixed_plan(topology, depth, width)
    for r, d, j in mtp_rows:
        toks[r] = int(mtp[d][j])
    for anchor, want in below:
        if suffix is None or not want:
            continue
        # the anchor's root path: the spine above it, then its own rank at its depth
        d, j = len(topology.routes[anchor]) - 1, topology.routes[anchor][-1]
        extra = [int(root), *(int(mtp[i][0]) for i in range(d)), int(mtp[d][j])]
        got = suffix.propose(extra=extra, max_len=len(want))
        for r, t in zip(want, got.tokens if got else (), strict=False):
            toks[r] = t
    # active: on by default, filled, and under an active parent (an unfilled row deactivates its subtree)
    act = [True] * n
    parents, default = topology.parents, topology.default_active
    for r in range(1, n):
        act[r] = default[r] and toks[r] is not None and act[parents[r]]
    values = [PAD_TOKEN if t is None else t for t in toks]
    if out is not None and staging is not None:
        ids = staging.upload(values, out)
    else:
        ids = to_device(values, device)
    return TreeDescriptor(topology, ids, prefix_len, tuple(act))


def look_ahead_fixed(
    topology: TreeTopology, root: int, depth: int, width: int, suffix: SuffixDrafter
) -> None:
    """Before the drafts reach the host, run the suffix lookups ``build_fixed`` will most likely ask for, so
    that it finds them done (a cache: a tree never changes). The spine tail's lookup under the guess that
    the MTP spine is the suffix's own continuation of the root (it agrees on repetitive text, where lookups
    scan the most occurrences), and the rescue chains' lookups under the root's most frequent successors
    (the root's runner-ups are usually among them). A wrong guess cost host time the GPU's drafting hid."""
    successors: list[int] | None = None
    for anchor, want in _fixed_plan(topology, depth, width)[1]:
        route = topology.routes[anchor]
        if not want:
            continue
        if len(route) == depth and not any(route):  # the spine's deepest MTP node
            guess = suffix.propose(extra=[int(root)], max_len=depth)
            if guess is not None and len(guess.tokens) == depth:
                suffix.look_ahead([int(root), *guess.tokens], len(want))
        elif len(route) == 1:  # a runner-up of the root
            if successors is None:
                successors = suffix.successors([int(root)], width)
            for s in successors:
                suffix.look_ahead([int(root), s], len(want))


def build_chain(
    root: int, drafts: torch.Tensor | Sequence[int], prefix_len: int, device: torch.device | str = "cpu"
) -> TreeDescriptor:
    """A fanout-1 tree: root + drafts (MTP-k, EAGLE); drafts may stay on the device."""
    d = torch.as_tensor(drafts, dtype=torch.long, device=device).reshape(-1)
    ids = torch.cat([torch.full((1,), int(root), dtype=torch.long, device=device), d])  # a fill, no upload
    return TreeDescriptor(chain(int(d.numel())), ids, prefix_len)


def build_adaptive(
    root: int,
    mtp_tokens: torch.Tensor | Sequence[Sequence[int]],
    mtp_probs: torch.Tensor | Sequence[Sequence[float]],
    suffix: SuffixDrafter | None,
    prefix_len: int,
    config: AdaptiveConfig = AdaptiveConfig(),
    device: torch.device | str = "cpu",
) -> TreeDescriptor:
    """Spend ``budget`` rows on the candidates of highest path confidence (estimated acceptance).

    Candidates: MTP nodes (0,..,0,j) with confidence prod(spine probs above) * p_j; suffix chains under the
    ``max_anchors`` most confident MTP nodes (and the root), each token's confidence the anchor's times the
    running product of vote shares. Candidates are merged by token path (the larger confidence wins), so
    siblings always carry distinct tokens. Confidence never grows along a path, so taking the best
    ``budget - 1`` (ties: shallower first) always yields a connected tree."""
    mtp = _host_tokens(mtp_tokens)
    probs = mtp_probs.tolist() if isinstance(mtp_probs, torch.Tensor) else [list(r) for r in mtp_probs]
    conf: dict[tuple[int, ...], float] = {(): 1.0}  # token path below the root -> confidence

    def offer(path: tuple[int, ...], c: float) -> None:
        if c >= config.min_confidence and c > conf.get(path, -1.0):
            conf[path] = min(c, conf[path[:-1]])

    run = 1.0
    spine: tuple[int, ...] = ()
    for toks, ps in zip(mtp, probs, strict=True):
        for t, p in zip(toks, ps, strict=True):
            offer(spine + (int(t),), run * float(p))
        if (spine + (int(toks[0]),)) not in conf:
            break
        run *= float(ps[0])
        spine = spine + (int(toks[0]),)
    if suffix is not None:
        anchors = sorted(conf, key=lambda p: (-conf[p], len(p)))[: config.max_anchors]
        for path in anchors:
            got = suffix.propose(extra=[int(root), *path], max_len=config.suffix_len)
            if got is None:
                continue
            cur = path
            for t, c in zip(got.tokens, got.cumulative(), strict=True):
                offer(cur + (int(t),), conf[path] * c * config.suffix_weight)
                cur = cur + (int(t),)
                if cur not in conf:
                    break
    chosen = sorted((p for p in conf if p), key=lambda p: (-conf[p], len(p), p))[: config.budget - 1]
    chosen.sort(key=lambda p: (len(p), -conf[p]))  # parents first; siblings by confidence (rank 0 = best)
    index: dict[tuple[int, ...], int] = {(): 0}
    parents, ids = [-1], [int(root)]
    for p in chosen:
        assert p[:-1] in index, "confidence must not grow along a path"
        index[p] = len(parents)
        parents.append(index[p[:-1]])
        ids.append(p[-1])
    topo = TreeTopology.from_parents(parents, name="adaptive")
    rows = torch.tensor(topo.node_to_row)
    out = torch.empty(len(ids), dtype=torch.long)
    out[rows] = torch.tensor(ids, dtype=torch.long)
    return TreeDescriptor(topo, out.to(device), prefix_len)
