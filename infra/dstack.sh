#!/usr/bin/env bash
# The distributed stack on one Docker host: Prefect's own machinery for a pipeline spread over machines.
#
#   infra/dstack.sh up      PostgreSQL, Prefect server (on PostgreSQL), MLflow server (on PostgreSQL, artifacts
#                           proxied to a store the server owns), work pools eagle3-gpu / eagle3-cpu (Docker type)
#                           with one Docker worker each, and `prefect deploy --all` of prefect.yaml onto them
#   infra/dstack.sh down    remove exactly what `up` started: its recorded containers, the flow-run containers
#                           its workers launched (label eagle3.dstack=<state dir>), its network; data is kept
#   infra/dstack.sh status  what is recorded and whether it runs
#
# Topology: every server is a container on one user-defined network ($EAGLE3_DSTACK_NETWORK, default
# <name>-net), found by name (postgres, prefect-server, mlflow) from every other container, the workers' flow-run
# containers included. Nothing listens on the host but the two published ports, bound to 127.0.0.1 (Prefect
# $PREFECT_PORT, default 4210; MLflow $MLFLOW_PORT, default 5010: the one-machine `make stack-up` keeps 4200/5000).
# Chosen over servers on the host bound to the bridge address: names instead of addresses, no host firewall or
# route_localnet dependency, nothing listening beyond loopback, and the same shape as servers on other hosts.
#
# Shared storage (what every worker mounts; on a cluster, NFS or PVCs): <state>/shared/runs at /runs (the worker
# image's paths.runs_dir) and <state>/shared/cache as the asset cache, mounted at /cache on the gpu pool and at
# /mnt/assets on the cpu pool: two "machines" that see the same storage at different paths.
# The PostgreSQL password is generated into <state>/secrets/pg_password (0600) and read by the containers from a
# read-only mount, never from an environment value on a command line.
#
# State lives in $EAGLE3_DSTACK_DIR (default runs/dstack). After `up`:
#   source runs/dstack/env.sh && prefect deployment run 'eagle3-distributed/tiny-random'
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$(mkdir -p "${EAGLE3_DSTACK_DIR:-runs/dstack}" && cd "${EAGLE3_DSTACK_DIR:-runs/dstack}" && pwd)"
NAME="${EAGLE3_DSTACK_NAME:-eagle3}"
NET="${EAGLE3_DSTACK_NETWORK:-$NAME-net}"
RECORD="$STATE/dstack.record"
BIN="${VENV_BIN:-$ROOT/.venv/bin}"
WORKER_IMAGE="${EAGLE3_WORKER_IMAGE:-eagle3-worker:cpu}"
GPU_IMAGE="${EAGLE3_GPU_WORKER_IMAGE:-$WORKER_IMAGE}"   # the image of the eagle3-gpu pool's jobs
PG_IMAGE="${EAGLE3_POSTGRES_IMAGE:-eagle3-postgres:15}"
PREFECT_PORT="${PREFECT_PORT:-4210}"
MLFLOW_PORT="${MLFLOW_PORT:-5010}"
DOCKER_SOCK="${EAGLE3_DOCKER_SOCK:-/var/run/docker.sock}"
GPUS="${EAGLE3_DSTACK_GPUS:-}"             # 'all' or a count: GPUs for the eagle3-gpu pool's containers
START_TIMEOUT_S="${STACK_START_TIMEOUT_S:-300}"
LABEL="eagle3.dstack=$STATE"
PREFECT_API="http://127.0.0.1:${PREFECT_PORT}/api"
MLFLOW_URL="http://127.0.0.1:${MLFLOW_PORT}"
IN_NET_PREFECT="http://prefect-server:4200/api"
IN_NET_MLFLOW="http://mlflow:5000"

die() { echo "error: $*" >&2; exit 1; }
log() { echo "[dstack] $*"; }

record() { echo "$1 $2 $3" >>"$RECORD"; }           # record KIND NAME ID
recorded() { awk -v k="$1" '$1==k {print $3}' "$RECORD" 2>/dev/null; }

run_container() {  # run_container NAME ALIAS ARGS...: a detached container on $NET, recorded
  local cname="$NAME-$1" alias="$2"; shift 2
  local id
  id="$(docker run -d --name "$cname" --label "$LABEL" --network "$NET" --network-alias "$alias" "$@")" \
    || die "docker run of $cname failed"
  record container "$cname" "$id"
  log "started $cname (${id:0:12})"
}

running() { [[ "$(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" == true ]]; }

