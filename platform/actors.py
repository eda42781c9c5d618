"""Ray actors hosting the arms: one actor per arm and model, restarted by Ray when it dies.

An actor answers ``chat(messages, sampling)`` for the agent and ``generate(prompt_token_ids, sampling)`` for
the replay benchmark; decode statistics are differences of the engine's counters around each call. The same
``ArmHost`` runs without Ray (``lumotree replay --no-ray`` on a GPU host).
"""

from __future__ import annotations

import os
import time
from typing import Any

from lumotree.agents.config import SamplingConfig
from lumotree.agents.protocols import DecodeStats, ModelReply
from lumotree.agents.scripted import ScriptedModel
from lumotree.platform.sweep_config import ArmSpec

# Engine counter names accepted for each DecodeStats field (first present wins).
_COUNTER_NAMES: dict[str, tuple[str, ...]] = {
    "tokens": ("generation_tokens", "completion_tokens", "num_tokens"),
    "steps": ("decode_steps", "steps"),
    "decode_seconds": ("decode_seconds",),
    "drafts": ("drafts", "num_drafts"),
    "draft_tokens": ("draft_tokens", "num_draft_tokens"),
    "accepted_tokens": ("accepted_tokens", "num_accepted_tokens"),
    "accepted_per_position": ("accepted_per_pos", "accepted_per_position"),
    "spans": ("span_seconds", "spans"),
}


def _pick(counters: dict[str, Any], field: str) -> Any:
    for name in _COUNTER_NAMES[field]:
        if name in counters:
            return counters[name]
    return None


def stats_from_counters(before: dict[str, Any], after: dict[str, Any]) -> DecodeStats:
    """DecodeStats of what happened between two ``LLM.counters()`` snapshots."""
    values: dict[str, Any] = {}
    for field in _COUNTER_NAMES:
        a, b = _pick(after, field), _pick(before, field)
        if a is None:
            continue
        if isinstance(a, dict):
            b = b or {}
            values[field] = {
                k: float(v) - float(b.get(k, 0.0)) for k, v in a.items() if float(v) != float(b.get(k, 0))
            }
        elif isinstance(a, list | tuple):
            b = list(b or [])
            values[field] = [int(x) - int(b[i] if i < len(b) else 0) for i, x in enumerate(a)]
        else:
            values[field] = type(a)(a - (b or 0))
    return DecodeStats.from_dict(values)


