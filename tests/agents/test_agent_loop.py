"""The bash agent loop driven by a scripted model in a real local git repository (and a Docker sandbox)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lumotree.agents.agent import BashAgent, ExitStatus, parse_action, shape_output
from lumotree.agents.config import AgentConfig, SamplingConfig
from lumotree.agents.local_env import LocalEnvironment
from lumotree.agents.scripted import ScriptedModel

BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"


def bash(text: str) -> str:
    return f"THOUGHT: next step.\n\n```bash\n{text}\n```\n"


def make_repo(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "calc.py").write_text(BUGGY)
    (root / "test_calc.py").write_text(TEST)
    git = lambda *a: subprocess.run(["git", *a], cwd=root, check=True, capture_output=True)
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    return root


SOLVE = [
    "I will look around first, no command yet.",  # format error: no bash block
    bash("cat calc.py"),
    bash("python3 -c \"print('x' * 30000)\""),  # long output: head and tail only
    bash("sed -i 's/a - b/a + b/' calc.py && python3 test_calc.py"),
    bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
]


def test_parse_action_counts_blocks() -> None:
    assert parse_action(bash("ls")) == ["ls"]
    assert parse_action(bash("ls") + bash("pwd")) == ["ls", "pwd"]
    assert parse_action("```python\nprint(1)\n```") == []


def test_shape_output_keeps_head_and_tail() -> None:
    text = "".join(chr(97 + i % 26) for i in range(1000))
    shaped = shape_output(text, 200)
    assert shaped["head"] == text[:100] and shaped["tail"] == text[-100:] and shaped["elided"] == 800
    assert shape_output("short", 200)["elided"] == 0


def test_default_sampling_is_the_papers() -> None:
    s = SamplingConfig()
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.presence_penalty) == (0.6, 0.95, 20, 0.0, 1.0)


def test_scripted_episode_in_local_repo(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    events: list[tuple[str, dict]] = []
    agent = BashAgent(
        ScriptedModel(SOLVE),
        LocalEnvironment(repo),
        AgentConfig(cwd=str(repo), observation_limit=1000),
        on_event=lambda kind, payload: events.append((kind, payload)),
    )
    result = agent.run("add() subtracts instead of adding")
    assert result.exit_status == ExitStatus.SUBMITTED
    assert result.requests == 5 and result.format_errors == 1
    # The patch is git's, and it really fixes the bug in a clean copy of the base state.
    assert "-    return a - b" in result.patch and "+    return a + b" in result.patch
    clean = make_repo(tmp_path / "clean")
    subprocess.run(["git", "apply", "-"], input=result.patch.encode(), cwd=clean, check=True)
    assert subprocess.run(["python3", "test_calc.py"], cwd=clean, capture_output=True).returncode == 0
    # Conversation: system, task, then (assistant, user) per step except the final submission.
    roles = [m["role"] for m in result.messages]
    assert roles[:2] == ["system", "user"] and roles[2:] == ["assistant", "user"] * 4 + ["assistant"]
    assert "EXACTLY ONE" in result.messages[3]["content"]
    long_obs = result.messages[7]["content"]
    # 30,000 x's plus a newline, 1,000 characters kept.
    assert "<output_head>" in long_obs and "29001 characters" in long_obs
    assert len(long_obs) < 2000
    assert (
        "<returncode>0</returncode>" in result.messages[9]["content"]
        and "ok" in result.messages[9]["content"]
    )
    kinds = [k for k, _ in events]
    assert kinds.count("request") == 5 and kinds.count("command") == 4 and kinds.count("format_error") == 1
    assert kinds[-2:] == ["submitted", "finished"]
    assert result.completion_tokens == sum(
        p["reply"]["completion_tokens"] for k, p in events if k == "request"
    )


def test_step_limit_and_timeout(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    cfg = AgentConfig(step_limit=3, command_timeout_s=0.5)
    result = BashAgent(ScriptedModel([bash("sleep 5; echo late")]), LocalEnvironment(repo), cfg).run("x")
    assert result.exit_status == ExitStatus.STEP_LIMIT and result.requests == 3
    observation = result.messages[3]["content"]
    assert "timed out" in observation and "<output>" not in observation  # killed before printing
    assert result.command_seconds < 5
    assert result.patch == ""


def test_token_limit(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    result = BashAgent(ScriptedModel([bash("ls")]), LocalEnvironment(repo), AgentConfig(token_limit=50)).run(
        "x"
    )
    assert result.exit_status == ExitStatus.TOKEN_LIMIT and result.requests >= 1


def docker_ready() -> bool:
    """A Docker daemon answers and astropy-synth's instances exist (never start generating them)."""
    try:
        import docker

        docker.from_env().ping()
        from lumotree.tasks.api import get_suite

        suite = get_suite("astropy-synth")
        return any(p.is_file() for p in (suite.cache_path(), suite.packaged_path()))  # type: ignore[attr-defined]
    except Exception:
        return False


@pytest.mark.docker
@pytest.mark.skipif(not docker_ready(), reason="no Docker daemon, or astropy-synth not generated")
def test_scripted_episode_in_docker_sandbox() -> None:
    from lumotree.tasks.api import get_suite, open_sandbox

    suite = get_suite("astropy-synth")
    instance = suite.instances(limit=1)[0]
    image = suite.image_for(instance, build=True)
    script = [bash("git status --short && ls | head"), bash("echo '# touched' >> README.rst"), SOLVE[-1]]
    with open_sandbox(image) as sandbox:
        result = BashAgent(ScriptedModel(script), sandbox, AgentConfig()).run(instance.problem_statement)
    assert result.exit_status == ExitStatus.SUBMITTED and result.requests == 3
    assert "+# touched" in result.patch
