"""OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (SSE streaming), /v1/models,
/health and Prometheus /metrics, over one engine driven by a background thread (continuous batching).

Bad requests (invalid JSON, unknown model, out-of-range sampling values, prompts or max_tokens beyond the
context) get a 4xx with OpenAI's error body; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from lumotree.serving.async_engine import AsyncEngine, Delta
from lumotree.serving.metrics import prometheus_text
from lumotree.serving.openai_protocol import (
    ChatRequest,
    CompletionRequest,
    ProtocolError,
    ValidationError,
    _Common,
    error_body,
    new_id,
    now,
    usage,
    validation_message,
)
from lumotree.serving.sampler import SamplingParams


def _error(e: ProtocolError) -> JSONResponse:
    return JSONResponse(error_body(str(e), e.status, e.param, e.code), status_code=e.status)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _envelope(rid: str, kind: str, ts: int, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": ts, "model": model, "choices": choices}


def create_app(engine: AsyncEngine, model_name: str) -> FastAPI:
    """The FastAPI app; ``engine`` is already running. Shutting the app down stops the engine thread."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()

    app = FastAPI(title="LumoTree", lifespan=lifespan)
    tok = engine.engine.tokenizer
    created = now()

    async def parse(request: Request, cls: type[_Common]) -> Any:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProtocolError(f"invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise ProtocolError("the JSON body must be an object")
        try:
            req = cls.model_validate(body)
        except ValidationError as e:
            msg, param = validation_message(e)
            raise ProtocolError(msg, param=param) from None
        if req.model != model_name:
            raise ProtocolError(
                f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                status=404, param="model", code="model_not_found",
            )  # fmt: skip
        return req

    def encode(prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if tok is None:
                raise ProtocolError("this server has no tokenizer; send token ids", param="prompt")
            return tok.encode(prompt)
        return list(prompt)

    def default_max_tokens(ids: list[int], fallback: int | None) -> int:
        room = engine.engine.max_model_len - len(ids)
        return max(1, room if fallback is None else min(fallback, room))

    def params_for(req: Any, ids: list[int], fallback: int | None) -> SamplingParams:
        params = req.sampling_params(default_max_tokens(ids, fallback))
        try:
            engine.validate(ids, params)
        except ValueError as e:
            param = "max_tokens" if "max_tokens" in str(e) else "prompt"
            raise ProtocolError(str(e), param=param) from None
        return params

    def stream(
        ids: list[int],
        params: SamplingParams,
        head: list[dict[str, Any]],
        choice: Any,
        usage_envelope: dict[str, Any] | None,
    ) -> StreamingResponse:
        """SSE: the ``head`` events, one event per delta with text (``choice(delta)`` builds it), the usage
        event when asked for, then [DONE]. Engine errors become an error event."""

        async def events() -> AsyncIterator[str]:
            for h in head:
                yield _sse(h)
            last = Delta("", [])
            try:
                async for d in engine.generate(ids, params):
                    last = d
                    if d.text or d.finished:
                        yield _sse(choice(d))
            except RuntimeError as e:
                yield _sse(error_body(str(e), 500))
            if usage_envelope is not None:
                yield _sse(
                    {**usage_envelope, "choices": [], "usage": usage(len(ids), last.completion_tokens)}
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def collect(ids: list[int], params: SamplingParams) -> Delta:
        text, n, reason = [], 0, None
        async for d in engine.generate(ids, params):
            text.append(d.text)
            n, reason = d.completion_tokens, d.finish_reason
        return Delta("".join(text), [], True, reason, len(ids), n)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, e: ProtocolError) -> JSONResponse:
        return _error(e)

    @app.get("/health")
    async def health() -> dict[str, str]:
        # still serving after a failed capture, only slower: say so rather than report unhealthy
        err = engine.engine.runner.graph_error
        return {"status": "ok"} if err is None else {"status": "ok", "cuda_graph_error": err}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "lumotree",
                "max_model_len": engine.engine.max_model_len, "arm": engine.engine.arm.name}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        e = engine.engine
        failed = e.runner.graph_error is not None
        body = prometheus_text(e.counters, model_name, e.arm.name, e.num_running, e.num_waiting, failed)
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req: CompletionRequest = await parse(request, CompletionRequest)
        prompts = [encode(p) for p in req.prompts()]
        params = [params_for(req, ids, 16) for ids in prompts]
        rid, ts = new_id("cmpl"), now()

        def chunk(index: int, text: str, reason: str | None) -> dict[str, Any]:
            choice = {"index": index, "text": text, "finish_reason": reason, "logprobs": None}
            return _envelope(rid, "text_completion", ts, model_name, [choice])

        if req.stream:
            if len(prompts) != 1:
                raise ProtocolError("streaming takes a single prompt", param="prompt")
            use = _envelope(rid, "text_completion", ts, model_name, []) if req.include_usage else None
            return stream(prompts[0], params[0], [], lambda d: chunk(0, d.text, d.finish_reason), use)
        results = await asyncio.gather(*(collect(ids, p) for ids, p in zip(prompts, params, strict=True)))
        body = chunk(0, "", None)
        body["choices"] = [
            {"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None}
            for i, r in enumerate(results)
        ]
        body["usage"] = usage(
            sum(r.prompt_tokens for r in results), sum(r.completion_tokens for r in results)
        )
        return body

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req: ChatRequest = await parse(request, ChatRequest)
        if tok is None or getattr(tok, "chat_template", None) is None:
            raise ProtocolError("this model has no chat template; use /v1/completions", param="messages")
        try:
            text = tok.apply_chat_template(
                [m.as_template_dict() for m in req.messages], add_generation_prompt=True
            )
        except ProtocolError:
            raise
        except Exception as e:  # the template itself rejected the conversation
            raise ProtocolError(f"chat template error: {e}", param="messages") from None
        ids = encode(text)
        params = params_for(req, ids, None)
        rid, ts = new_id("chatcmpl"), now()

        def chunk(delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            return _envelope(rid, "chat.completion.chunk", ts, model_name, [choice])

        if req.stream:
            use = _envelope(rid, "chat.completion.chunk", ts, model_name, []) if req.include_usage else None
            head = [chunk({"role": "assistant", "content": ""}, None)]
            return stream(
                ids,
                params,
                head,
                lambda d: chunk({"content": d.text} if d.text else {}, d.finish_reason),
                use,
            )
        r = await collect(ids, params)
        return {
            "id": rid, "object": "chat.completion", "created": ts, "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                         "finish_reason": r.finish_reason, "logprobs": None}],
            "usage": usage(r.prompt_tokens, r.completion_tokens),
        }  # fmt: skip

    return app


def serve(config: Any, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Load the engine for ``config`` (an EngineConfig) and serve until interrupted."""
    import uvicorn

    from lumotree.serving.engine import Engine

    engine = Engine.from_config(config)
    app = create_app(AsyncEngine(engine), engine.model_name)
    uvicorn.run(app, host=host, port=port, log_level="info")
