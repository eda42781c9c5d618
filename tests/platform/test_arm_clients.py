"""Both model clients against the real engine: an arm hosted in-process (what the Ray actor runs) and the
project's OpenAI-compatible server through ``OpenAIModel`` (what an external vLLM/SGLang arm looks like)."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_fixtures import make_chat_checkpoint, serve

from lumotree.agents.clients import OpenAIModel
from lumotree.agents.config import SamplingConfig
from lumotree.agents.protocols import ContextLengthExceeded
from lumotree.platform.actors import ArmHost
from lumotree.platform.sweep_config import ArmSpec

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "def add(a, b):\n    return a + b\n"},
]
GREEDY = SamplingConfig(temperature=0.0, top_p=1.0, top_k=-1, presence_penalty=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_checkpoint(tmp_path_factory.mktemp("chat"))


def test_arm_host_chat_records_prompt_ids_and_counter_differences(ckpt: Path) -> None:
    host = ArmHost(ArmSpec(name="ar", model=str(ckpt), options={"device": "cpu", "max_model_len": 256}))
    reply = host.chat(MESSAGES, GREEDY.to_dict())
    tok = host.llm.tokenizer
    assert reply["prompt_token_ids"] == tok.encode(
        tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    )
    # Independent reference: the engine's per-request result for the same prompt and parameters.
    from lumotree.serving.sampler import SamplingParams

    ref = host.llm.generate([reply["prompt_token_ids"]], SamplingParams(**GREEDY.to_dict()))[0]
    assert reply["text"] == ref.text and reply["completion_tokens"] == ref.num_tokens
    stats = reply["stats"]
    assert stats["tokens"] == ref.num_tokens and stats["steps"] == ref.steps - 1  # verify steps only
    assert stats["drafts"] == 0 and stats["decode_seconds"] > 0
    long = [{"role": "user", "content": "word " * 400}]
    assert host.chat(long, GREEDY.to_dict())["error"] == "context_length"


def test_openai_client_against_the_server(ckpt: Path) -> None:
    with serve(ckpt, max_model_len=256) as url:
        model = OpenAIModel(url)
        assert model.model == "t"
        reply = model.chat(MESSAGES, GREEDY)
        from openai import OpenAI

        ref = OpenAI(base_url=url + "/v1", api_key="none").chat.completions.create(
            model="t", messages=MESSAGES, max_tokens=12, temperature=0.0, top_p=1.0, presence_penalty=0.0
        )
        assert reply.text == ref.choices[0].message.content
        assert reply.completion_tokens == ref.usage.completion_tokens > 0
        assert reply.prompt_tokens == ref.usage.prompt_tokens
        # The server's own counters: tokens of exactly this request and its busy decode time.
        assert reply.stats.tokens == reply.completion_tokens and reply.stats.decode_seconds > 0
        assert reply.stats.drafts == 0
        with pytest.raises(ContextLengthExceeded):
            model.chat([{"role": "user", "content": "word " * 400}], GREEDY)
