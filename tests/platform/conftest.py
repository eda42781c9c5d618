"""Lets the platform tests import their shared helpers (``sweep_helpers``) under --import-mode=importlib."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
