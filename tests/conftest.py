"""Shared test fixtures: the repository's shared data folder and a low thread count for 2-core machines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LUMOTREE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data folder not found at {SHARED_DATA} (set LUMOTREE_SHARED_DATA)")
    return SHARED_DATA


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch

        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    except ImportError:
        pass
