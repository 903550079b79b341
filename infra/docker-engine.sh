#!/usr/bin/env bash
# A Docker engine for the distributed stack, on a machine without a service manager running one.
#
#   infra/docker-engine.sh up      use the engine that answers `docker info`; if none does, install Debian's
#                                  docker.io when dockerd is missing (apt-get, root) and start dockerd in its own
#                                  session, recording its pid
#   infra/docker-engine.sh down    stop the dockerd that `up` started here (its recorded pid; TERM, then KILL after
#                                  a grace period), nothing else; an engine found running is left alone
#   infra/docker-engine.sh status
#
# State: $EAGLE3_DOCKER_STATE (default runs/dstack/engine): dockerd.pid (only when started here), dockerd.log.
# Images and containers live in dockerd's data root (/var/lib/docker), so built images survive a down/up.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$(mkdir -p "${EAGLE3_DOCKER_STATE:-runs/dstack/engine}" && cd "${EAGLE3_DOCKER_STATE:-runs/dstack/engine}" && pwd)"
PIDFILE="$STATE/dockerd.pid"
START_TIMEOUT_S="${DOCKERD_START_TIMEOUT_S:-60}"
GRACE_S="${DOCKERD_STOP_GRACE_S:-30}"

log() { echo "[docker-engine] $*"; }
die() { echo "error: $*" >&2; exit 1; }
ours() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null \
           && [[ "$(cat "/proc/$(cat "$PIDFILE")/comm" 2>/dev/null)" == dockerd ]]; }

up() {
  if docker info >/dev/null 2>&1; then
    if ours; then log "dockerd started here is running (pid $(cat "$PIDFILE"))"
    else log "a Docker engine answers (not started here: left alone at down)"; fi
    return 0
  fi
  local t0=$SECONDS
  if ! command -v dockerd >/dev/null; then
    [[ "$(id -u)" == 0 ]] || die "dockerd is not installed and installing it needs root (uid 0), running as $(id -u)"
    log "installing docker.io (apt-get) ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >"$STATE/apt.log" 2>&1 \
      || { apt-get update -q >>"$STATE/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -q docker.io >>"$STATE/apt.log" 2>&1; } \
      || { tail -20 "$STATE/apt.log" >&2; die "apt-get install docker.io failed (log $STATE/apt.log)"; }
    log "docker.io installed in $((SECONDS - t0)) s"
  fi
  command -v docker >/dev/null || die "the docker client is missing although dockerd is installed"
  local t1=$SECONDS pid
  setsid dockerd --pidfile "$STATE/dockerd.run.pid" >"$STATE/dockerd.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PIDFILE"
  while ! docker info >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { tail -20 "$STATE/dockerd.log" >&2; rm -f "$PIDFILE"; die "dockerd exited at start-up (log above)"; }
    (( SECONDS - t1 < START_TIMEOUT_S )) || { down; die "dockerd not answering after ${START_TIMEOUT_S}s (log $STATE/dockerd.log)"; }
    sleep 0.5
  done
  log "dockerd started (pid $pid, $((SECONDS - t1)) s; log $STATE/dockerd.log): $(docker info -f '{{.ServerVersion}}, storage {{.Driver}}')"
}

down() {
  if ! ours; then log "no dockerd started here is running (nothing to stop)"; rm -f "$PIDFILE"; return 0; fi
  local pid deadline
  pid="$(cat "$PIDFILE")"
  kill -TERM "$pid"
  deadline=$((SECONDS + GRACE_S))
  while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then log "dockerd (pid $pid) still running after ${GRACE_S}s: KILL"; kill -KILL "$pid"; fi
  rm -f "$PIDFILE"
  log "stopped dockerd (pid $pid)"
}

status() {
  if ours; then echo "dockerd started here: pid $(cat "$PIDFILE")"
  elif docker info >/dev/null 2>&1; then echo "a Docker engine answers (not started here)"
  else echo "no Docker engine"; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
