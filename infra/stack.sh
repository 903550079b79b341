#!/usr/bin/env bash
# The local stack: a Prefect server and an MLflow server on 127.0.0.1 (SQLite), and one process serving every
# deployment of prefect.yaml (flows/serve.py).
#
#   infra/stack.sh up      start the three (idempotent: does nothing when the recorded ones still run)
#   infra/stack.sh down    stop exactly the process groups recorded at `up`, newest first (the deployment server
#                          before the servers it talks to), each TERM, then KILL after a grace
#   infra/stack.sh status  show what is recorded and whether it runs
#
# State (databases, logs, the pid file, env.sh) lives in $EAGLE3_STACK_DIR (default: runs/stack).
# After `up`:  source runs/stack/env.sh && prefect deployment run 'eagle3-pipeline/smollm2-cpu'
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$(mkdir -p "${EAGLE3_STACK_DIR:-runs/stack}" && cd "${EAGLE3_STACK_DIR:-runs/stack}" && pwd)"
PIDS="$STATE/stack.pids"
BIN="${VENV_BIN:-$ROOT/.venv/bin}"
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
START_TIMEOUT_S="${STACK_START_TIMEOUT_S:-240}"
GRACE_S="${STACK_STOP_GRACE_S:-15}"
PREFECT_API="http://127.0.0.1:${PREFECT_PORT}/api"
MLFLOW_URL="http://127.0.0.1:${MLFLOW_PORT}"

export PREFECT_HOME="$STATE/prefect"
export PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:///$STATE/prefect/prefect.db"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_UI_API_URL="$PREFECT_API"  # the UI's pages call this API (Prefect's default is port 4200)
export PREFECT_LOCAL_STORAGE_PATH="$ROOT/runs/.prefect/storage"  # the task cache (as `eagle3 run` uses)

alive() { kill -0 "$1" 2>/dev/null; }

start() {  # start NAME LOG CMD...: its own session/process group; records "NAME PID" (PID == PGID)
  local name="$1" log="$2"; shift 2
  setsid "$@" >"$log" 2>&1 < /dev/null &
  echo "$name $!" >>"$PIDS"
  echo "started $name (pid/pgid $!, log $log)"
}

wait_http() {  # wait_http NAME URL PID: until URL answers 2xx, the process dies, or the deadline passes
  local name="$1" url="$2" pid="$3" deadline=$((SECONDS + START_TIMEOUT_S))
  while (( SECONDS < deadline )); do
    if curl -fs -o /dev/null --max-time 2 "$url"; then echo "$name ready: $url"; return 0; fi
    if ! alive "$pid"; then echo "error: $name (pid $pid) exited during start-up; see its log" >&2; return 1; fi
    sleep 1
  done
  echo "error: $name not ready at $url after ${START_TIMEOUT_S}s" >&2
  return 1
}

running_recorded() {
  [[ -f "$PIDS" ]] || return 1
  local any=1 name pid
  while read -r name pid; do alive "$pid" && any=0; done <"$PIDS"
  return $any
}

up() {
  if running_recorded; then echo "stack already running (see $PIDS)"; status; return 0; fi
  rm -f "$PIDS"
  mkdir -p "$STATE/prefect" "$STATE/mlartifacts" "$ROOT/runs/.prefect/storage"
  trap 'echo "start-up failed; stopping what was started" >&2; down' ERR
  # logs streamed out: `prefect deployment run --watch` prints the flow run's log lines (the MLflow
  # parent run id, the decision), not only its state changes
  PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED=true PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED=true \
    start prefect-server "$STATE/prefect-server.log" \
    "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT"
  # no GenAI job runner (nothing of a training pipeline uses it), and uvicorn closes idle browser connections
  # within 5 s of SIGTERM, so `down` needs no SIGKILL
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false start mlflow-server "$STATE/mlflow-server.log" \
    "$BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
      --uvicorn-opts "--timeout-graceful-shutdown 5" \
      --backend-store-uri "sqlite:///$STATE/mlflow.db" --artifacts-destination "$STATE/mlartifacts"
  wait_http prefect-server "$PREFECT_API/health" "$(awk '$1=="prefect-server"{print $2}' "$PIDS")"
  wait_http mlflow-server "$MLFLOW_URL/health" "$(awk '$1=="mlflow-server"{print $2}' "$PIDS")"
  PREFECT_API_URL="$PREFECT_API" MLFLOW_TRACKING_URI="$MLFLOW_URL" \
    start deployments "$STATE/serve.log" "$BIN/python" -m flows.serve
  local pid deadline=$((SECONDS + START_TIMEOUT_S))
  pid="$(awk '$1=="deployments"{print $2}' "$PIDS")"
  until grep -q "serving .* deployments" "$STATE/serve.log" 2>/dev/null; do
    alive "$pid" || { echo "error: the deployment server exited; see $STATE/serve.log" >&2; false; }
    (( SECONDS < deadline )) || { echo "error: deployments not served after ${START_TIMEOUT_S}s" >&2; false; }
    sleep 1
  done
  trap - ERR
  cat >"$STATE/env.sh" <<ENV
export PREFECT_API_URL=$PREFECT_API
export MLFLOW_TRACKING_URI=$MLFLOW_URL
ENV
  echo "Prefect UI: http://127.0.0.1:${PREFECT_PORT}   MLflow UI: $MLFLOW_URL"
  echo "next: source $STATE/env.sh && prefect deployment run 'eagle3-pipeline/smollm2-cpu' --watch"
}

group_alive() { alive "$1" || pgrep -g "$1" >/dev/null 2>&1; }

stop_group() {  # stop_group NAME PID: TERM the group, wait up to GRACE_S, then KILL what is left
  local name="$1" pid="$2" deadline=$((SECONDS + GRACE_S))
  if group_alive "$pid"; then kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; fi
  while group_alive "$pid" && (( SECONDS < deadline )); do sleep 0.5; done
  if group_alive "$pid"; then
    echo "killing $name (group $pid): still running ${GRACE_S}s after SIGTERM"; kill -KILL -- "-$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))  # KILL is asynchronous: confirm the group is empty
    while pgrep -g "$pid" >/dev/null 2>&1; do
      (( SECONDS < deadline )) || { echo "error: group $pid ($name) still has processes" >&2; return 1; }
      sleep 0.2
    done
  fi
  echo "stopped $name (pid/pgid $pid)"
}

down() {
  [[ -f "$PIDS" ]] || { echo "nothing recorded in $PIDS"; return 0; }
  # newest first: the deployment server while the Prefect server it talks to still answers (it pauses its
  # deployments there on the way out), then the MLflow and Prefect servers
  local name pid rc=0
  while read -r name pid; do
    stop_group "$name" "$pid" || rc=1
  done < <(tac "$PIDS")
  (( rc == 0 )) || return 1
  rm -f "$PIDS" "$STATE/env.sh"
}

status() {
  [[ -f "$PIDS" ]] || { echo "stack not running (no $PIDS)"; return 0; }
  local name pid
  while read -r name pid; do
    if alive "$pid"; then echo "$name pid $pid: running"; else echo "$name pid $pid: not running"; fi
  done <"$PIDS"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
