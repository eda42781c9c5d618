"""One background thread drives the engine; asyncio handlers submit requests and await their deltas.

Every submitted request joins the running batch at the next step (continuous batching). Deltas cross from
the engine thread to the event loop with ``call_soon_threadsafe``; each delta is a snapshot, so handlers
never read state the engine thread is mutating.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from lumotree.serving.engine import Engine
from lumotree.serving.sampler import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Delta:
    """New output of one request since the previous delta."""

    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    stats: dict[str, float] = field(default_factory=dict)


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cv = threading.Condition()
        self._inbox: list[
            tuple[str, list[int], SamplingParams, asyncio.AbstractEventLoop, asyncio.Queue]
        ] = []
        self._aborts: list[str] = []
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = False
        self._counter = 0
        self._thread = threading.Thread(target=self._loop, name="lumotree-engine", daemon=True)
        self._thread.start()

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError when the request could never run (checked before it is queued)."""
        eng = self.engine
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = eng.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        limit = eng.max_model_len
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"this model's maximum context length is {limit} tokens; "
                f"the prompt has {len(prompt_ids)} tokens"
            )
        if len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(
                f"this model's maximum context length is {limit} tokens; the prompt has {len(prompt_ids)} "
                f"tokens and max_tokens is {params.max_tokens} (at most {limit - len(prompt_ids)} allowed)"
            )
        eng.scheduler.check_fits(len(prompt_ids), params.max_tokens)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[Delta]:
        """Yield deltas until the request finishes; aborts it if the consumer goes away."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        with self._cv:
            self._counter += 1
            req_id = f"srv-{self._counter}"
            self._inbox.append((req_id, prompt_ids, params, loop, queue))
            self._cv.notify()
        finished = False
        try:
            while True:
                delta = await queue.get()
                if delta.error is not None:
                    finished = True
                    raise RuntimeError(delta.error)
                yield delta
                if delta.finished:
                    finished = True
                    return
        finally:
            if not finished:
                with self._cv:
                    self._aborts.append(req_id)
                    self._cv.notify()

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ engine thread
    def _post(self, req_id: str, delta: Delta) -> None:
        target = self._queues.get(req_id)
        if target is None:
            return
        loop, queue = target
        if delta.finished or delta.error is not None:
            self._queues.pop(req_id, None)
        try:
            loop.call_soon_threadsafe(queue.put_nowait, delta)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    def _loop(self) -> None:
        eng = self.engine
        while True:
            with self._cv:
                while not (self._stop or self._inbox or self._aborts or eng.has_unfinished()):
                    self._cv.wait()
                if self._stop:
                    return
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            for req_id in aborts:
                self._queues.pop(req_id, None)
                eng.abort(req_id)
            for req_id, ids, params, loop, queue in inbox:
                self._queues[req_id] = (loop, queue)
                try:
                    eng.add_request(ids, params, req_id=req_id)
                except ValueError as e:
                    self._post(req_id, Delta("", [], error=str(e)))
            if not eng.has_unfinished():
                continue
            try:
                outputs = eng.step()
            except Exception as e:  # fail the in-flight requests, keep serving the next ones
                log.exception("engine step failed")
                for req_id in list(self._queues):
                    self._post(req_id, Delta("", [], error=f"engine error: {type(e).__name__}: {e}"))
                    eng.abort(req_id)
                continue
            for out in outputs:
                req = out.request
                stats = {}
                if out.finished:
                    s = req.stats
                    stats = {
                        "decode_steps": s.decode_steps,
                        "decode_seconds": s.decode_seconds,
                        "draft_tokens": s.draft_tokens,
                        "accepted_tokens": s.accepted_tokens,
                    }
                self._post(
                    out.req_id,
                    Delta(
                        out.new_text, list(out.new_token_ids), out.finished, out.finish_reason,
                        len(req.prompt_ids), len(req.output_ids), None, stats,
                    ),
                )  # fmt: skip
