#!/usr/bin/env bash
# Installs Debian's Chromium (for the dashboard's browser tests) when it is missing; run as root.
# Prints the browser's path. The tests drive it through Playwright's executable_path: no browser download.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "install-browser: installing chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
fi
command -v chromium
