"""Reports name the commit they were made from: git's HEAD, or the pinned commit of a copied tree."""

from __future__ import annotations

import subprocess

from lumotree.platform.provenance import ROOT, git_commit, provenance


def test_git_head_and_pinned_commit(monkeypatch) -> None:
    monkeypatch.delenv("LUMOTREE_COMMIT", raising=False)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert git_commit().removesuffix("+dirty") == head
    monkeypatch.setenv("LUMOTREE_COMMIT", "0123456789abcdef")
    assert git_commit() == "0123456789ab"
    assert provenance("cpu", 0.0)["commit"] == "0123456789ab"
