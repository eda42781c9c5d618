"""Random tiny chat checkpoints (the serving tests' writers: transformers' model + a small BPE tokenizer with
a ChatML template) and a real OpenAI-compatible server over one, for the agent and sweep tests."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVING_TESTS = Path(__file__).resolve().parents[1] / "serving"
sys.path.insert(0, str(SERVING_TESTS))

from _chat_checkpoint import chat_checkpoint  # noqa: E402
from checkpoints import LAYOUTS, write_checkpoint  # noqa: E402


def make_chat_checkpoint(root: Path) -> Path:
    """A random gdn3_attn1 checkpoint (with MTP weights) plus tokenizer, under ``root``."""
    raw = write_checkpoint(root / "raw", LAYOUTS["gdn3_attn1"], seed=0, mtp=True)
    return chat_checkpoint(raw, root / "chat")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(ckpt: Path, max_model_len: int = 4096) -> Iterator[str]:
    """The project's OpenAI-compatible server on 127.0.0.1 (AR arm); yields its base URL."""
    import torch
    import uvicorn

    from lumotree.serving.async_engine import AsyncEngine
    from lumotree.serving.engine import Engine, EngineConfig
    from lumotree.serving.loader import load_model
    from lumotree.serving.server import create_app
    from lumotree.serving.tokenizer import Tokenizer

    model = load_model(ckpt, "cpu", torch.float32)[0]
    engine = Engine(
        model, Tokenizer(ckpt), EngineConfig(max_seqs=2, max_model_len=max_model_len), model_name="t"
    )
    port = _free_port()
    config = uvicorn.Config(
        create_app(AsyncEngine(engine), "t"), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


def synth_instances_ready() -> bool:
    """Whether astropy-synth's instances exist (packaged or cached); tests never generate them."""
    try:
        from lumotree.tasks.api import get_suite

        suite = get_suite("astropy-synth")
        return any(p.is_file() for p in (suite.cache_path(), suite.packaged_path()))  # type: ignore[attr-defined]
    except Exception:
        return False
