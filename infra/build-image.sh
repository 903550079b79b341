#!/usr/bin/env bash
# Build the images of the distributed stack from a Debian base made on this machine (no registry pulls).
#
#   infra/build-image.sh base   eagle3-base:bookworm   debootstrap --variant=minbase of Debian bookworm, docker import
#   infra/build-image.sh cpu    eagle3-worker:cpu      the project on CPU torch 2.13.0 (infra/Dockerfile.worker)
#   infra/build-image.sh gpu    eagle3-worker:gpu      the project on PyPI's CUDA torch 2.13.0 + SGLang's own venv
#   infra/build-image.sh postgres  eagle3-postgres:15  PostgreSQL 15 from Debian (infra/postgres/Dockerfile)
#
# cpu, gpu and postgres build the base first when it is missing. Idempotent: an existing base is kept (set
# EAGLE3_REBUILD_BASE=1 to remake it); Docker's layer cache keeps the installed dependencies while pyproject.toml
# and the Makefile are unchanged. Needs a running Docker engine (infra/docker-engine.sh up) and, for the base,
# root (debootstrap is installed with apt-get when missing).
#
# Build inputs that never go into git (infra/.build/, ignored; only the deps stage sees them): the CA bundle pip inside the build trusts
# ($EAGLE3_BUILD_CA, default Debian's /etc/ssl/certs/ca-certificates.crt: a proxy that re-signs TLS works), and for
# cpu the CPU torch wheel: whatever `pip download torch==2.13.0` resolves to here when that is a +cpu build (a local
# wheel found through pip's find-links), else the one from $TORCH_CPU_INDEX (default
# https://download.pytorch.org/whl/cpu). PyPI's CUDA torch, torchvision and torchaudio never enter the cpu image.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BASE_IMAGE="${EAGLE3_BASE_IMAGE:-eagle3-base:bookworm}"
SUITE="${EAGLE3_BASE_SUITE:-bookworm}"
BUILD="$ROOT/infra/.build"
TORCH_VERSION="2.13.0"
PY="${VENV_BIN:-$ROOT/.venv/bin}/python"
[[ -x "$PY" ]] || PY="$(command -v python3)"

die() { echo "error: $*" >&2; exit 1; }

mirror() {  # the Debian mirror this machine's apt uses (deb822 or one-line sources), else deb.debian.org
  local m=""
  if [[ -n "${EAGLE3_DEBIAN_MIRROR:-}" ]]; then echo "$EAGLE3_DEBIAN_MIRROR"; return; fi
  m="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
  [[ -n "$m" ]] || m="$(awk '$1=="deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
  echo "${m:-http://deb.debian.org/debian}"
}

