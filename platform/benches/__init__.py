"""Benchmark commands: each module exposes ``register(bench_app)``; heavy imports stay inside commands."""

from typing import Any


def stamped(report: dict[str, Any], device: str, started: float) -> str:
    """The report as JSON text, stamped with its provenance (commit, command, machine, seconds since
    ``started``, a ``time.time()``)."""
    import json

    from lumotree.platform.provenance import provenance

    report["run"] = provenance(device, started)
    return json.dumps(report, indent=2)
