"""Hostile commands are contained: network, fork bombs, floods of output, timeouts, stray writes, orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lumotree.tasks.sandbox import DockerSandbox, OutputBuffer, SandboxConfig

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sb(mini_image: str):
    with DockerSandbox(mini_image, SandboxConfig(timeout=30, pids=256, max_output=8192)) as box:
        yield box


def test_runs_as_non_root_in_testbed_with_venv(sb: DockerSandbox) -> None:
    r = sb.exec("id -u; pwd; command -v python; python -c 'import pytest; print(pytest.__version__)'")
    assert r.exit_code == 0 and not r.timed_out, r.output
    uid, cwd, python, version = r.output.split()
    assert uid != "0" and cwd == "/testbed" and python == "/opt/venv/bin/python" and version == "8.3.5"


def test_network_connection_fails(sb: DockerSandbox) -> None:
    code = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=5)"
    r = sb.exec(f'python -c "{code}"')
    assert r.exit_code != 0 and ("unreachable" in r.output or "Errno" in r.output), r.output
    assert sb.exec("cat /sys/class/net/*/operstate; ls /sys/class/net").output.split() == ["unknown", "lo"]


def test_fork_bomb_is_stopped_by_the_pid_limit(sb: DockerSandbox) -> None:
    t0 = time.monotonic()
    r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 3; echo survived", timeout=8)
    assert time.monotonic() - t0 < 30
    assert "Resource temporarily unavailable" in r.output or "retry" in r.output, r.output[-500:]
    # Afterwards nothing of the bomb is left and the sandbox still works.
    after = sb.exec("ps -e --no-headers | wc -l; echo alive")
    assert after.exit_code == 0 and after.output.split()[-1] == "alive"
    assert int(after.output.split()[0]) < 12, after.output


def test_a_gigabyte_of_output_is_truncated(sb: DockerSandbox) -> None:
    r = sb.exec("head -c 1000000000 /dev/zero | tr '\\0' x; echo; echo THE-END", timeout=120)
    assert r.exit_code == 0 and r.truncated
    assert len(r.output) < 9000
    assert r.output.startswith("xxxx") and r.output.rstrip().endswith("THE-END")
    assert "bytes of output truncated (1000000009 in total)" in r.output


def test_command_past_its_timeout_is_killed(sb: DockerSandbox) -> None:
    t0 = time.monotonic()
    r = sb.exec("echo start; sleep 120; echo never", timeout=2)
    assert r.timed_out and r.exit_code == 124 and "never" not in r.output and "start" in r.output
    assert time.monotonic() - t0 < 15
    # Escaping the process group (setsid) does not escape the kill.
    r = sb.exec("setsid sleep 300 & setsid sh -c 'sleep 301' ; sleep 120", timeout=2)
    assert r.timed_out
    left = sb.exec("ps -eo args --no-headers").output
    assert "sleep 300" not in left and "sleep 301" not in left, left


def test_writes_only_where_allowed(sb: DockerSandbox) -> None:
    for path in ("/etc/evil", "/usr/bin/evil", "/opt/venv/evil", "/evil", "/root/evil"):
        r = sb.exec(f"touch {path}")
        assert r.exit_code != 0, path
        assert "Read-only file system" in r.output or "Permission denied" in r.output, r.output
    assert sb.exec("touch /testbed/new_file /tmp/scratch && echo ok").output.strip() == "ok"
    assert sb.exec("rm /testbed/new_file").exit_code == 0


def test_write_read_and_diff(sb: DockerSandbox) -> None:
    sb.write_file("mini.py", sb.read_file("mini.py").replace("x < lo", "x <= lo"))
    big = "y" * 200_000
    sb.write_file("/tmp/big.txt", big)
    assert sb.read_file("/tmp/big.txt") == big
    sb.write_file("docs/new.txt", "hello\n")
    diff = sb.diff()
    assert "-    if x < lo:\n+    if x <= lo:" in diff and "+++ b/docs/new.txt" in diff
    sb.exec("git reset -q --hard && git clean -fdq")
    assert sb.diff() == ""


def test_output_buffer_keeps_head_and_tail() -> None:
    buf = OutputBuffer(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        buf.add(chunk)
    assert buf.truncated and buf.total == 26
    assert buf.text().startswith("abcde") and buf.text().endswith("vwxyz") and "16 bytes" in buf.text()
    small = OutputBuffer(100)
    small.add(b"hello")
    assert not small.truncated and small.text() == "hello"


ORCHESTRATOR = """
import sys, time
from lumotree.tasks.sandbox import DockerSandbox
sb = DockerSandbox(sys.argv[1])
print(sb.id, flush=True)
time.sleep(600)
"""


def test_containers_of_a_sigkilled_orchestrator_are_reaped_on_next_start(mini_image: str) -> None:
    import docker

    client = docker.from_env()
    proc = subprocess.Popen(
        [sys.executable, "-c", ORCHESTRATOR, mini_image], stdout=subprocess.PIPE, text=True
    )
    try:
        cid = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert cid, "orchestrator did not start a sandbox"
        assert client.containers.get(cid).status == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert client.containers.get(cid)  # SIGKILL ran no cleanup: the container is still there
    # The next orchestrator start reaps it (first sandbox of a process reaps dead owners' containers).
    nxt = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from lumotree.tasks.sandbox import DockerSandbox; "
            "DockerSandbox(sys.argv[1]).close()",
            mini_image,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nxt.returncode == 0, nxt.stderr
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(cid)