base() {
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && [[ "${EAGLE3_REBUILD_BASE:-0}" != 1 ]]; then
    echo "base image $BASE_IMAGE present"; return 0
  fi
  [[ "$(id -u)" == 0 ]] || die "debootstrap needs root (uid 0), running as uid $(id -u)"
  if ! command -v debootstrap >/dev/null; then
    echo "installing debootstrap (apt-get) ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; } \
      || die "debootstrap missing and apt-get install debootstrap failed"
  fi
  local dir t0=$SECONDS
  dir="$(mktemp -d /tmp/eagle3-rootfs.XXXXXX)"
  trap 'rm -rf "$dir"' RETURN
  echo "debootstrap --variant=minbase $SUITE from $(mirror) ..."
  debootstrap --variant=minbase "$SUITE" "$dir" "$(mirror)" >"$dir.log" 2>&1 \
    || { tail -20 "$dir.log" >&2; die "debootstrap failed (log above, full log $dir.log)"; }
  rm -f "$dir.log"
  rm -rf "$dir"/var/cache/apt/archives/*.deb
  tar -C "$dir" -c . | docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
  echo "base image $BASE_IMAGE made in $((SECONDS - t0)) s"
}

build_inputs() {  # build_inputs VARIANT: infra/.build/ca.crt and infra/.build/VARIANT/{wheels/,constraints.txt}
  local variant="$1" ca="${EAGLE3_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}" dir="$BUILD/$1"
  [[ -f "$ca" ]] || die "CA bundle $ca not found; expected a PEM file for pip inside the build (set EAGLE3_BUILD_CA)"
  mkdir -p "$dir/wheels" "$BUILD/cpu/wheels" "$BUILD/gpu/wheels"
  cp "$ca" "$BUILD/ca.crt"
  : >"$dir/constraints.txt"
  [[ "$variant" == cpu ]] || return 0
  local wheel tmp
  wheel="$(ls "$dir"/wheels/torch-"$TORCH_VERSION"+cpu-cp311-*.whl 2>/dev/null | head -1 || true)"
  if [[ -z "$wheel" ]]; then
    tmp="$(mktemp -d)"
    # what `pip install torch==2.13.0` resolves to on this machine (a local +cpu wheel through pip's find-links?)
    "$PY" -m pip download -q "torch==$TORCH_VERSION" --no-deps --only-binary :all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 -d "$tmp" >/dev/null 2>&1 || true
    wheel="$(ls "$tmp"/torch-"$TORCH_VERSION"+cpu-*.whl 2>/dev/null | head -1 || true)"
    if [[ -z "$wheel" ]]; then  # that was PyPI's CUDA build (or nothing): take the CPU build from its own index
      rm -f "$tmp"/*.whl
      "$PY" -m pip download -q "torch==$TORCH_VERSION" --no-deps --only-binary :all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" \
        -d "$tmp" || die "no CPU torch $TORCH_VERSION wheel for Python 3.11 at ${TORCH_CPU_INDEX:-download.pytorch.org}"
      wheel="$(ls "$tmp"/torch-"$TORCH_VERSION"+cpu-*.whl 2>/dev/null | head -1 || true)"
    fi
    [[ -n "$wheel" ]] || die "expected a torch-$TORCH_VERSION+cpu wheel, got: $(ls "$tmp")"
    mv "$wheel" "$dir/wheels/"
    wheel="$dir/wheels/$(basename "$wheel")"
    rm -rf "$tmp"
  fi
  echo "CPU torch: $wheel"
  echo "torch==$TORCH_VERSION+cpu" >"$dir/constraints.txt"
}

worker() {  # worker VARIANT
  local variant="$1" t0=$SECONDS tag="${EAGLE3_WORKER_IMAGE:-eagle3-worker:$1}"
  base
  build_inputs "$variant"
  local log="$BUILD/build-$variant.log"
  echo "building $tag (log $log) ..."
  DOCKER_BUILDKIT=0 docker build -f infra/Dockerfile.worker --build-arg BASE="$BASE_IMAGE" \
    --build-arg VARIANT="$variant" -t "$tag" . >"$log" 2>&1 \
    || { tail -40 "$log" >&2; die "docker build of $tag failed (last lines above, full log $log)"; }
  docker run --rm --entrypoint python "$tag" -c "import importlib.metadata as m, torch; print('image $tag: torch',
torch.__version__, '| prefect', m.version('prefect'), '| mlflow', m.version('mlflow'), '| prefect-docker',
m.version('prefect-docker'))"
  echo "worker image $tag built in $((SECONDS - t0)) s"
}

postgres() {
  local t0=$SECONDS
  base
  local log="$BUILD/build-postgres.log"
  mkdir -p "$BUILD"
  DOCKER_BUILDKIT=0 docker build -f infra/postgres/Dockerfile --build-arg BASE="$BASE_IMAGE" \
    -t "${EAGLE3_POSTGRES_IMAGE:-eagle3-postgres:15}" infra/postgres >"$log" 2>&1 \
    || { tail -40 "$log" >&2; die "docker build of the postgres image failed (last lines above, full log $log)"; }
  echo "postgres image ${EAGLE3_POSTGRES_IMAGE:-eagle3-postgres:15} built in $((SECONDS - t0)) s"
}

docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed); start one: infra/docker-engine.sh up"
case "${1:-}" in
  base) base ;;
  cpu|gpu) worker "$1" ;;
  postgres) postgres ;;
  *) echo "usage: $0 base|cpu|gpu|postgres" >&2; exit 2 ;;
esac
