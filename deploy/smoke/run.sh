#!/usr/bin/env bash
# The deploy, run for real: builds the image from deploy/Dockerfile, brings deploy/docker-compose.yml
# up unchanged in a real Docker engine, checks the stack through its load balancer, stops it with
# `docker-compose stop` and checks that the stop lost and re-ran no task, then takes it all down.
#
#   deploy/smoke/run.sh           run it (as root, or as a user of a running Docker engine)
#   deploy/smoke/run.sh --clean   also remove the cached images (base images and stand-ins)
#
# Where the images the deploy files name cannot be pulled (no route to Docker Hub), it builds
# stand-ins for them locally (deploy/smoke/standins/, debian:bookworm-slim from debootstrap); the
# deploy files keep naming the real images. Images are kept between runs as the cache (the
# image's cargo-chef layer holds the compiled dependencies), so a rerun takes minutes.
#
# Environment: SMOKE_PROJECT (compose project name, default leasehold-smoke), SMOKE_WORK
# (scratch directory, default /var/tmp/leasehold-smoke), DOCKER (the docker CLI; default
# Debian's /usr/bin/docker, which matches Debian's engine, when present).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SMOKE=$ROOT/deploy/smoke
WORK=${SMOKE_WORK:-/var/tmp/leasehold-smoke}
PROJECT=${SMOKE_PROJECT:-leasehold-smoke}
CLEAN=false
[ "${1:-}" = --clean ] && CLEAN=true
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER_BUILDKIT=0 # the classic builder: BuildKit would pull its frontend from Docker Hub
T0=$(date +%s)
lap() { echo "== smoke: $1 (+$(($(date +%s) - T0)) s)"; }
fail() {
  echo "== smoke FAILED: $*" >&2
  exit 1
}
mkdir -p "$WORK"

# --- the tools ------------------------------------------------------------------------------------
need=()
command -v "$DOCKER" >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v curl >/dev/null || need+=(curl)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    fail "missing ${need[*]}: run \`sudo apt-get install -y ${need[*]}\`"
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  [ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
fi
COMPOSE=(docker-compose -p "$PROJECT" -f "$ROOT/deploy/docker-compose.yml")

# --- the engine: the running one, or one started here and stopped at the end -----------------------
STARTED_ENGINE=
cleanup() {
  local status=$?
  set +e
  if [ $status != 0 ] && [ -n "${UP:-}" ]; then
    "${COMPOSE[@]}" ps
    "${COMPOSE[@]}" logs --no-color --tail 40
  fi
  [ -n "${UP:-}" ] && "${COMPOSE[@]}" down -v --remove-orphans --timeout 20 >/dev/null 2>&1
  rm -rf "$WORK/context"
  if $CLEAN; then
    "$DOCKER" image rm -f leasehold:latest $(base_images 2>/dev/null) >/dev/null 2>&1
    "$DOCKER" image prune -f >/dev/null 2>&1
  fi
  if [ -n "$STARTED_ENGINE" ]; then
    kill "$STARTED_ENGINE" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$STARTED_ENGINE" 2>/dev/null || break; sleep 1; done
  fi
  lap "ended with status $status"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! "$DOCKER" info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || fail "no Docker engine answers: start one (\`sudo systemctl start docker\`)"
  # No iptables NAT here: containers reach each other and published ports, builds use the
  # host's network (--network host below).
  setsid /usr/sbin/dockerd --iptables=false --ip-masq=false >"$WORK/dockerd.log" 2>&1 &
  STARTED_ENGINE=$!
  for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
  "$DOCKER" info >/dev/null 2>&1 || fail "dockerd did not start: $(tail -5 "$WORK/dockerd.log")"
fi
lap "engine $("$DOCKER" version --format '{{.Server.Version}}')"

# --- base images: the ones the deploy files name, pulled or stood in for ---------------------------
base_images() {
  {
    # FROM lines name images or earlier stages (`FROM chef AS builder`): only the images.
    awk 'toupper($1) == "FROM" { if (!($2 in stage)) print $2; if (toupper($3) == "AS") stage[$4] = 1 }' \
      "$ROOT/deploy/Dockerfile"
    sed -n 's/^ *image: *\([^ ]*\)/\1/p' "$ROOT/deploy/docker-compose.yml"
  } | grep -v '^leasehold:' | sort -u
}

# The stand-in folder for an image the deploy files name.
standin_of() {
  case "$1" in
    debian:bookworm-slim) echo debian ;;
    rust:*) echo rust ;;
    postgres:*) echo postgres ;;
    nginx:*) echo nginx ;;
    jaegertracing/all-in-one:*) echo jaeger ;;
    *) return 1 ;;
  esac
}

