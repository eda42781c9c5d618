"""The engine: scheduler + runner + caches + sampler + arm behind one ``step()``.

A step is either a prefill step (prompt chunks; a request whose prompt completes draws its first token) or a
verify step over every running request: the arm proposes one tree per request, the target runs ONE forward
(decode mode when all trees are bare roots, tree mode otherwise), the walk selects each accepted path and
bonus token, the model commits the paths, and the arm learns the result.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lumotree.serving.arms import Arm, PrefillFeedback, StepFeedback, make_arm
from lumotree.serving.cache import CacheConfig, StateCaches
from lumotree.serving.config import ModelConfig
from lumotree.serving.detokenizer import IncrementalDetokenizer
from lumotree.serving.metrics import EngineCounters, SpanTimer
from lumotree.serving.model import HybridModel
from lumotree.serving.request import Request, RequestStats, Status
from lumotree.serving.runner import ModelRunner, RunnerConfig
from lumotree.serving.sampler import PresenceHistory, Sampler, SamplingParams, TreeBatch, random_seed
from lumotree.serving.scheduler import PrefillChunk, Scheduler, SchedulerConfig
from lumotree.serving.upload import to_device
from lumotree.serving.verifier import Verifier


@dataclass
class EngineConfig:
    """Everything that shapes one engine instance."""

    model: str = "tiny"
    """Built-in model name or checkpoint directory."""
    arm: str = "ar"
    """Decoding arm: ar | mtp | eagle | lumotree."""
    arm_options: dict[str, Any] = field(default_factory=dict)
    """Options for the arm's factory (mtp_k, tree, eagle_path, ...)."""
    device: str | None = None
    """cuda or cpu; None picks cuda when available."""
    dtype: str | None = None
    """Weight dtype (float32, bfloat16, float16); None = the checkpoint's on CUDA, float32 on CPU (bf16
    matmuls on CPU are slower and less exact)."""
    max_seqs: int = 8
    """Most requests decoded together."""
    max_model_len: int = 4096
    """Prompt + output tokens per request (also clipped to the model's max positions)."""
    block_size: int = 16
    """Tokens per KV block."""
    num_blocks: int | None = None
    """KV blocks in all; None = enough for max_seqs requests of max_model_len."""
    max_prefill_tokens: int = 2048
    """Prompt tokens per prefill step (longer prompts are chunked)."""
    cuda_graphs: bool = True
    """Capture decode steps as CUDA graphs on CUDA."""
    static_decode: bool = False
    """Run the padded graph-shaped decode path without graphs (tests)."""
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    """Decode batch sizes captured as graphs."""

    def resolved_device(self) -> torch.device:
        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_dtype(self) -> str | None:
        """The dtype to load weights in on the resolved device (None = the checkpoint's)."""
        from lumotree.serving.loader import device_dtype

        return device_dtype(self.dtype, self.resolved_device())


@dataclass
class RequestOutput:
    """What one step produced for one request (streaming consumers read new_text / new_token_ids)."""

    req_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    request: Request

    @property
    def token_ids(self) -> list[int]:
        return self.request.output_ids

    @property
    def text(self) -> str:
        return self.request.text

    @property
    def stats(self) -> RequestStats:
        return self.request.stats


