"""The OpenAI-compatible server, through the official ``openai`` client, against a real uvicorn server on
127.0.0.1 serving a random tiny checkpoint with a small BPE tokenizer."""

from __future__ import annotations

import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from lumotree.serving.async_engine import AsyncEngine
from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.loader import load_model
from lumotree.serving.sampler import SamplingParams
from lumotree.serving.server import create_app
from lumotree.serving.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from _chat_checkpoint import chat_checkpoint  # noqa: E402

MODEL = "tiny-test"
MAX_LEN = 160


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoints, tmp_path_factory) -> Path:
    return chat_checkpoint(tiny_checkpoints["gdn3_attn1"], tmp_path_factory.mktemp("chat") / "ckpt")


@pytest.fixture(scope="module")
def model(ckpt):
    return load_model(ckpt, "cpu", torch.float32)[0]


@pytest.fixture(scope="module")
def server(ckpt, model):
    import uvicorn

    engine = Engine(model, Tokenizer(ckpt), EngineConfig(max_seqs=6, max_model_len=MAX_LEN), model_name=MODEL)
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(AsyncEngine(engine), MODEL), host="127.0.0.1", port=port,
                                        log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)


def reference(model, ckpt, prompt: str, params: SamplingParams) -> str:
    """The same request through a private engine, alone."""
    eng = Engine(model, Tokenizer(ckpt), EngineConfig(max_seqs=1, max_model_len=MAX_LEN))
    return eng.generate([prompt], params)[0].text


def test_models_health_and_completion(server, client, model, ckpt) -> None:
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=12, temperature=0)
    want = reference(model, ckpt, "def add(a, b):", SamplingParams(temperature=0, max_tokens=12))
    assert r.choices[0].text == want
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens == len(
        Tokenizer(ckpt).encode("def add(a, b):")
    )
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streaming_equals_non_streaming(client) -> None:
    kw = {"model": MODEL, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 3}
    full = client.completions.create(prompt="Hello world", **kw).choices[0].text
    parts = list(client.completions.create(prompt="Hello world", stream=True, **kw))
    assert "".join(p.choices[0].text for p in parts) == full
    assert parts[-1].choices[0].finish_reason in ("stop", "length")

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How are you?"}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    usage_opt = {"include_usage": True}
    stream = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=16, temperature=0, stream=True, stream_options=usage_opt
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_sixteen_concurrent_clients_get_their_own_results(server, client) -> None:
    prompts = [f"for i in range({i}):" if i % 2 else f"The fox {i} jumps" for i in range(16)]
    lengths = [6 + (i % 5) * 3 for i in range(16)]

    def ask(i: int) -> str:
        r = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0)
        return r.choices[0].text

    alone = [ask(i) for i in range(16)]
    steps_before = server[1].counters.decode_steps
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert together == alone
    # Continuous batching: far fewer steps than the sum of the requests' decode steps.
    assert server[1].counters.decode_steps - steps_before < sum(lengths) // 2


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "invalid JSON"),
        ({"model": "gpt-9", "prompt": "hi"}, 404, "does not exist"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "x " * 400}, 400, "context length"),
        ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ({"model": MODEL, "prompt": "hi", "min_p": 2}, 400, "min_p"),
        ({"model": MODEL, "prompt": "hi", "top_k": -7}, 400, "top_k"),
        ({"model": MODEL, "prompt": "hi", "presence_penalty": 9}, 400, "presence_penalty"),
        ({"model": MODEL, "prompt": "hi", "n": 2}, 400, "n = 1"),
        ({"model": MODEL, "prompt": [999999]}, 400, "token ids"),
        ({"model": MODEL}, 400, "prompt"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ],
)
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, body, status: int, needle: str) -> None:
    url = server[0] + "/v1/completions"
    r = httpx.post(url, content=body) if isinstance(body, bytes) else httpx.post(url, json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    ok = httpx.post(url, json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_bad_chat_requests(server) -> None:
    url = server[0] + "/v1/chat/completions"
    assert httpx.post(url, json={"model": MODEL, "messages": []}).status_code == 400
    assert (
        httpx.post(url, json={"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).status_code
        == 400
    )
    assert httpx.post(url, json=[1, 2]).status_code == 400


def test_metrics_exposes_vllm_names(server, client) -> None:
    client.completions.create(model=MODEL, prompt="hi", max_tokens=3, temperature=0)
    text = httpx.get(server[0] + "/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    assert values["vllm:prompt_tokens_total"] > 0 and values["vllm:generation_tokens_total"] >= 3
    assert values["lumotree:decode_busy_seconds_total"] > 0 and values["lumotree:steps_total"] > 0
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):  # fmt: skip
        assert values[name] == 0  # the AR arm drafts nothing
    assert values["lumotree:cuda_graph_capture_failed"] == 0


def test_a_failed_graph_capture_shows_in_health_and_metrics(server) -> None:
    """The runner records a failed capture (it cannot fail on CPU, so the record is set here) and the server
    reports it while it keeps serving."""
    url, engine = server
    engine.runner.graph_error = "AcceleratorError: capture invalidated"
    try:
        assert httpx.get(url + "/health").json() == {
            "status": "ok",
            "cuda_graph_error": engine.runner.graph_error,
        }
        line = [x for x in httpx.get(url + "/metrics").text.splitlines() if "capture_failed{" in x]
        assert len(line) == 1 and line[0].endswith(" 1")
    finally:
        engine.runner.graph_error = None
