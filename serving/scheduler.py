"""Admission and batching: waiting -> running by cache capacity, chunked prefill first, then decode.

No preemption: a request is admitted only when a pool row is free and the KV blocks for its whole life
(prompt + max_tokens + the arm's tree rows) fit beside what running requests reserved, so a running request
can never run out of cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from lumotree.serving.cache import StateCaches
from lumotree.serving.request import Request, Status


@dataclass(frozen=True)
class SchedulerConfig:
    """Batching limits."""

    max_seqs: int
    """Most requests running at once (= usable pool rows)."""
    max_prefill_tokens: int = 2048
    """Prompt tokens per prefill step, summed over requests (longer prompts are chunked)."""
    tree_rows: int = 1
    """Verify rows per request per step (the arm's ``max_tree_rows``): KV headroom reserved at admission."""


@dataclass
class PrefillChunk:
    request: Request
    start: int
    """First prompt position of the chunk (= tokens already committed)."""
    length: int

    @property
    def last(self) -> bool:
        return self.start + self.length == len(self.request.prompt_ids)


@dataclass
class Plan:
    """What one engine step does: prefill chunks, or one verify step over running requests."""

    prefill: list[PrefillChunk]
    decode: list[Request]

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, config: SchedulerConfig, caches: StateCaches, reserved_blocks: int = 0) -> None:
        self.config = config
        self.caches = caches
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Blocks the engine keeps for itself (e.g. the padding sequence of CUDA-graph batches).
        self.budget = caches.cache_config.num_blocks - reserved_blocks

    def blocks_for(self, req: Request) -> int:
        return self.blocks_needed(len(req.prompt_ids), req.max_tokens)

    def blocks_needed(self, prompt_tokens: int, max_tokens: int) -> int:
        return -(-(prompt_tokens + max_tokens + self.config.tree_rows) // self.caches.block_size)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise ValueError when a request could never be admitted, however long it waits."""
        need = self.blocks_needed(prompt_tokens, max_tokens)
        if need > self.budget:
            raise ValueError(
                f"the request needs {need} KV blocks for {prompt_tokens} prompt + {max_tokens} new tokens; "
                f"the cache holds {self.budget} (lower max_tokens)"
            )

    def add(self, req: Request) -> None:
        self.check_fits(len(req.prompt_ids), req.max_tokens)
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _reserved(self) -> int:
        return sum(r.reserved_blocks for r in self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_seqs:
            req = self.waiting[0]
            need = self.blocks_for(req)
            if self._reserved() + need > self.budget:
                break  # FIFO: later requests wait behind the head so none starves
            self.waiting.popleft()
            slots = self.caches.allocate(req.req_id, len(req.prompt_ids))
            req.state_row = slots.state_row
            req.reserved_blocks = need
            req.status = Status.RUNNING
            self.running.append(req)

    def schedule(self) -> Plan:
        self._admit()
        chunks: list[PrefillChunk] = []
        budget = self.config.max_prefill_tokens
        for req in self.running:
            if req.prefilled or budget <= 0:
                continue
            n = min(len(req.prompt_ids) - req.context_len, budget)
            chunks.append(PrefillChunk(req, req.context_len, n))
            budget -= n
        if chunks:
            return Plan(prefill=chunks, decode=[])
        return Plan(prefill=[], decode=[r for r in self.running if not r.finished])

    def finish(self, req: Request, reason: str) -> None:
        """Mark finished and give its rows and blocks back."""
        req.status = Status.FINISHED
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
            self.caches.free(req.req_id)

    def abort(self, req_id: str) -> Request | None:
        for req in list(self.waiting):
            if req.req_id == req_id:
                self.waiting.remove(req)
                req.status, req.finish_reason = Status.FINISHED, "abort"
                return req
        for req in self.running:
            if req.req_id == req_id:
                self.finish(req, "abort")
                return req
        return None