wait_until() {  # wait_until WHAT CONTAINER CMD...: until CMD succeeds, the container stops, or the deadline
  local what="$1" cname="$NAME-$2" deadline=$((SECONDS + START_TIMEOUT_S)); shift 2
  while (( SECONDS < deadline )); do
    if "$@" >/dev/null 2>&1; then log "$what ready"; return 0; fi
    running "$cname" || { docker logs --tail 30 "$cname" >&2 || true; die "$cname exited while starting (log above)"; }
    sleep 1
  done
  docker logs --tail 30 "$cname" >&2 || true
  die "$what not ready after ${START_TIMEOUT_S}s (log of $cname above)"
}

pool_template() {  # pool_template POOL OUT: the Docker base job template of eagle3-POOL
  local pool="$1" cache_mount args=()
  if [[ "$pool" == gpu ]]; then cache_mount=/cache; else cache_mount=/mnt/assets; fi
  args+=(--image "$([[ $pool == gpu ]] && echo "$GPU_IMAGE" || echo "$WORKER_IMAGE")" --network "$NET")
  args+=(--volume "$STATE/shared/runs:/runs" --volume "$STATE/shared/cache:$cache_mount")
  args+=(--env "EAGLE3_CACHE=$cache_mount/eagle3-pipeline" --env "PREFECT_LOCAL_STORAGE_PATH=/runs/.prefect/storage")
  args+=(--env "MLFLOW_TRACKING_URI=$IN_NET_MLFLOW" --env "EAGLE3_WORK_POOL=eagle3-$pool" --label "$LABEL")
  [[ "$pool" == gpu && -n "$GPUS" ]] && args+=(--gpus "$GPUS")
  "$BIN/python" infra/pool_template.py docker "${args[@]}" >"$2"
}

worker_online() {  # worker_online POOL: a worker of eagle3-POOL has sent a heartbeat
  PREFECT_API_URL="$PREFECT_API" "$BIN/python" - "$1" <<'PY'
import sys
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as c:
    workers = c.read_workers_for_work_pool(f"eagle3-{sys.argv[1]}")
sys.exit(0 if any(w.status.value == "ONLINE" for w in workers) else 1)
PY
}

