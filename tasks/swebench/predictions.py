"""SWE-bench predictions files: one ``{instance_id, model_name_or_path, model_patch}`` object per line.

The official harness reads them with ``swebench.harness.utils.get_predictions_from_file`` (``.jsonl`` or a
``.json`` list); the tests check our files load there unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prediction:
    """One model patch for one instance."""

    instance_id: str
    model_name_or_path: str  # the arm or model that produced the patch
    model_patch: str  # a unified diff against the instance's base state; "" when the attempt made no change

    def __post_init__(self) -> None:
        assert self.instance_id.strip(), "a prediction names its instance"
        assert self.model_name_or_path.strip(), "a prediction names its model"

    def to_row(self) -> dict[str, str]:
        return {
            "instance_id": self.instance_id,
            "model_name_or_path": self.model_name_or_path,
            "model_patch": self.model_patch,
        }


def write_predictions(predictions: Iterable[Prediction | Mapping[str, str]], path: str | Path) -> Path:
    """Write predictions as JSONL (``.jsonl``) or a JSON list (``.json``); one per instance id."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: the harness reads .jsonl or .json predictions")
    rows: dict[str, dict[str, str]] = {}
    for p in predictions:
        pred = p if isinstance(p, Prediction) else Prediction(**{k: p[k] for k in Prediction.__annotations__})
        if pred.instance_id in rows:
            raise ValueError(f"two predictions for {pred.instance_id!r}: the harness grades one per instance")
        rows[pred.instance_id] = pred.to_row()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(list(rows.values()), indent=1) + "\n")
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()))
    return path


def read_predictions(path: str | Path) -> list[Prediction]:
    """Read a predictions file as the harness does (``.jsonl`` lines, a ``.json`` list or map)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        data: object = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            data = list(data.values())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of predictions")
    out = []
    for n, row in enumerate(data, 1):
        missing = [k for k in ("instance_id", "model_name_or_path", "model_patch") if k not in row]
        if missing:
            raise ValueError(f"{path.name} row {n}: missing {', '.join(missing)}")
        out.append(Prediction(row["instance_id"], row["model_name_or_path"], row["model_patch"] or ""))
    return out
