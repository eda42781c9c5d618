"""The Arm protocol: a drafter plus a tree policy over the one shared verifier and the exact walk.

Each engine step, for every running request, the arm proposes a ``DraftTree`` whose root is the request's
pending token. The engine runs ONE target forward over all trees (the fast decode mode when every tree is a
bare root, tree mode otherwise), the sampler's walk selects the accepted path and the bonus token, the model
commits the path to the three state surfaces, and the arm receives a ``StepFeedback`` to update its drafter.
A speculative arm therefore plugs in without engine changes: it only shapes trees and learns from results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from lumotree.serving.request import Request


@dataclass
class DraftTree:
    """One request's verification tree: node 0 is the root (the pending token), parents precede children."""

    tokens: torch.Tensor | Sequence[int]
    """[N] token ids; tokens[0] is the pending token."""
    parents: Sequence[int]
    """[N] parent node index, -1 only at node 0."""
    active: Sequence[bool] | None = None
    """[N] False = padded slot: takes a verify row, never entered by the walk; None = all active."""

    def __post_init__(self) -> None:
        n = len(self.parents)
        assert n >= 1 and self.parents[0] == -1, "node 0 must be the root"
        assert all(0 <= p < i for i, p in enumerate(self.parents) if i), "parents must precede children"
        assert len(self.tokens) == n, (len(self.tokens), n)
        assert self.active is None or (len(self.active) == n and self.active[0]), "root must be active"

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def num_drafts(self) -> int:
        """Draft tokens offered for acceptance (active non-root nodes)."""
        if self.active is None:
            return self.size - 1
        return sum(bool(a) for a in self.active[1:])

    def token_list(self) -> list[int]:
        t = self.tokens
        return [int(x) for x in (t.tolist() if isinstance(t, torch.Tensor) else t)]

    @staticmethod
    def root(token: int) -> DraftTree:
        return DraftTree(tokens=[token], parents=[-1])

    @staticmethod
    def chain(tokens: Sequence[int]) -> DraftTree:
        """Root plus a chain of drafts (MTP-k, EAGLE): fanout 1."""
        return DraftTree(tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)))


@dataclass
class PrefillFeedback:
    """What the arm sees after a prefill chunk of each request."""

    requests: Sequence[Request]
    hidden: torch.Tensor
    """[R, H] target hidden states of all packed prompt rows of this chunk (after the final norm)."""
    row_offsets: list[int]
    """[S + 1] row range of each request in ``hidden``."""
    start_positions: list[int]
    """Position of each request's first row in this chunk."""
    first_tokens: list[int | None]
    """The sampled first output token for requests whose prompt is now complete, else None."""


@dataclass
class StepFeedback:
    """What the arm sees after a verify step (decode or tree mode)."""

    requests: Sequence[Request]
    trees: Sequence[DraftTree]
    hidden: torch.Tensor
    """[N, H] target hidden states of every tree node, packed request after request."""
    row_offsets: list[int]
    """[S + 1] node range of each request in ``hidden``."""
    accepted: list[list[int]]
    """Per request: accepted local node indices, root first (the root is always accepted)."""
    bonus: list[int]
    """Per request: the token drawn where the walk stopped: the next pending token (next tree's root)."""
    context_lens_before: list[int]
    """Per request: committed tokens before this step (the root sits at this position)."""


@runtime_checkable
class Arm(Protocol):
    """A decoding scheme: AR (root-only trees), MTP-k / EAGLE (chains) or LumoTree (trees)."""

    name: str

    def max_tree_rows(self) -> int:
        """Most verification rows a tree may have (the engine reserves KV room for them)."""
        ...

    def start(self, engine: Any) -> None:
        """Called once with the engine (model, caches, config, device) before the first request."""
        ...

    def on_prefill(self, feedback: PrefillFeedback) -> None:
        """A prompt chunk went through the target; drafters may consume its hidden states."""
        ...

    def propose(self, requests: Sequence[Request]) -> list[DraftTree]:
        """One tree per running request, root = ``request.pending_token``."""
        ...

    def on_step(self, feedback: StepFeedback) -> None:
        """The walk's result was committed; update drafter state along the accepted path."""
        ...

    def release(self, request: Request) -> None:
        """The request finished; free what the drafter holds for it."""
        ...
