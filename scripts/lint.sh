#!/usr/bin/env bash
# Lint, format check and type check of the whole repository. Extra arguments go to ruff check (e.g. --fix).
#   bash scripts/lint.sh            check everything, exit non-zero on any finding
#   LINT_SKIP_MYPY=1 bash scripts/lint.sh   ruff only (mypy's first run takes minutes)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bin="${LUMOTREE_VENV:-$root/.venv}/bin"
status=0

"$bin/ruff" check . "$@" || status=1
"$bin/ruff" format --check . || status=1

if [ -z "${LINT_SKIP_MYPY:-}" ]; then
  # The repository root IS the package "lumotree" (pyproject maps lumotree -> "."), and the editable install
  # resolves it through an import hook mypy cannot follow. Give mypy a folder where the root is reachable
  # under its package name; platform/ is a namespace package (no __init__.py, so it never shadows the
  # standard library's platform), which mypy finds by walking the package.
  # A stable folder (outside the tree, so no tool walks into a link loop) keeps mypy's cache valid.
  shim="${XDG_CACHE_HOME:-$HOME/.cache}/lumotree-mypy/$(printf %s "$root" | sha256sum | cut -c1-12)"
  mkdir -p "$shim"
  ln -sfn "$root" "$shim/lumotree"
  MYPYPATH="$shim" "$bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" \
    -p lumotree || status=1
fi
exit $status