class ArmHost:
    """Serves one arm in this process: the embedded engine, or a scripted model (tests)."""

    def __init__(self, spec: ArmSpec | dict[str, Any], llm: Any = None) -> None:
        """``llm``: an already built ``lumotree.serving.llm.LLM`` to host instead of loading the model."""
        self.spec = spec if isinstance(spec, ArmSpec) else ArmSpec.model_validate(spec)
        assert self.spec.hosted, f"arm {self.spec.name} is an external server, not hosted"
        self.llm: Any = llm
        self.scripted: ScriptedModel | None = None
        if self.spec.kind == "scripted":
            assert self.spec.script is not None
            self.scripted = ScriptedModel(self.spec.script, delay_s=self.spec.delay_s)
        elif self.llm is None:
            self.llm = self._load_engine()

    def _load_engine(self) -> Any:
        from lumotree.serving.engine import EngineConfig
        from lumotree.serving.llm import LLM

        fields = set(EngineConfig.__dataclass_fields__)
        options = dict(self.spec.options)
        # Engine-wide settings go to EngineConfig; the rest (mtp_k, tree, ...) configure the arm.
        engine = {k: options.pop(k) for k in list(options) if k in fields and k != "arm_options"}
        config = EngineConfig(model=self.spec.model, arm=self.spec.engine_arm, arm_options=options, **engine)
        return LLM(config)

    @staticmethod
    def _params(sampling: dict[str, Any]) -> Any:
        from lumotree.serving.sampler import SamplingParams

        return SamplingParams(**sampling)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The conversation through the chat template, tokenized: exactly what the engine gets."""
        tok = self.llm.tokenizer
        assert tok is not None, f"arm {self.spec.name}: the model has no tokenizer, so it cannot chat"
        return list(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))

    def pid(self) -> int:
        return os.getpid()

    def info(self) -> dict[str, Any]:
        """The arm's resolved configuration (stored with the sweep's arm)."""
        info: dict[str, Any] = {"spec": self.spec.model_dump(), "pid": os.getpid()}
        if self.llm is not None and hasattr(self.llm, "describe"):
            info["engine"] = self.llm.describe()
        return info

    def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> dict[str, Any]:
        if self.scripted is not None:
            return self.scripted.chat(messages, SamplingConfig(**sampling)).to_dict()
        start = time.monotonic()
        ids = self.prompt_ids(messages)
        limit = int(self.llm.engine.max_model_len)
        if len(ids) >= limit:
            return {
                "error": "context_length",
                "message": f"prompt of {len(ids)} tokens; the arm serves {limit}",
            }
        before = self.llm.counters()
        result = self.llm.generate([ids], self._params(sampling))[0]
        stats = stats_from_counters(before, self.llm.counters())
        return ModelReply(
            text=result.text,
            prompt_tokens=len(ids),
            completion_tokens=int(result.num_tokens),
            stats=stats,
            seconds=time.monotonic() - start,
            finish_reason=str(result.finish_reason or "stop"),
            prompt_token_ids=ids,
            sampling=dict(sampling),
        ).to_dict()

    def reset_shared_caches(self) -> None:
        """Forget what the arm learned across requests (before each replay pass)."""
        if self.llm is not None:
            self.llm.reset_shared_caches()

    def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        """One replayed request: its token count and the decode statistics of exactly this call."""
        assert self.llm is not None, "replay needs an engine arm"
        before = self.llm.counters()
        start = time.monotonic()
        result = self.llm.generate([list(prompt_token_ids)], self._params(sampling))[0]
        seconds = time.monotonic() - start
        stats = stats_from_counters(before, self.llm.counters())
        return {"tokens": int(result.num_tokens), "seconds": seconds, "stats": stats.to_dict()}


class ArmStartError(RuntimeError):
    """An arm could not be started (model missing, arm unavailable in this build, actor crashed in setup)."""


def check_specs(specs: list[ArmSpec]) -> None:
    """Fail fast in the driver, with the engine's own message, when an engine arm cannot load."""
    from lumotree.serving.arms import ARMS
    from lumotree.serving.builtin import resolve_model

    for spec in specs:
        if spec.kind != "engine":
            continue
        try:
            resolve_model(spec.model)
        except FileNotFoundError as exc:
            raise ArmStartError(f"arm {spec.name}: {exc}") from None
        if spec.engine_arm not in ARMS:
            raise ArmStartError(f"arm {spec.name}: unknown engine arm {spec.engine_arm!r}")


def gpu_share(num_arms: int) -> float:
    """GPUs per arm actor: one each when there are enough, else an equal fraction; 0 without GPUs."""
    import ray

    gpus = float(ray.cluster_resources().get("GPU", 0.0))
    if gpus <= 0 or num_arms <= 0:
        return 0.0
    return 1.0 if gpus >= num_arms else gpus / num_arms


def start_arm_actors(
    specs: list[ArmSpec], *, max_restarts: int = 3, ready_timeout_s: float = 600.0
) -> dict[str, Any]:
    """One named Ray actor per hosted arm, restarted up to ``max_restarts`` times when it dies.

    In-flight calls of a dying actor fail (no task retries): the orchestrator retries the whole attempt,
    since a half-finished agent step cannot be replayed safely. Waits until every actor has loaded its model.
    """
    import ray

    check_specs(specs)
    hosted = [s for s in specs if s.hosted]
    share = gpu_share(sum(1 for s in hosted if s.kind == "engine"))
    remote_cls = ray.remote(ArmHost)
    handles: dict[str, Any] = {}
    for spec in hosted:
        gpus = share if spec.kind == "engine" else 0.0
        handles[spec.name] = remote_cls.options(  # type: ignore[attr-defined]
            num_cpus=0, num_gpus=gpus, max_restarts=max_restarts, max_task_retries=0, max_concurrency=1
        ).remote(spec.model_dump())
    for name, handle in handles.items():
        try:
            ray.get(handle.pid.remote(), timeout=ready_timeout_s)
        except ray.exceptions.RayError as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ArmStartError(f"arm {name} failed to start: {last}") from exc
    return handles
