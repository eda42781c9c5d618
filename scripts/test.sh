#!/usr/bin/env bash
# The whole test suite on a bare machine: installs and starts what the tests need (Docker, PostgreSQL,
# Chromium), then runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
LUMOTREE_TEST_PG_URL=$(bash scripts/start-postgres.sh)
export LUMOTREE_TEST_PG_URL
export PYTHONUNBUFFERED=1
exec .venv/bin/pytest -q tests "$@"
