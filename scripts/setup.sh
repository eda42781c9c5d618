#!/usr/bin/env bash
# Sets up everything LumoTree needs on a bare Debian machine, as root:
#   system packages (Docker engine + debootstrap for the offline-built sandboxes), a started dockerd,
#   and a Python virtual environment in .venv with the project installed in editable mode.
# With --test it also installs what the test suite needs: PostgreSQL, Chromium, docker-compose.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

apt_pkgs=(docker.io debootstrap git patch)
[ "$want_test" = 1 ] && apt_pkgs+=(postgresql chromium docker-compose)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

bash scripts/start-dockerd.sh

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.lumotree-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  # The CPU build of torch first, so that nothing pulls a multi-GB CUDA build.
  .venv/bin/pip install -q "torch==2.13.0"
  .venv/bin/pip install -q -e ".[test]"
  touch "$stamp"
fi
echo "setup: ready (.venv/bin/lumotree)"
