#!/usr/bin/env bash
# Installs LumoTree into /opt/venv inside an image (used by docker/Dockerfile): install.sh TARGET SOURCE
#   TARGET full:      the project with all its dependencies (torch, ray, ...): orchestrator, Ray workers
#   TARGET dashboard: the project plus only its "dashboard" extra from pyproject.toml (a small image)
#   SOURCE: the project's source tree.
set -euo pipefail
target=$1
source=$2
pip=(/opt/venv/bin/pip install --no-cache-dir --progress-bar off)
case "$target" in
  full) "${pip[@]}" "$source" ;;
  dashboard)
    # The extra alone: "pip install .[dashboard]" would pull the heavy core dependencies too.
    python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["dashboard"]))' \
      "$source/pyproject.toml" > /tmp/requirements-dashboard.txt
    "${pip[@]}" -r /tmp/requirements-dashboard.txt
    rm -f /tmp/requirements-dashboard.txt
    "${pip[@]}" --no-deps "$source"
    ;;
  *) echo "install.sh: unknown target $target (full | dashboard)" >&2; exit 2 ;;
esac
/opt/venv/bin/lumotree --help >/dev/null
