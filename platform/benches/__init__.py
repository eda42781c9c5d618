"""Benchmark commands: each module exposes ``register(bench_app)``; heavy imports stay inside commands."""

from collections.abc import Callable
from pathlib import Path
from typing import Any


def emit(
    report: dict[str, Any],
    device: str,
    started: float,
    out: Path | None,
    as_json: bool = True,
    show: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Stamp ``report`` with its provenance (commit, command, machine, seconds since ``started``, a
    ``time.time()``), write its JSON to ``out`` (folder made) and print it on stdout; with ``as_json`` off,
    ``show`` prints the report instead (a table)."""
    import json

    from lumotree.platform.provenance import provenance

    report["run"] = provenance(device, started)
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    if as_json or show is None:
        print(text)
    else:
        show(report)
