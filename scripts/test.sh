#!/usr/bin/env bash
# The whole test suite on a bare machine: installs and starts what the tests need (Docker, PostgreSQL,
# Chromium), then runs pytest. Tests marked `slow` (long statistical runs, 256-token arm equality, image builds of
# the platform and of real SWE-bench testbeds, the CPU end-to-end sweep) need --all. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
LUMOTREE_TEST_PG_URL=$(bash scripts/start-postgres.sh)
export LUMOTREE_TEST_PG_URL
export PYTHONUNBUFFERED=1
marker=(-m "not slow")
if [ "${1:-}" = "--all" ]; then marker=(); shift; fi
exec .venv/bin/pytest -q --durations=15 "${marker[@]}" tests "$@"
