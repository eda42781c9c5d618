"""Loading SWE-bench instances: local JSONL/JSON/parquet files, or a dataset by name through ``datasets``.

Rows of every SWE-bench schema load (v5 rows carry ``eval_script``, ``log_parser`` and ``image``; older rows
do not). A row this suite cannot rebuild (no base commit, no version, no creation date to find releases by) is
an error naming the file, the row and the instance.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from lumotree.tasks.api import Instance, InstanceError, load_instances, parse_instance
from lumotree.tasks.swebench.config import SwebenchConfig
from lumotree.tasks.swebench.releases import parse_time

# Fields the offline reconstruction needs beyond the common schema.
REQUIRED = ("base_commit", "version", "created_at")


def load_swebench(config: SwebenchConfig) -> list[Instance]:
    """The instances of ``config.dataset`` for ``config.repo``, in file order."""
    if not config.dataset:
        raise InstanceError("no SWE-bench dataset given (pass --dataset FILE; no shared data file was found)")
    path = Path(config.dataset)
    if path.is_file():
        rows = [(f"{path.name} row {n}", inst) for n, inst in enumerate(load_instances(path), 1)]
    elif path.suffix in (".jsonl", ".json", ".parquet") or path.exists():
        raise InstanceError(f"{path}: no such file")
    elif not config.hub:
        raise InstanceError(
            f"{config.dataset!r} is not a file, and loading datasets by name is off (offline default); "
            "set LUMOTREE_SWEBENCH_HUB=1 where the hub is reachable"
        )
    else:
        rows = _from_hub(config.dataset, config.split)
    out = []
    for where, inst in rows:
        if inst.repo != config.repo:
            continue
        _check(inst, where)
        out.append(inst)
    return out


def _from_hub(name: str, split: str) -> list[tuple[str, Instance]]:
    from datasets import load_dataset

    data = load_dataset(name, split=split)
    return [
        (f"{name}[{split}] row {n}", parse_instance(_plain(row), f"{name}[{split}] row {n}"))
        for n, row in enumerate(data, 1)
    ]


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    # Hub datasets may type created_at as a timestamp; the schema keeps it as ISO text.
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


def _check(inst: Instance, where: str) -> None:
    label = f"{where} (instance_id={inst.instance_id!r})"
    missing = [f for f in REQUIRED if not str(getattr(inst, f, "") or "").strip()]
    if missing:
        raise InstanceError(f"{label}: missing {', '.join(missing)} (needed to rebuild its environment)")
    try:
        parse_time(inst.created_at)
    except ValueError:
        raise InstanceError(f"{label}: field created_at: not an ISO date: {inst.created_at!r}") from None
    if not inst.test_patch.strip():
        raise InstanceError(
            f"{label}: field test_patch: empty (SWE-bench instances carry their tests as a patch)"
        )
