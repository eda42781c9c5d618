"""Docker sandboxes: one container per attempt, no network, non-root, limited, commands run one by one.

Containment, layer by layer:
- ``network_mode=none``; all capabilities dropped; ``no-new-privileges``; a non-root user.
- memory, cpu and pid limits (a fork bomb hits the pid limit, not the host).
- a read-only root filesystem; only ``/testbed`` (a volume seeded from the image) and a tmpfs ``/tmp`` are
  writable, and ``HOME`` is ``/tmp``.
- every command runs under ``timeout`` (which signals its whole process group); if it outlives the
  deadline anyway (``setsid``, a daemon holding the pipe), every process of the sandbox user is killed.
- output is read as a stream and bounded: the head and the tail are kept, the cut is marked with its size.
- containers carry owner labels; containers whose owner process is dead are reaped when the next sandbox
  (or build) starts, so a SIGKILLed orchestrator leaves nothing behind for long.
"""

from __future__ import annotations

import atexit
import base64
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from lumotree.tasks.api import TESTBED, ExecResult
from lumotree.tasks.rootfs import (
    CREATED_LABEL,
    KIND_LABEL,
    OWNER_HOST_LABEL,
    OWNER_PID_LABEL,
    SANDBOX_UID,
    docker_client,
    owner_labels,
)

TIMEOUT_EXIT = 124  # exit code reported for a command killed at its timeout (coreutils' convention)
# The main process, under docker's init (PID 1: reaps orphans, forwards signals), is a root keeper holding
# CAP_KILL and nothing else. On SIGUSR1 it SIGKILLs every other process (kill -1 spares init and itself)
# without forking, so it works even when a fork bomb has used up the pid limit. Commands run as the sandbox
# user, who has no capabilities and cannot signal the keeper.
_KEEPER_SRC = """
import os, signal
def kill_all(*_):
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
signal.signal(signal.SIGUSR1, kill_all)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    signal.pause()
"""
_KEEPER = ["python3", "-c", _KEEPER_SRC]
_BASELINE_PROCS = 2  # docker-init and the keeper


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and layout of one sandbox container."""

    user: str = f"{SANDBOX_UID}:{SANDBOX_UID}"  # uid:gid commands run as (never root)
    memory: str = "4g"  # memory limit (swap included: no swap beyond it)
    cpus: float = 2.0  # cpu quota in cores
    pids: int = 512  # max processes/threads in the container
    timeout: float = 600.0  # default seconds per command
    max_output: int = 64 * 1024  # bytes of output kept per command (half head, half tail)
    tmp_size: str = "1g"  # size of the tmpfs at /tmp (HOME lives there)
    read_only_root: bool = True  # root filesystem read-only; /testbed and /tmp stay writable
    writable: tuple[str, ...] = (TESTBED,)  # paths made writable (volumes seeded from the image)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every command
    kill_leftovers: bool = True  # kill whatever a command left running (background jobs) when it returns

    def __post_init__(self) -> None:
        assert not self.user.startswith("0") and self.user != "root", "sandboxes never run as root"
        assert self.cpus > 0 and self.pids > 16 and self.timeout > 0 and self.max_output >= 1024


class OutputBuffer:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:  # trim lazily: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self.half)

    def text(self) -> str:
        tail = bytes(self.tail[-self.half :]) if self.half else b""
        if not self.truncated:
            return (bytes(self.head) + tail).decode(errors="replace")
        cut = self.total - len(self.head) - len(tail)
        marker = f"\n[... {cut} bytes of output truncated ({self.total} in total) ...]\n"
        return bytes(self.head).decode(errors="replace") + marker + tail.decode(errors="replace")


def _pid_alive_since(pid: int, created: float) -> bool:
    """True when ``pid`` runs and started before ``created`` (a reused pid is a different owner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])
        boot = next(float(ln.split()[1]) for ln in open("/proc/stat") if ln.startswith("btime"))
        started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
        return started <= created + 2
    except (OSError, ValueError, IndexError, StopIteration):
        return True


def reap_orphans(client: Any = None) -> list[str]:
    """Remove our containers whose owner process (on this host) is dead; returns their names."""
    client = client or docker_client()
    host = socket.gethostname()
    removed = []
    for c in client.containers.list(all=True, filters={"label": OWNER_PID_LABEL}):
        labels = c.labels
        if labels.get(OWNER_HOST_LABEL) != host:
            continue
        try:
            pid, created = int(labels[OWNER_PID_LABEL]), float(labels.get(CREATED_LABEL, "0"))
        except ValueError:
            continue
        if pid == os.getpid() or _pid_alive_since(pid, created):
            continue
        try:
            c.remove(force=True, v=True)
            removed.append(c.name)
        except Exception:  # noqa: BLE001 - raced with another reaper; it is gone either way
            pass
    return removed


_reaped_once = False
_live: dict[str, DockerSandbox] = {}


def _close_all() -> None:
    for sb in list(_live.values()):
        sb.close()


atexit.register(_close_all)