up() {
  if [[ -s "$RECORD" ]] && [[ -n "$(recorded container)" ]]; then
    local all=1 id; for id in $(recorded container); do running "$id" || all=0; done
    if (( all )); then log "stack already running (see $RECORD)"; status; return 0; fi
    die "a partial stack is recorded in $RECORD; run '$0 down' first"
  fi
  docker info >/dev/null 2>&1 || die "no Docker engine answers; start one: infra/docker-engine.sh up"
  local img
  for img in "$WORKER_IMAGE" "$GPU_IMAGE" "$PG_IMAGE"; do
    docker image inspect "$img" >/dev/null 2>&1 \
      || die "image $img not found; build it: infra/build-image.sh cpu|gpu|postgres (or make image-cpu)"
  done
  [[ -S "$DOCKER_SOCK" ]] || die "Docker socket $DOCKER_SOCK not found (the workers start containers through it); set EAGLE3_DOCKER_SOCK"
  [[ -x "$BIN/prefect" ]] || die "$BIN/prefect not found; expected the project's venv (make env)"
  rm -f "$RECORD"
  trap 'rc=$?; if (( rc )); then echo "start-up failed (exit $rc); removing what was started" >&2; down; fi' EXIT
  mkdir -p "$STATE/shared/runs/.prefect/storage" "$STATE/shared/cache" "$STATE/mlartifacts" "$STATE/pgdata" \
    "$STATE/secrets"
  if [[ ! -s "$STATE/secrets/pg_password" ]]; then
    (umask 077; head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32 >"$STATE/secrets/pg_password")
  fi
  chmod 600 "$STATE/secrets/pg_password"
  if docker network inspect "$NET" >/dev/null 2>&1; then
    log "network $NET exists (not ours: kept at down)"
  else
    record network "$NET" "$(docker network create --label "$LABEL" "$NET")"
    log "created network $NET"
  fi
  local secrets=(-v "$STATE/secrets:/run/secrets:ro")

  run_container postgres postgres "${secrets[@]}" -v "$STATE/pgdata:/var/lib/postgresql/data" \
    -e POSTGRES_PASSWORD_FILE=/run/secrets/pg_password "$PG_IMAGE"
  wait_until "PostgreSQL" postgres docker exec "$NAME-postgres" pg_isready -q -h 127.0.0.1 -U eagle3 -d mlflow

  run_container prefect-server prefect-server "${secrets[@]}" -p "127.0.0.1:$PREFECT_PORT:4200" \
    -e PREFECT_SERVER_ANALYTICS_ENABLED=false -e PREFECT_UI_API_URL="$PREFECT_API" \
    --entrypoint /bin/sh "$WORKER_IMAGE" -c 'PREFECT_API_DATABASE_CONNECTION_URL="postgresql+asyncpg://eagle3:$(cat /run/secrets/pg_password)@postgres:5432/prefect" exec prefect server start --host 0.0.0.0 --port 4200'
  run_container mlflow mlflow "${secrets[@]}" -p "127.0.0.1:$MLFLOW_PORT:5000" -v "$STATE/mlartifacts:/mlartifacts" \
    --entrypoint /bin/sh "$WORKER_IMAGE" -c "MLFLOW_BACKEND_STORE_URI=\"postgresql+psycopg://eagle3:\$(cat /run/secrets/pg_password)@postgres:5432/mlflow\" exec mlflow server --host 0.0.0.0 --port 5000 --workers 1 --artifacts-destination /mlartifacts --allowed-hosts 'mlflow,mlflow:5000,localhost,localhost:$MLFLOW_PORT,127.0.0.1,127.0.0.1:$MLFLOW_PORT'"
  wait_until "Prefect server ($PREFECT_API)" prefect-server curl -fs --max-time 2 "$PREFECT_API/health"
  wait_until "MLflow server ($MLFLOW_URL)" mlflow curl -fs --max-time 2 "$MLFLOW_URL/health"

  local pool
  for pool in gpu cpu; do
    pool_template "$pool" "$STATE/pool-$pool.json"
    PREFECT_API_URL="$PREFECT_API" "$BIN/prefect" --no-prompt work-pool create "eagle3-$pool" --type docker \
      --base-job-template "$STATE/pool-$pool.json" --overwrite >/dev/null
    log "work pool eagle3-$pool (docker; template $STATE/pool-$pool.json)"
    run_container "worker-$pool" "worker-$pool" -v "$DOCKER_SOCK:/var/run/docker.sock" \
      -e PREFECT_API_URL="$IN_NET_PREFECT" -e PREFECT_WORKER_QUERY_SECONDS=2 -e PREFECT_WORKER_HEARTBEAT_SECONDS=10 \
      "$WORKER_IMAGE" prefect worker start --pool "eagle3-$pool" --type docker --name "$NAME-worker-$pool"
  done
  for pool in gpu cpu; do wait_until "worker of eagle3-$pool" "worker-$pool" worker_online "$pool"; done

  log "prefect deploy --all (prefect.yaml) ..."
  PREFECT_API_URL="$PREFECT_API" "$BIN/prefect" --no-prompt deploy --all >"$STATE/deploy.log" 2>&1 \
    || { tail -30 "$STATE/deploy.log" >&2; die "prefect deploy --all failed (log above, full log $STATE/deploy.log)"; }
  log "$(grep -c "Deployment '.*' successfully created" "$STATE/deploy.log" || true) deployments on eagle3-gpu / eagle3-cpu"
  trap - EXIT
  cat >"$STATE/env.sh" <<ENV
export PREFECT_API_URL=$PREFECT_API
export MLFLOW_TRACKING_URI=$MLFLOW_URL
ENV
  log "Prefect UI: http://127.0.0.1:$PREFECT_PORT   MLflow UI: $MLFLOW_URL   shared runs: $STATE/shared/runs"
  local run="prefect deployment run 'eagle3-distributed/tiny-random' --watch"
  log "next: source $STATE/env.sh && $run"
}

down() {
  [[ -f "$RECORD" ]] || { log "nothing recorded in $RECORD"; return 0; }
  local id
  for id in $(recorded container); do
    docker rm -f "$id" >/dev/null 2>&1 && log "removed container ${id:0:12}" || true
  done
  for id in $(docker ps -aq --filter "label=$LABEL" 2>/dev/null || true); do   # flow-run containers of our workers
    docker rm -f "$id" >/dev/null 2>&1 && log "removed flow-run container ${id:0:12}" || true
  done
  for id in $(recorded network); do
    docker network rm "$id" >/dev/null 2>&1 && log "removed network ${id:0:12}" || true
  done
  left="$(docker ps -aq --filter "label=$LABEL")"
  [[ -z "$left" ]] || die "containers with label $LABEL still present: $left"
  rm -f "$RECORD" "$STATE/env.sh"
}

status() {
  [[ -f "$RECORD" ]] || { echo "distributed stack not running (no $RECORD)"; return 0; }
  local kind cname id
  while read -r kind cname id; do
    if [[ "$kind" == container ]]; then
      echo "$cname ${id:0:12}: $(docker inspect -f '{{.State.Status}}' "$id" 2>/dev/null || echo gone)"
    else
      echo "$kind $cname ${id:0:12}"
    fi
  done <"$RECORD"
  echo "flow-run containers: $(docker ps -q --filter "label=$LABEL" | wc -l) running"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
