"""The Arm protocol: a drafter plus a tree policy over the one shared verifier and the exact walk.

Each engine step, for every running request, the arm proposes a ``TreeDescriptor`` (the one shared tree
descriptor: tokens, parents, depths, positions, active mask, row map) whose root is the request's pending
token and whose ``prefix_len`` is the request's ``context_len``. The engine runs ONE target forward over all
trees (the fast decode mode when every tree is a bare root, the verifier's tree mode otherwise), the sampler's
walk selects the accepted path and the bonus token, the verifier commits the path to the three state
surfaces, and the arm receives a ``StepFeedback`` to update its drafter. Drafting, verification, selection
and commit all read the same descriptor, so they agree on which row is which node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from lumotree.serving.tree import TreeDescriptor

if TYPE_CHECKING:
    from lumotree.serving.request import Request

DraftTree = TreeDescriptor
"""What ``Arm.propose`` returns: the shared descriptor (build with ``TreeDescriptor.build/root`` or the
``tree_builder`` functions)."""


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
    trees: Sequence[TreeDescriptor]
    hidden: torch.Tensor
    """[N, H] target hidden states of every tree row, packed request after request."""
    row_offsets: list[int]
    """[S + 1] row range of each request in ``hidden``."""
    accepted: list[list[int]]
    """Per request: accepted rows of its descriptor, root (row 0) first."""
    accepted_tokens: list[list[int]]
    """Per request: the tokens of ``accepted`` (root first)."""
    bonus: list[int]
    """Per request: the token drawn where the walk stopped: the next pending token (next tree's root)."""
    context_lens_before: list[int]
    """Per request: committed tokens before this step (the root sits at this position)."""
    accepted_device: torch.Tensor | None = None
    """[S, W] ``accepted`` on the device, padded with -1 (lets arms gather rows without an upload)."""


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

    def propose(self, requests: Sequence[Request]) -> list[TreeDescriptor]:
        """One tree per running request: root = ``request.pending_token``, prefix_len = its context_len."""
        ...

    def on_step(self, feedback: StepFeedback) -> None:
        """The walk's result was committed; update drafter state along the accepted path."""
        ...

    def release(self, request: Request) -> None:
        """The request finished; free what the drafter holds for it."""
        ...

    def reset_shared(self) -> None:
        """Forget what was learned across requests (LumoTree's suffix cache); only between requests."""
        ...