hub_reachable() {
  curl -sS --max-time 5 -o /dev/null https://registry-1.docker.io/v2/ 2>/dev/null
}

# A stand-in is rebuilt when its files (or, for Rust, the toolchain) change: the image carries the
# hash of what it was built from.
standin_hash() {
  {
    case "$1" in
      debian) echo bookworm-minbase ;;
      *) (cd "$SMOKE/standins/$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) ;;
    esac
    if [ "$1" = rust ]; then rustc -V; fi
  } | sha256sum | cut -c1-16
}

build_debian() {
  command -v debootstrap >/dev/null || {
    [ "$(id -u)" = 0 ] || fail "missing debootstrap: run \`sudo apt-get install -y debootstrap\`"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  local main security rootfs=$WORK/rootfs
  # This machine's own apt mirrors, as its sources name them.
  main=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  security=$(awk '/^URIs:/{u=$2} END{print u}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  main=${main:-http://deb.debian.org/debian}
  security=${security:-http://deb.debian.org/debian-security}
  rm -rf "$rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$main" >"$WORK/debootstrap.log" 2>&1 ||
    fail "debootstrap: $(tail -5 "$WORK/debootstrap.log")"
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $main
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -c . | "$DOCKER" import -c 'CMD ["bash"]' \
    -c "LABEL leasehold.standin=$2" - debian:bookworm-slim >/dev/null
  rm -rf "$rootfs"
}

build_standin() { # image, folder, hash
  local context=$WORK/context/$2
  rm -rf "$context"
  mkdir -p "$context"
  cp -a "$SMOKE/standins/$2/." "$context/"
  if [ "$2" = rust ]; then
    local sysroot
    sysroot=$(rustc --print sysroot)
    mkdir -p "$context/rust" "$context/certs"
    # The toolchain without its documentation; hard links where the file system allows.
    for part in bin lib libexec; do
      [ -e "$sysroot/$part" ] || continue
      cp -al "$sysroot/$part" "$context/rust/" 2>/dev/null || cp -a "$sysroot/$part" "$context/rust/"
    done
    cp /usr/local/share/ca-certificates/*.crt "$context/certs/" 2>/dev/null || true
  fi
  "$DOCKER" build --network host -q --label "leasehold.standin=$3" -t "$1" "$context" \
    >"$WORK/standin-$2.log" 2>&1 || fail "building the $1 stand-in: $(tail -20 "$WORK/standin-$2.log")"
  rm -rf "$context"
}

# debian first: the other stand-ins are built on it.
images=$(base_images | awk '{print ($0 == "debian:bookworm-slim" ? 0 : 1), $0}' | sort | cut -d' ' -f2)
pull=unknown
for image in $images; do
  folder=$(standin_of "$image") || fail "$image: no stand-in for it in deploy/smoke/standins"
  hash=$(standin_hash "$folder")
  have=$("$DOCKER" image inspect -f '{{index .Config.Labels "leasehold.standin"}}' "$image" 2>/dev/null || echo absent)
  if [ "$have" = absent ] && [ $pull = unknown ]; then
    if hub_reachable; then pull=yes; else pull=no; fi
  fi
  if [ "$have" = absent ] && [ $pull = yes ] && "$DOCKER" pull -q "$image" >/dev/null 2>&1; then
    echo "   $image: pulled"
  elif [ "$have" = absent ] || { [ "$have" != "<no value>" ] && [ "$have" != "$hash" ]; }; then
    if [ "$folder" = debian ]; then build_debian "$image" "$hash"; else build_standin "$image" "$folder" "$hash"; fi
    echo "   $image: stand-in built"
  else
    echo "   $image: cached"
  fi
done
lap "base images"

# --- the image, as deploy/Dockerfile builds it ----------------------------------------------------
BUILD0=$(date +%s)
"$DOCKER" build --network host -f "$ROOT/deploy/Dockerfile" -t leasehold:latest "$ROOT" \
  >"$WORK/image-build.log" 2>&1 || fail "docker build: $(tail -30 "$WORK/image-build.log")"
BUILD_SECONDS=$(($(date +%s) - BUILD0))
lap "image built in ${BUILD_SECONDS} s ($("$DOCKER" image inspect -f '{{.Size}}' leasehold:latest | awk '{printf "%d MB", $1/1e6}'))"

# --- up, and healthy -------------------------------------------------------------------------------
"${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1 || true # a previous run's leftovers
UP=1
"${COMPOSE[@]}" up -d --no-build >"$WORK/up.log" 2>&1 || fail "compose up: $(tail -20 "$WORK/up.log")"

# Every container of the project: running ones healthy (or without a health check), one-shot
# ones (the migrations) exited 0.
wait_healthy() {
  local deadline=$(($(date +%s) + $1)) states
  while :; do
    states=$("$DOCKER" ps -a --filter "label=com.docker.compose.project=$PROJECT" \
      --format '{{.Names}} {{.Status}}')
    if echo "$states" | grep -E 'Exited \([1-9]|Restarting|Dead' >/dev/null; then
      fail "a container failed: $states"
    fi
    # 15 containers: the two migrations exited 0, the other 13 up and none still starting.
    if ! echo "$states" | grep -E 'starting|unhealthy|Created' >/dev/null &&
      [ "$(echo "$states" | grep -c ' Up ')" -ge 13 ] &&
      [ "$(echo "$states" | grep -c .)" -ge 15 ]; then
      echo "$states" | sort | sed 's/^/   /'
      return 0
    fi
    [ "$(date +%s)" -lt $deadline ] || fail "not healthy within $1 s: $states"
    sleep 1
  done
}
wait_healthy 180
lap "all 15 containers healthy"

# --- through the load balancer: the commands of docs/src/deploy.md ------------------------------
LB=localhost:8082
json() { python3 -c "import json, sys; v = json.load(sys.stdin); print($1)"; }
# Creates a task of body $1 through the load balancer and waits up to 60 s for it to succeed;
# sets $id and $status.
run_task() {
  id=$(curl -fsS -X POST $LB/api/tasks -H 'content-type: application/json' -d "$1" | json 'v["id"]')
  for _ in $(seq 60); do
    status=$(curl -fsS $LB/api/tasks/$id | json 'v["task"]["status"]')
    [ "$status" = succeeded ] && break
    sleep 1
  done
}
run_task '{"task_data": {"sleep_duration_seconds": 2}}'
[ "$status" = succeeded ] || fail "task $id is $status, not succeeded"
echo "   task $id created and succeeded through the load balancer"

# Work in a second language: worker-exec runs examples/exec/sleep.sh for the `shell` queue.
run_task '{"queue": "shell", "task_data": {"sleep_duration_seconds": 1}}'
output=$(curl -fsS $LB/api/tasks/$id | json 'json.dumps(v["task"]["taskOutput"], sort_keys=True)')
[ "$status" = succeeded ] || fail "shell task $id is $status, not succeeded"
[ "$output" = '{"by": "sh", "slept_seconds": 1}' ] || fail "shell task $id's output is $output"
echo "   task $id of the shell queue run by sh in worker-exec: $output"

lease=$(curl -fsS -X POST localhost:8081/api/leases -H 'content-type: application/json' \
  -d '{"resource": "smoke-printer", "holder": "smoke", "ttl_seconds": 30}')
fence=$(echo "$lease" | json 'v["fence"]')
curl -fsS -X DELETE localhost:8081/api/leases/release -H 'content-type: application/json' \
  -d "{\"resource\": \"smoke-printer\", \"holder\": \"smoke\", \"fence\": $fence}" >/dev/null
echo "   lease acquired (fence $fence) and released through the load balancer"

# The sample's bare POST (no body, no content type): HTTP/1.1 upstream (nginx.conf) lets it through.
curl -fsS -X POST $LB/api/generator/start >/dev/null || fail "a bare POST /api/generator/start failed"
leader() { json '(v["status"], (v["leader"] or {}).get("holder"), (v["leader"] or {}).get("fence"))'; }
for _ in $(seq 60); do
  through_lb=$(curl -fsS $LB/api/generator/status | leader)
  case "$through_lb" in *"'STARTED', None"*) sleep 1 ;; *) break ;; esac
done
echo "   generator started; status through the load balancer: $through_lb"
for container in $("$DOCKER" ps -q --filter "label=com.docker.compose.project=$PROJECT" \
  --filter "label=com.docker.compose.service=task-service"); do
  replica=$("$DOCKER" exec "$container" curl -fsS 127.0.0.1:8080/api/generator/status | leader)
  [ "$replica" = "$through_lb" ] || fail "replica $container says $replica, not $through_lb"
done
echo "   every task-service replica gives the same status"

# --- spans from every service at the collector -----------------------------------------------------
expected="lease-service task-generator task-service worker"
for _ in $(seq 60); do
  services=$(curl -fsS localhost:16686/api/services | json '" ".join(sorted(v["data"] or []))')
  missing=$(for s in $expected; do [[ " $services " == *" $s "* ]] || echo "$s"; done)
  [ -z "$missing" ] && break
  sleep 1
done
[ -z "$missing" ] || fail "the collector has no spans from: $missing (it has: $services)"
echo "   the collector has spans from: $services"
# Spans leave in batches (every few seconds): wait for the shell task's run to arrive.
for _ in $(seq 60); do
  operations=$(curl -fsS localhost:16686/api/services/worker/operations | json '" ".join(v["data"])')
  [[ " $operations " == *" run task "* ]] && break
  sleep 1
done
[[ " $operations " == *" run task "* ]] || fail "no worker span of a task's run: $operations"
echo "   the worker's spans include each task's run (\"run task\")"
lap "checks through the load balancer"

# --- docker-compose stop, with tasks in flight: nothing lost, nothing run twice --------------------
psql_tasks() {
  "${COMPOSE[@]}" exec -T postgres psql -U leasehold -d leasehold_tasks -Atc "$1"
}
for _ in 1 2 3 4 5 6; do
  curl -fsS -X POST $LB/api/tasks -H 'content-type: application/json' \
    -d '{"task_data": {"sleep_duration_seconds": 4}}' >/dev/null
done
for _ in $(seq 30); do
  running=$(psql_tasks "SELECT count(*) FROM tasks WHERE status = 'running'")
  [ "$running" -ge 3 ] && break
  sleep 1
done
[ "$running" -ge 3 ] || fail "only $running tasks running before the stop"
STOP0=$(date +%s.%N)
"${COMPOSE[@]}" stop >"$WORK/stop.log" 2>&1 || fail "compose stop: $(cat "$WORK/stop.log")"
STOP_SECONDS=$(python3 -c "print(f'{$(date +%s.%N) - $STOP0:.1f}')")
echo "   docker-compose stop took $STOP_SECONDS s with $running tasks running"
# Each process stopped by its signal, not killed when the stop's timeout ran out.
killed=$("$DOCKER" ps -a --filter "label=com.docker.compose.project=$PROJECT" \
  --format '{{.Names}}' | while read -r name; do
  code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$name")
  [ "$code" = 0 ] || echo "$name exited $code"
done)
[ -z "$killed" ] || fail "not every container stopped cleanly: $killed"
python3 -c "import sys; sys.exit(0 if $STOP_SECONDS < 15 else 1)" ||
  fail "docker-compose stop took $STOP_SECONDS s (limit 15 s)"
# Start again and let every task finish: a task the stop had left running under a worker that
# is gone would be run a second time once its lease lapsed, which the check below would see.
"${COMPOSE[@]}" start >"$WORK/start.log" 2>&1 || fail "compose start: $(tail -20 "$WORK/start.log")"
wait_healthy 180
curl -fsS -X POST $LB/api/generator/stop >/dev/null
for _ in $(seq 90); do
  open=$(psql_tasks "SELECT count(*) FROM tasks WHERE status IN ('pending', 'running')")
  [ "$open" = 0 ] && break
  sleep 1
done
[ "$open" = 0 ] || fail "$open tasks still pending or running 90 s after the restart"
report=$(psql_tasks "SELECT count(*),
    count(*) FILTER (WHERE status <> 'succeeded'),
    count(*) FILTER (WHERE (SELECT count(*) FROM task_transitions e
                            WHERE e.task_id = t.id AND e.to_status = 'running') <> 1)
  FROM tasks t")
IFS='|' read -r total unfinished rerun <<<"$report"
[ "$unfinished" = 0 ] || fail "$unfinished of $total tasks did not succeed"
[ "$rerun" = 0 ] || fail "$rerun of $total tasks ran other than exactly once"
echo "   after the stop and a start: all $total tasks succeeded, each ran exactly once"
lap "stop and restart"

"${COMPOSE[@]}" down -v --remove-orphans --timeout 20 >/dev/null 2>&1
UP=
lap "done: image build ${BUILD_SECONDS} s, stop ${STOP_SECONDS} s"
