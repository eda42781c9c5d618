"""Predictions files load with the official harness's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from swebench.harness.utils import get_predictions_from_file

from lumotree.tasks.swebench.predictions import Prediction, read_predictions, write_predictions

PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_harness_reads_our_predictions(tmp_path: Path, suffix: str) -> None:
    preds = [
        Prediction("astropy__astropy-12907", "lumotree/ar", PATCH),
        {"instance_id": "astropy__astropy-13236", "model_name_or_path": "lumotree/ar", "model_patch": ""},
    ]
    path = write_predictions(preds, tmp_path / f"preds{suffix}")
    loaded = get_predictions_from_file(str(path), "unused", "test")
    assert loaded == [
        {"instance_id": "astropy__astropy-12907", "model_name_or_path": "lumotree/ar", "model_patch": PATCH},
        {"instance_id": "astropy__astropy-13236", "model_name_or_path": "lumotree/ar", "model_patch": ""},
    ]
    assert read_predictions(path) == [preds[0], Prediction(**preds[1])]  # type: ignore[arg-type]


def test_one_prediction_per_instance(tmp_path: Path) -> None:
    p = Prediction("a__b-1", "m", PATCH)
    with pytest.raises(ValueError, match="two predictions"):
        write_predictions([p, p], tmp_path / "p.jsonl")
    with pytest.raises(ValueError, match=".jsonl or .json"):
        write_predictions([p], tmp_path / "p.txt")
