#!/usr/bin/env bash
# Builds the platform image offline (debootstrap base + pip install of this checkout) and prints its tag.
#   bash scripts/build-platform-image.sh [--target full|dashboard] [--force]
# Needs a running Docker engine (scripts/start-dockerd.sh) and debootstrap; reuses images by content hash.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m lumotree.platform.platform_image "$@"
