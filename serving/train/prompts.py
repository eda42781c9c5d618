"""Held-out prompts for acceptance measurements, shipped beside the model as ``heldout_prompts.jsonl``.

Two kinds, built only from held-out files: ``code`` (the head of a source file, cut at a line end; the model
continues the file) and ``chat`` (an agent transcript cut before an assistant turn, rendered with the chat
template and its generation prompt). Each line: ``{"id", "kind", "source", "prompt", "messages"?,
"reference"?}`` - ``prompt`` is the exact text to feed; ``reference`` the turn the transcript really had next.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from lumotree.serving.train.chats import render_chat, transcript_messages
from lumotree.serving.train.corpus import SourceFile

MAX_PROMPT_CHARS = 6000
CODE_PROMPT_CHARS = 1500


def code_prompt(f: SourceFile) -> str | None:
    lines, out = f.text.splitlines(keepends=True), ""
    for line in lines:
        if len(out) + len(line) > CODE_PROMPT_CHARS:
            break
        out += line
    # Too short a head leaves nothing to continue; a whole file leaves nothing either.
    return out if out.count("\n") >= 10 and len(out) < len(f.text) else None


def chat_prompt(f: SourceFile, seed: int) -> dict[str, Any] | None:
    messages = transcript_messages(f.key, f.text, random.Random(f"{seed}:prompt:{f.key}"))
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= 2]
    for i in reversed(turns):
        prompt = render_chat(messages[:i], add_generation_prompt=True)
        if len(prompt) <= MAX_PROMPT_CHARS:
            return {"prompt": prompt, "messages": messages[:i], "reference": messages[i]["content"]}
    return None


def build_prompts(files: list[SourceFile], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` prompts (half code, half chat) from held-out files in a seeded order."""
    held = sorted((f for f in files if f.heldout), key=lambda f: f.key)
    random.Random(seed).shuffle(held)
    rows: list[dict[str, Any]] = []
    want = {"code": count // 2, "chat": count - count // 2}
    for f in held:
        # Serve the kind still most wanted first, so a short held-out list still yields both kinds.
        for kind in sorted(want, key=lambda k: -want[k]):
            if want[kind] == 0:
                continue
            if kind == "code" and (text := code_prompt(f)) is not None:
                rows.append({"id": f"code-{len(rows):03d}", "kind": "code", "source": f.key, "prompt": text})
            elif kind == "chat" and (chat := chat_prompt(f, seed)) is not None:
                rows.append({"id": f"chat-{len(rows):03d}", "kind": "chat", "source": f.key, **chat})
            else:
                continue
            want[kind] -= 1
            break
        if not any(want.values()):
            break
    return rows


def write_prompts(rows: list[dict[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