class Engine:
    """Continuous batching over one model and one arm."""

    def __init__(
        self,
        model: HybridModel,
        tokenizer: Any | None,
        config: EngineConfig,
        arm: Arm | None = None,
        model_name: str = "model",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        mc: ModelConfig = model.config
        self.model_config = mc
        self.device = next(model.parameters()).device
        self.max_model_len = min(config.max_model_len, mc.max_position_embeddings)
        self.arm: Arm = arm if arm is not None else make_arm(config.arm, **config.arm_options)
        tree_rows = self.arm.max_tree_rows()
        bs = config.block_size
        blocks_per_seq = -(-(self.max_model_len + tree_rows) // bs)
        num_blocks = config.num_blocks or config.max_seqs * blocks_per_seq + 1
        # One extra pool row and block for the runner's padding sequence.
        self.caches = StateCaches(
            mc, CacheConfig(max_seqs=config.max_seqs + 1, num_blocks=num_blocks + 1, block_size=bs),
            self.device, model.dtype,
        )  # fmt: skip
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_seqs, config.max_prefill_tokens, tree_rows),
            self.caches,
            reserved_blocks=1,
        )
        self.runner = ModelRunner(
            model, self.caches,
            RunnerConfig(config.max_seqs, blocks_per_seq, config.cuda_graphs, config.static_decode,
                         config.graph_batch_sizes),
        )  # fmt: skip
        self.sampler = Sampler(mc.vocab_size, self.device, self.runner.fn_graphs)
        self.verifier = Verifier(model, self.caches, self.sampler, self.runner)
        self.history = PresenceHistory(config.max_seqs + 1, mc.vocab_size, self.device)
        self.counters = EngineCounters()
        self.timer = SpanTimer(self.device)
        eos = set(mc.eos_token_ids) | set(getattr(tokenizer, "eos_token_ids", None) or ())
        self.eos_ids = frozenset(eos)
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._emitted: dict[str, int] = {}
        self._ids = itertools.count()
        self.arm.start(self)

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        """Load the model (built-in name or path) and its tokenizer, then build the engine."""
        from lumotree.serving.builtin import model_name, resolve_model
        from lumotree.serving.loader import load_model
        from lumotree.serving.tokenizer import Tokenizer

        path = resolve_model(config.model)
        model, _ = load_model(path, device=config.resolved_device(), dtype=config.resolved_dtype())
        tokenizer = Tokenizer.from_pretrained(path)
        return cls(model, tokenizer, config, model_name=model_name(config.model))

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        req_id: str | None = None,
    ) -> Request:
        """Queue a request (text needs a tokenizer). Raises ValueError for prompts that cannot fit."""
        params = params or SamplingParams()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids")
            ids = list(self.tokenizer.encode(prompt))
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; this model serves at most {self.max_model_len} tokens "
                "of prompt + output"
            )
        req = Request(
            req_id=req_id if req_id is not None else f"req-{next(self._ids)}",
            prompt_ids=ids,
            params=params,
            seed=params.seed if params.seed is not None else random_seed(),
            max_tokens=min(params.max_tokens, self.max_model_len - len(ids)),
        )
        self.scheduler.add(req)
        if self.tokenizer is not None:
            self._detok[req.req_id] = IncrementalDetokenizer(self.tokenizer, ids)
        self._emitted[req.req_id] = 0
        return req

    def abort(self, req_id: str) -> None:
        req = self.scheduler.abort(req_id)
        if req is not None:
            self._release(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def reset_shared_caches(self) -> None:
        """Start the next request as on a fresh engine as far as drafting goes: forget what the arm learned
        from earlier requests (benchmarks re-issuing the same requests would otherwise draft from their own
        earlier outputs)."""
        assert not self.scheduler.has_work, "requests are still in flight"
        self.arm.reset_shared()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ------------------------------------------------------------------ stepping
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        if plan.prefill:
            return self._prefill(plan.prefill)
        if plan.decode:
            return self._decode(plan.decode)
        return []

    def _prefill(self, chunks: list[PrefillChunk]) -> list[RequestOutput]:
        t0 = time.perf_counter()
        for c in chunks:
            if c.start == 0:
                self.history.reset(c.request.state_row)
        with self.timer.span("target_forward", self.counters):
            hidden, last_logits, offsets = self.runner.prefill(chunks)
        finals = [i for i, c in enumerate(chunks) if c.last]
        first: list[int | None] = [None] * len(chunks)
        if finals:
            reqs = [chunks[i].request for i in finals]
            sel = torch.tensor(finals, device=self.device)
            with self.timer.span("sampling", self.counters):
                toks = self.sampler.sample(
                    last_logits[sel], self.history.rows(self._rows(reqs)), [r.params for r in reqs],
                    self._seeds(reqs), torch.zeros(len(reqs), dtype=torch.long, device=self.device),
                )  # fmt: skip
            for i, t in zip(finals, toks.tolist(), strict=True):
                first[i] = t
        for c in chunks:
            c.request.context_len += c.length
            self.counters.prompt_tokens += c.length
        self.arm.on_prefill(
            PrefillFeedback([c.request for c in chunks], hidden, offsets, [c.start for c in chunks], first)
        )
        outputs = []
        now = time.monotonic()
        for c, tok in zip(chunks, first, strict=True):
            if tok is not None:
                c.request.stats.first_token_time = now
                outputs.append(self._emit(c.request, [tok]))
        self.counters.steps += 1
        self.counters.prefill_steps += 1
        self.counters.prefill_seconds += time.perf_counter() - t0
        self.timer.collect(self.counters)
        return outputs

    def _decode(self, reqs: list[Request]) -> list[RequestOutput]:
        t0 = time.perf_counter()
        with self.timer.span("drafting", self.counters):
            trees = self.arm.propose(reqs)
        assert len(trees) == len(reqs), "the arm must propose one tree per request"
        for t, r in zip(trees, reqs, strict=True):
            assert t.prefix_len == r.context_len, "a tree's prefix_len must be its request's context_len"
        plain = all(t.num_rows == 1 for t in trees)
        out = None
        with self.timer.span("target_forward", self.counters):
            if plain:
                logits, hidden = self.runner.decode(reqs)
                tb = TreeBatch.roots(to_device([r.pending_token for r in reqs], self.device))
            else:
                out = self.verifier.verify([r.req_id for r in reqs], trees)
                logits, hidden, tb = out.logits, out.hidden, out.tree_batch()
        with self.timer.span("sampling", self.counters):
            # Seeds, output positions and history rows cross to the device in one pinned copy, queued behind
            # the verify forward (a pageable copy may wait for it, and the walk's launches with it).
            small = to_device(
                [r.seed for r in reqs] + [len(r.output_ids) for r in reqs] + [r.state_row for r in reqs],
                self.device,
            ).view(3, len(reqs))
            penalty = any(r.params.presence_penalty != 0.0 for r in reqs)
            history = self.history.rows(small[2]) if penalty else None
            res = self.sampler.walk(tb, logits, history, [r.params for r in reqs], small[0], small[1])
        if out is not None:
            with self.timer.span("commit", self.counters):
                self.verifier.commit(out, res)
        # The step's one host read: accepted rows, their tokens and the bonus, all together.
        assert res.path_tokens is not None
        host = torch.cat([res.accepted, res.path_tokens, res.bonus[:, None]], 1).tolist()
        width = res.accepted.shape[1]
        accepted = [[i for i in row[:width] if i >= 0] for row in host]
        acc_tokens = [row[width : width + len(a)] for row, a in zip(host, accepted, strict=True)]
        bonus = [row[-1] for row in host]
        ctx_before = [r.context_len for r in reqs]
        new_tokens = []
        for r, toks, b in zip(reqs, acc_tokens, bonus, strict=True):
            assert toks[0] == r.pending_token, "tree root must be the pending token"
            r.context_len += len(toks)  # root + accepted drafts are now committed
            new_tokens.append(toks[1:] + [b])
        self.arm.on_step(
            StepFeedback(
                reqs, trees, hidden, tb.offsets, accepted, acc_tokens, bonus, ctx_before, res.accepted
            )
        )
        elapsed = time.perf_counter() - t0
        c = self.counters
        c.steps += 1
        c.decode_steps += 1
        c.decode_seconds += elapsed
        outputs = []
        for r, t, acc, toks in zip(reqs, trees, accepted, new_tokens, strict=True):
            s = r.stats
            s.decode_steps += 1
            s.decode_seconds += elapsed
            if t.num_drafts:
                s.drafts += 1
                s.draft_tokens += t.num_drafts
                s.accepted_tokens += len(acc) - 1
                c.drafts += 1
                c.draft_tokens += t.num_drafts
                c.accepted_tokens += len(acc) - 1
                c.add_accepted_depths(len(acc) - 1)
            outputs.append(self._emit(r, toks))
        self.timer.collect(self.counters)
        return outputs

    def _rows(self, reqs: Sequence[Request]) -> torch.Tensor:
        return torch.tensor([r.state_row for r in reqs], device=self.device)

    def _seeds(self, reqs: Sequence[Request]) -> torch.Tensor:
        return torch.tensor([r.seed for r in reqs], dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ outputs
    def _emit(self, req: Request, tokens: list[int]) -> RequestOutput:
        """Append tokens, applying EOS, stop tokens, stop strings and the length limit in order."""
        p = req.params
        detok = self._detok.get(req.req_id)
        added: list[int] = []
        reason = None
        for tok in tokens:
            req.output_ids.append(tok)
            added.append(tok)
            if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
                reason = "stop"
                break
            if detok is not None:
                req.text += detok.add(tok)
                if p.stop and self._cut_stop(req):
                    reason = "stop"
                    break
            if len(req.output_ids) >= req.max_tokens:
                reason = "length"
                break
        self.history.add(
            torch.full((len(added),), req.state_row, device=self.device),
            to_device(added, self.device),
        )
        self.counters.generation_tokens += len(added)
        # Hold back text that could still become a stop string.
        hold = 0 if reason is not None or not p.stop else max(len(s) for s in p.stop) - 1
        start = self._emitted.get(req.req_id, 0)
        end = max(start, len(req.text) - hold)
        self._emitted[req.req_id] = end
        if reason is not None:
            self.scheduler.finish(req, reason)
            self.counters.requests_finished += 1
            self._release(req)
        return RequestOutput(req.req_id, added, req.text[start:end], reason is not None, reason, req)

    @staticmethod
    def _cut_stop(req: Request) -> bool:
        hits = [i for i in (req.text.find(s) for s in req.params.stop) if i >= 0]
        if not hits:
            return False
        req.text = req.text[: min(hits)]
        return True

    def _release(self, req: Request) -> None:
        self.arm.release(req)
        self._detok.pop(req.req_id, None)
        self._emitted.pop(req.req_id, None)

    # ------------------------------------------------------------------ convenience
    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Request]:
        """Run requests to completion (continuous batching) and return them in input order."""
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while any(r.status is not Status.FINISHED for r in reqs):
            self.step()
        return reqs

    def check_no_leaks(self) -> None:
        """Only the runner's padding sequence may hold cache resources when idle."""
        assert not self.scheduler.has_work, "requests are still in flight"
        self.caches.assert_no_leaks(allow_live=True)
        assert list(self.caches.seqs) == ["__pad__"], f"leaked sequences: {list(self.caches.seqs)}"
