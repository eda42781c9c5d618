"""A deterministic scripted model for testing the agent loop and the orchestrator (never a product default).

It is stateless: the reply is chosen by how many assistant messages the conversation already has, so the same
script gives the same episode in any process, also after an actor restart.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from lumotree.agents.config import SamplingConfig
from lumotree.agents.protocols import DecodeStats, ModelReply


class ScriptedModel:
    """Replays ``replies`` in order; past the end it repeats the last one."""

    def __init__(self, replies: Sequence[str], delay_s: float = 0.0) -> None:
        assert replies, "a script needs at least one reply"
        self.replies = list(replies)
        self.delay_s = delay_s

    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig) -> ModelReply:
        start = time.monotonic()
        turn = sum(1 for m in messages if m["role"] == "assistant")
        text = self.replies[min(turn, len(self.replies) - 1)]
        if self.delay_s:
            time.sleep(self.delay_s)
        # Word counts stand in for tokens: the loop only needs consistent, positive numbers.
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        tokens = max(1, len(text.split()))
        seconds = time.monotonic() - start
        stats = DecodeStats(tokens=tokens, steps=tokens, decode_seconds=max(seconds, 1e-6))
        return ModelReply(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=tokens,
            stats=stats,
            seconds=seconds,
            sampling=sampling.to_dict(),
        )
