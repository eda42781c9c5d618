#!/usr/bin/env bash
# Start a Docker daemon for the sandbox tests and image builds, installing docker.io and debootstrap when missing.
# Idempotent: if `docker info` already answers, nothing is installed or started. Needs root.
set -euo pipefail

log() { echo "[start-dockerd] $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  log "docker daemon already answers"
  exit 0
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  logfile="${DOCKERD_LOG:-/var/log/dockerd.log}"
  log "starting dockerd (log: $logfile)"
  # setsid: the daemon must outlive the shell (and CI step) that started it.
  $SUDO setsid dockerd >"$logfile" 2>&1 < /dev/null &
fi

for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    log "docker daemon ready"
    exit 0
  fi
  sleep 0.5
done
log "docker daemon did not answer within 60 s; see ${DOCKERD_LOG:-/var/log/dockerd.log}"
exit 1
