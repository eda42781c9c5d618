"""``LUMOTREE_OVERLAP_Z``: a bad value is refused by name, and CPU forwards never fork (the CUDA side is
``test_aside_cuda.py``)."""

from __future__ import annotations

import pytest
import torch

from lumotree.serving.model.aside import ENV, MODES, overlap_mode


@pytest.mark.parametrize("mode", MODES)
def test_cpu_forwards_never_fork(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, mode)
    assert overlap_mode(torch.zeros(2, 3)) == "0"


def test_default_is_in_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert overlap_mode(torch.zeros(1)) == "0"


def test_bad_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "side")
    with pytest.raises(ValueError, match=f"{ENV}='side'"):
        overlap_mode(torch.zeros(1))