class DockerSandbox:
    """A running sandbox container; see the module docstring for what it contains."""

    def __init__(self, image: str, config: SandboxConfig | None = None) -> None:
        global _reaped_once
        self.image = image
        self.config = config or SandboxConfig()
        self.client = docker_client()
        if not _reaped_once:
            reap_orphans(self.client)
            _reaped_once = True
        cfg = self.config
        mem = cfg.memory
        self.container = self.client.containers.run(
            image,
            command=_KEEPER,
            detach=True,
            init=True,
            user="0:0",
            network_mode="none",
            mem_limit=mem,
            memswap_limit=mem,
            nano_cpus=int(cfg.cpus * 1e9),
            pids_limit=cfg.pids,
            cap_drop=["ALL"],
            cap_add=["KILL"],  # for the keeper only: exec'd non-root commands get no capabilities
            security_opt=["no-new-privileges"],
            read_only=cfg.read_only_root,
            tmpfs={"/tmp": f"size={cfg.tmp_size},mode=1777,exec"},
            volumes=list(cfg.writable),
            working_dir=TESTBED,
            environment={"HOME": "/tmp"},
            labels=owner_labels("sandbox") | {"lumotree.sandbox": "1", "lumotree.image": image},
        )
        self.id: str = self.container.id
        _live[self.id] = self
        self._closed = False

    # --- commands

    def _env(self) -> dict[str, str]:
        # safe.directory: /testbed belongs to the sandbox uid, but git refuses repos owned by another uid
        # when the image's owner differs; trusting it is harmless inside the sandbox.
        env = {
            "HOME": "/tmp",
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "TERM": "dumb",
        }
        env.update(self.config.env)
        return env

    def exec(self, cmd: str, timeout: float | None = None, *, max_output: int | None = None) -> ExecResult:
        """Run ``cmd`` with bash in /testbed; see :class:`lumotree.tasks.api.Sandbox`."""
        assert not self._closed, "sandbox is closed"
        timeout = float(timeout or self.config.timeout)
        api = self.client.api
        # -k: if the group ignores TERM, KILL follows one second later.
        argv = ["timeout", "-k", "1", f"{timeout:g}", "bash", "-c", cmd]
        exec_id = api.exec_create(
            self.id, argv, user=self.config.user, workdir=TESTBED, environment=self._env()
        )
        buf = OutputBuffer(max_output or self.config.max_output)
        t0 = time.monotonic()
        stream = api.exec_start(exec_id, stream=True, demux=False)

        def pump() -> None:
            try:
                for chunk in stream:
                    buf.add(chunk)
            except Exception:  # noqa: BLE001 - the stream dies when we kill the processes; output so far stays
                pass

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        reader.join(timeout + 5)
        escaped = reader.is_alive()
        if escaped:
            # Something escaped timeout's process group (setsid, daemons) and keeps the pipe open.
            self.kill_all()
            reader.join(10)
        seconds = time.monotonic() - t0
        exit_code = api.exec_inspect(exec_id).get("ExitCode")
        timed_out = escaped or (exit_code in (124, 137) and seconds >= timeout)
        if self.config.kill_leftovers or timed_out:
            # A command's processes end with it: nothing (a fork bomb, a daemon) runs on into the next one.
            self.kill_all()
        if timed_out:
            buf.add(f"\n[command timed out after {timeout:g} s and was killed]\n".encode())
            exit_code = TIMEOUT_EXIT
        return ExecResult(
            exit_code=int(exit_code if exit_code is not None else -1),
            output=buf.text(),
            truncated=buf.truncated,
            timed_out=timed_out,
            seconds=seconds,
        )

    def kill_all(self, wait: float = 10.0) -> bool:
        """SIGKILL every process but init and the keeper; True once they are gone (within ``wait`` s)."""
        deadline = time.monotonic() + wait
        while True:
            if len(self.container.top().get("Processes") or []) <= _BASELINE_PROCS:
                return True
            if time.monotonic() > deadline:
                return False
            self.container.kill(signal="SIGUSR1")
            time.sleep(0.05)

    def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        path = shlex.quote(path)
        step = 48 * 1024  # keep each argv well under the kernel's 128 KiB per-argument limit
        chunks = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
        for i, chunk in enumerate(chunks):
            redirect = ">" if i == 0 else ">>"
            b64 = base64.b64encode(chunk).decode()
            res = self.exec(
                f'mkdir -p "$(dirname {path})" && printf %s {b64} | base64 -d {redirect} {path}', 60
            )
            if res.exit_code != 0:
                raise OSError(f"writing {path} in the sandbox failed: {res.output.strip()}")

    def read_file(self, path: str) -> str:
        res = self.exec(f"cat {shlex.quote(path)}", 60, max_output=8 * 1024 * 1024)
        if res.exit_code != 0:
            raise OSError(f"reading {path} in the sandbox failed: {res.output.strip()}")
        return res.output

    def diff(self) -> str:
        """All changes of /testbed against HEAD, new files included (staged first, as SWE-agent does)."""
        res = self.exec(
            "git add -A >/dev/null 2>&1 && git diff --cached --no-color HEAD", 120, max_output=16 << 20
        )
        if res.exit_code != 0 or res.truncated:
            raise RuntimeError(f"git diff failed in the sandbox: {res.output[-2000:]}")
        return res.output

    # --- lifecycle

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _live.pop(self.id, None)
        try:
            self.container.remove(force=True, v=True)
        except Exception:  # noqa: BLE001 - already gone (reaped, daemon restart): nothing left to do
            pass

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_ours(container: Any) -> bool:
    return container.labels.get(KIND_LABEL) in ("sandbox", "build")
