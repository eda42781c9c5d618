"""Synthetic coding-agent transcripts built from real files, in the chat template of the built-in model.

Messages are rendered with the bash agent's own templates (system, instance, observation, submit sentinel),
so the model sees exactly the conversation format it will serve in agent sweeps.

Every command shown is paired with the output it really produces on that file (cat, sed ranges, grep -n, a
Python heredoc edit followed by its real unified diff), so the model learns the agent's format and to copy
file content - the text a bash coding agent mostly emits. Nothing is invented except the request wording.
"""

from __future__ import annotations

import difflib
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import jinja2

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MAX_OUTPUT_LINES = 60
MAX_OUTPUT_CHARS = 8000
DEF_RE = re.compile(r"^(\s*)def (\w+)\(.*:\s*$")


@dataclass(frozen=True)
class AgentFormat:
    """The bash agent's message templates and names (see ``lumotree.agents.config.AgentConfig``)."""

    system: str
    instance: str
    observation: str
    submit_sentinel: str
    cwd: str


def bare_agent_format() -> AgentFormat:
    """The agent's template files and default names, read without importing its (pydantic) config."""
    folder = resources.files("lumotree.agents").joinpath("templates")
    read = lambda name: folder.joinpath(name).read_text(encoding="utf-8")
    return AgentFormat(
        read("system.jinja"), read("instance.jinja"), read("observation.jinja"),
        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "/testbed",
    )  # fmt: skip


@lru_cache(maxsize=1)
def agent_format() -> AgentFormat:
    """The agent's own format; on a host without pydantic (the GPU trainer) the bare reading of it."""
    try:
        from lumotree.agents.config import AgentConfig
    except ImportError:
        return bare_agent_format()
    c = AgentConfig()
    return AgentFormat(
        c.system_template, c.instance_template, c.observation_template, c.submit_sentinel, c.cwd
    )


def render(template: str, **variables: object) -> str:
    """Rendered like the agent renders (strict variables, trailing newline dropped)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)
    return env.from_string(template).render(**variables)


@lru_cache(maxsize=1)
def _chat_template() -> jinja2.Template:
    return jinja2.Environment(keep_trailing_newline=True).from_string(CHAT_TEMPLATE)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The chat template applied to ``messages`` (the same template ships in tokenizer_config.json)."""
    return _chat_template().render(messages=messages, add_generation_prompt=add_generation_prompt)


def observation(output: str) -> str:
    """A successful command's result as the agent shows it (outputs here stay under its elision limit)."""
    out = output.rstrip("\n")
    return render(agent_format().observation, exit_code=0, output=out, head=out, tail="", elided=0)


def _bash(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"


def _clip(lines: list[str]) -> str:
    out, size = [], 0
    for line in lines[:MAX_OUTPUT_LINES]:
        line = line if line.endswith("\n") else line + "\n"
        size += len(line)
        if size > MAX_OUTPUT_CHARS:
            break
        out.append(line)
    return "".join(out)


def _grep(lines: list[str], word: str) -> str:
    hits = [f"{i + 1}:{line}" for i, line in enumerate(lines) if word in line]
    return _clip(hits)


def _edit(path: str, lines: list[str], rng: random.Random) -> tuple[str, str, str] | None:
    """A docstring added under a random function: (request, command, diff)."""
    defs = [i for i, line in enumerate(lines) if DEF_RE.match(line.rstrip("\n"))]
    if not defs:
        return None
    i = lines.index(lines[defs[rng.randrange(len(defs))]])  # str.replace(..., 1) edits the first copy
    match = DEF_RE.match(lines[i].rstrip("\n"))
    assert match is not None
    indent, name = match.group(1), match.group(2)
    doc = f'{indent}    """{name.strip("_").replace("_", " ").capitalize() or "Helper"}."""\n'
    old = lines[i]
    new_lines = lines[: i + 1] + [doc] + lines[i + 1 :]
    diff = f"diff --git a/{path} b/{path}\n" + "".join(
        difflib.unified_diff(lines, new_lines, f"a/{path}", f"b/{path}", n=3)
    )
    command = (
        "python - <<'EOF'\nfrom pathlib import Path\n"
        f"p = Path({path!r})\ns = p.read_text()\n"
        f"s = s.replace({old!r}, {old + doc!r}, 1)\np.write_text(s)\nEOF"
    )
    return f"Add a one-line docstring to `{name}` in {path}.", command, diff


def transcript(key: str, text: str, rng: random.Random) -> str:
    """One rendered agent conversation about the file ``key``."""
    return render_chat(transcript_messages(key, text, rng))


def transcript_messages(key: str, text: str, rng: random.Random) -> list[dict[str, str]]:
    """One agent conversation about the file ``key`` (its path shown without the stdlib/site prefix)."""
    path = key.split("/", 1)[1]
    lines = text.splitlines(keepends=True)
    fmt = agent_format()
    names = {"cwd": fmt.cwd, "submit_sentinel": fmt.submit_sentinel}
    edit = _edit(path, lines, rng) if rng.random() < 0.5 else None
    request = edit[0] if edit else rng.choice(["Show me {p}.", "What does {p} contain?", "Read {p} for me."])
    messages = [
        {"role": "system", "content": render(fmt.system, task=request.format(p=path), **names)},
        {"role": "user", "content": render(fmt.instance, task=request.format(p=path), **names)},
    ]
    start = rng.randrange(max(1, len(lines) - 20)) + 1
    end = start + rng.randrange(20, MAX_OUTPUT_LINES)
    words = sorted({m for m in re.findall(r"\b[A-Za-z_]\w{3,}\b", text)})
    whole = f"cat {path}" if len(lines) <= MAX_OUTPUT_LINES else f"head -n {MAX_OUTPUT_LINES} {path}"
    look = [
        ("Let me read the file first.", whole, _clip(lines)),
        (
            "Let me look at the relevant lines.",
            f"sed -n '{start},{end}p' {path}",
            _clip(lines[start - 1 : end]),
        ),
    ]
    if words:
        w = words[rng.randrange(len(words))]
        look.append((f"Let me find where `{w}` is used.", f"grep -n '{w}' {path}", _grep(lines, w)))
    rng.shuffle(look)
    for thought, command, output in look[: rng.randint(1, 3)]:
        messages.append({"role": "assistant", "content": _bash(thought, command)})
        messages.append({"role": "user", "content": observation(output)})
    if edit:
        messages.append({"role": "assistant", "content": _bash("Now I add the docstring.", edit[1])})
        messages.append({"role": "user", "content": observation("")})
        messages.append({"role": "assistant", "content": _bash("Let me check the change.", "git diff")})
        messages.append({"role": "user", "content": observation(edit[2])})
        messages.append(
            {"role": "assistant", "content": _bash("The change is in place.", f"echo {fmt.submit_sentinel}")}
        )
    return messages
