"""Analysis (CPU, built-in model): what a hydra27 step's host work after the drafts reach the host costs, and
how much acceptance comes from the suffix rows that only a host lookup after the drafts can fill.

A fixed tree could be filled on the device with no host read between drafting and verification only if
every suffix row were known before the drafts: the spine tail is known when the drafted spine equals the
suffix's own continuation (the look-ahead guess), a rescue chain when its runner-up is among the root's
observed successors. This run counts the accepted drafts that such a fill would lose (tail rows accepted in
steps whose spine missed the guess; rescue rows accepted with a runner-up outside the top M successors)
and times the post-read host work (``build_fixed``) the fill would save. It wraps the arm's functions, so
it decodes exactly as the engine does (greedy, the first N calls of the replay corpus).

    python bench/analysis/fixed_tree_host.py [N] > OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from lumotree.serving import tree_builder as tb
from lumotree.serving.arms import lumotree as lt
from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.sampling.params import SamplingParams

TAIL = set(range(6, 12))
"""hydra27 rows of the spine tail (depths 6-11)."""
RESCUE = {"rescue1": {16, 20, 24, 28}, "rescue2": {17, 21}}
"""Active rows of the suffix chains under the root's runner-ups 1 and 2."""


def successors(sfx: object, root: int) -> list[int]:
    """Tokens that followed ``root`` in the request's text and the cache, most frequent first."""
    c: Counter[int] = Counter()
    for idx in [sfx.index] + ([sfx.cache.index] if sfx.cache is not None else []):  # type: ignore[attr-defined]
        t = idx.tokens
        c.update(t[e + 1] for e in range(len(t) - 1) if t[e] == root and t[e + 1] >= 0)
    return [x for x, _ in c.most_common()]


def main(n: int) -> dict[str, object]:
    corpus = Path(__file__).resolve().parents[1] / "replay-corpus.jsonl"
    rows = [json.loads(line) for line in corpus.read_text().splitlines()][:n]
    eng = Engine.from_config(
        EngineConfig(model="tiny", arm="lumotree", arm_options={"tree": "hydra27"}, device="cpu")
    )
    arm = eng.arm
    stats: Counter[str] = Counter()
    build_us: list[float] = []
    cur: dict[str, object] = {}
    build_fixed = tb.build_fixed

    def build(topology, root, mtp, sfx, *args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        tree = build_fixed(topology, root, mtp, sfx, *args, **kwargs)
        build_us.append((time.perf_counter() - t0) * 1e6)
        m = tb._host_tokens(mtp)
        guess = sfx.propose(extra=[int(root)], max_len=len(m))
        cur["hit"] = guess is not None and list(guess.tokens) == [x[0] for x in m]
        succ = successors(sfx, int(root))
        cur["rank"] = {k: succ.index(m[0][j]) if m[0][j] in succ else len(succ) for j, k in
                       ((1, "rescue1"), (2, "rescue2"))}  # fmt: skip
        return tree

    on_step = arm.on_step

    def step(fb):  # type: ignore[no-untyped-def]
        acc = set(fb.accepted[0])
        stats["steps"] += 1
        stats["accepted_drafts"] += len(acc) - 1
        stats["spine_equals_guess"] += bool(cur["hit"])
        tail = len(acc & TAIL)
        stats["tail_accepted"] += tail
        stats["tail_accepted_guess_missed"] += 0 if cur["hit"] else tail
        for name, rescue in RESCUE.items():
            got = len(acc & rescue)
            stats[f"{name}_accepted"] += got
            for top in (2, 4, 8):
                if cur["rank"][name] >= top:  # type: ignore[index]
                    stats[f"{name}_accepted_outside_top{top}"] += got
        return on_step(fb)

    # wrap the arm's builder and feedback hook in place (an analysis, not a code path of the engine)
    lt.build_fixed = build  # type: ignore[assignment]
    arm.on_step = step  # type: ignore[method-assign]
    for row in rows:
        eng.generate([row["prompt_token_ids"]], SamplingParams(max_tokens=128, temperature=0.0))
    return {
        "calls": len(rows),
        "max_tokens": 128,
        **stats,
        "build_fixed_us_median": statistics.median(build_us),
        "build_fixed_us_mean": statistics.fmean(build_us),
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 16), indent=1))
