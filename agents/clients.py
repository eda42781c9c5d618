"""Model clients: an arm behind a Ray actor handle, or any OpenAI-compatible server (vLLM, SGLang, ours).

Both return a ``ModelReply`` whose decode statistics come from the server's own counters, as differences taken
around the call (so they are exact while one client at a time uses an arm, which is how sweeps schedule arms).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from lumotree.agents.config import SamplingConfig
from lumotree.agents.protocols import ContextLengthExceeded, DecodeStats, ModelReply


class ActorModel:
    """Chat through a Ray actor hosting an arm (``lumotree.platform.actors.ArmActor``).

    The actor's ``chat(messages, sampling: dict) -> dict`` returns ``ModelReply.to_dict()``; actor failures
    (death, restart) propagate as Ray's exceptions so the orchestrator can retry the attempt.
    """

    def __init__(self, handle: Any, timeout_s: float | None = None) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig) -> ModelReply:
        import ray

        start = time.monotonic()
        data = ray.get(self.handle.chat.remote(messages, sampling.to_dict()), timeout=self.timeout_s)
        if data.get("error") == "context_length":
            raise ContextLengthExceeded(data.get("message", "prompt too long"))
        reply = ModelReply.from_dict(data)
        reply.seconds = time.monotonic() - start
        return reply


# Prometheus counter families (suffix match, so ``vllm:`` / ``sglang:`` / ``lumotree:`` prefixes all work).
_COUNTERS = {
    "drafts": "spec_decode_num_drafts",
    "draft_tokens": "spec_decode_num_draft_tokens",
    "accepted_tokens": "spec_decode_num_accepted_tokens",
    "tokens": "generation_tokens",
    "steps": "decode_steps",
    "decode_seconds": "decode_busy_seconds",
}
_PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"
_SPANS = "step_span_seconds"


def scrape_counters(text: str) -> dict[str, Any]:
    """Decode counters from a Prometheus exposition (summed over label sets; per position and per span by
    label). Counters a server does not expose are absent from the result."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    spans: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removesuffix("_total")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if name.endswith(_PER_POSITION):
                pos = int(sample.labels.get("position", "0"))
                per_pos[pos] = per_pos.get(pos, 0) + sample.value
            elif name.endswith(_SPANS):
                span = sample.labels.get("span", "")
                spans[span] = spans.get(span, 0.0) + sample.value
            else:
                for key, suffix in _COUNTERS.items():
                    if name.endswith(suffix):
                        out[key] = out.get(key, 0) + sample.value
    if per_pos:
        out["accepted_per_position"] = [int(per_pos[p]) for p in sorted(per_pos)]
    if spans:
        out["spans"] = spans
    return out


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """after - before for every counter present in ``after`` (lists per position, dicts per key)."""
    delta: dict[str, Any] = {}
    for key, a in after.items():
        b = before.get(key)
        if isinstance(a, dict):
            delta[key] = {k: v - (b or {}).get(k, 0.0) for k, v in a.items()}
        elif isinstance(a, list):
            b = b or []
            delta[key] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
        else:
            delta[key] = a - (b or 0)
    return delta


class OpenAIModel:
    """Chat with an OpenAI-compatible server at ``base_url`` (``.../v1`` or the bare host; both work).

    Streams the reply to time the first token and the decode phase from the client side, asks for usage in the
    last chunk, and takes speculative counters from ``/metrics`` when the server exposes them.
    """

    def __init__(
        self, base_url: str, model: str | None = None, api_key: str = "EMPTY", timeout_s: float = 600.0
    ) -> None:
        root = base_url.rstrip("/")
        self.root = root.removesuffix("/v1")
        self.api = self.root + "/v1"
        self.client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        data = self.client.get(self.api + "/models").raise_for_status().json()
        models = [m["id"] for m in data.get("data", [])]
        assert models, f"{self.api}/models lists no model"
        return models[0]

    def _counters(self) -> dict[str, Any] | None:
        try:
            resp = self.client.get(self.root + "/metrics")
        except httpx.HTTPError:
            return None
        return scrape_counters(resp.text) if resp.status_code == 200 else None

    def request_body(self, messages: list[dict[str, str]], sampling: SamplingConfig) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "presence_penalty": sampling.presence_penalty,
            # Not in OpenAI's schema; vLLM and SGLang accept them as extra body fields.
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig) -> ModelReply:
        before = self._counters()
        start = time.monotonic()
        first: float | None = None
        parts: list[str] = []
        usage: dict[str, Any] = {}
        finish = "stop"
        extra_stats: dict[str, Any] = {}
        with self.client.stream(
            "POST", self.api + "/chat/completions", json=self.request_body(messages, sampling)
        ) as r:
            if r.status_code == 400:
                text = r.read().decode(errors="replace")
                if "context" in text.lower() or "too long" in text.lower():
                    raise ContextLengthExceeded(text[:500])
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                usage = chunk.get("usage") or usage
                # Our own server adds the engine's exact decode counters to the last chunk.
                extra_stats = chunk.get("decode_stats") or extra_stats
                for choice in chunk.get("choices", []):
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        first = first or time.monotonic()
                        parts.append(delta)
                    finish = choice.get("finish_reason") or finish
        end = time.monotonic()
        after = self._counters()
        completion = int(usage.get("completion_tokens", 0))
        if extra_stats:
            stats = DecodeStats.from_dict(extra_stats)
        else:
            stats = self._stats(before, after, completion, decode_wall=end - (first or end))
        return ModelReply(
            text="".join(parts),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=completion,
            stats=stats,
            seconds=end - start,
            finish_reason=finish,
            sampling=sampling.to_dict(),
        )

    @staticmethod
    def _stats(
        before: dict[str, Any] | None, after: dict[str, Any] | None, completion: int, decode_wall: float
    ) -> DecodeStats:
        """Server counter differences where the server has them; client-side timing otherwise."""
        spec = counter_delta(before, after) if before is not None and after is not None else {}
        ints = ("drafts", "draft_tokens", "accepted_tokens", "steps", "tokens")
        values: dict[str, Any] = {k: int(round(spec[k])) for k in ints if k in spec}
        values.setdefault("tokens", completion)
        values.setdefault("steps", max(0, completion - values.get("accepted_tokens", 0)))
        values["decode_seconds"] = (
            float(spec["decode_seconds"]) if spec.get("decode_seconds") else decode_wall
        )
        values["accepted_per_position"] = [int(x) for x in spec.get("accepted_per_position", [])]
        values["spans"] = {k: float(v) for k, v in spec.get("spans", {}).items()}
        return DecodeStats(**values)

    def close(self) -> None:
        self.client.close()
