"""Injected model faults for the continuation audit. Each is a context manager that wraps one primitive
of the serving path for the duration of the block; the product code has no fault switches.

- ``wrong_gdn_parent``: the GDN tree recurrence starts every node from the row packed before it.
- ``conv_packed_neighbour``: the tree conv windows read the packed neighbour rows instead of ancestors.
- ``kv_not_remapped``: the commit replays GDN and gathers conv but leaves the KV cache untouched.
- ``sibling_published``: the commit publishes the path ending at a sibling of the accepted node.
- ``pending_advanced``: after the commit, the pending token (the next tree's root) is also state-advanced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

MODEL_FAULTS = (
    "wrong_gdn_parent",
    "conv_packed_neighbour",
    "kv_not_remapped",
    "sibling_published",
    "pending_advanced",
)


class PendingBox:
    """The driver puts the next pending token here before it commits (read by ``pending_advanced``)."""

    token: int | None = None


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _chain(n: int) -> list[int]:
    return [-1, *range(n - 1)]


@contextlib.contextmanager
def model_fault(name: str, model: Any = None) -> Iterator[None]:
    from lumotree.kernels import dispatch
    from lumotree.serving.model import context as ctx_mod
    from lumotree.serving.model import model as model_mod

    if name == "wrong_gdn_parent":
        orig_tree = dispatch.gdn_tree_batch

        def gdn_tree_batch(q, k, v, g, beta, parents, *args, **kw):  # type: ignore[no-untyped-def]
            return orig_tree(q, k, v, g, beta, [_chain(len(p)) for p in parents], *args, **kw)

        with _patched(dispatch, "gdn_tree_batch", gdn_tree_batch):
            yield
        return
    if name == "conv_packed_neighbour":
        orig_win = ctx_mod.tree_window_index

        def windows(parents, *args):  # type: ignore[no-untyped-def]
            return orig_win(_chain(len(parents)), *args)

        # The window tables are cached per topology: rebuild them under the fault and after it.
        ctx_mod._tree_tables.cache_clear()
        try:
            with _patched(ctx_mod, "tree_window_index", windows):
                yield
        finally:
            ctx_mod._tree_tables.cache_clear()
        return
    orig_commit = model_mod.commit_tree
    if name == "kv_not_remapped":

        def commit(record, accepted_rows, caches):  # type: ignore[no-untyped-def]
            saved = caches.kv.k.clone(), caches.kv.v.clone()
            out = orig_commit(record, accepted_rows, caches)
            caches.kv.k.copy_(saved[0])
            caches.kv.v.copy_(saved[1])
            return out

    elif name == "sibling_published":

        def commit(record, accepted_rows, caches):  # type: ignore[no-untyped-def]
            acc = accepted_rows.clone()
            for s, par in enumerate(record.batch.parents_host):
                n = int((acc[s] >= 0).sum())
                last = int(acc[s, n - 1])
                sibs = [i for i, p in enumerate(par) if p == par[last] and i != last and p >= 0]
                if sibs:
                    acc[s, n - 1] = sibs[0]
            return orig_commit(record, acc, caches)

    elif name == "pending_advanced":

        def commit(record, accepted_rows, caches):  # type: ignore[no-untyped-def]
            lens = orig_commit(record, accepted_rows, caches)
            assert model is not None and PendingBox.token is not None
            batch = record.batch
            sid = next(s for s, sl in caches.seqs.items() if sl.state_row == int(batch.state_rows[0]))
            ctx = int(batch.context_lens[0] + lens[0])
            model(caches.make_batch("decode", [sid], [[PendingBox.token]], [ctx]), caches)
            return lens

    else:
        raise ValueError(f"unknown model fault {name!r}; known: {', '.join(MODEL_FAULTS)}")
    with _patched(model_mod, "commit_tree", commit):
        yield
