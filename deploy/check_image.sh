#!/usr/bin/env bash
# Builds the CPU image and checks a container of it end to end, where a Docker engine runs:
# it becomes ready and healthy; its first model is created without compiling the kernels
# (the image holds them); it learns and predicts; SIGTERM snapshots the model and a new
# container on the same volume serves what it learned; after a `kill -9` the write-ahead log
# on the volume gives back what the snapshot lacks.
#
#   bash deploy/check_image.sh          # from the repository root
#
# Environment: IMAGE (default gln-service:check), PORT (default 18000), NETWORK: "bridge"
# (default; the port published on 127.0.0.1) or "host" (for an engine without a bridge network:
# the build and the container on the host's network).
set -euo pipefail
IMAGE=${IMAGE:-gln-service:check}
PORT=${PORT:-18000}
NETWORK=${NETWORK:-bridge}
NAME=gln-check-$$
VOLUME=gln-check-$$
S=http://127.0.0.1:$PORT
JSON='content-type: application/json'

fail() { echo "FAILED: $*"; docker logs "$NAME" 2>&1 | tail -20; exit 1; }
cleanup() {
  docker rm -f "$NAME" >/dev/null 2>&1 || true
  docker volume rm "$VOLUME" >/dev/null 2>&1 || true
}
trap cleanup EXIT

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds, polled twice a second
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq $((2 * seconds))); do
    "$@" && return
    sleep 0.5
  done
  fail "not $what within $seconds s"
}

ready() { curl -sf "$S/readyz" >/dev/null; }
healthy() { [ "$(docker inspect --format '{{.State.Health.Status}}' "$NAME")" = healthy ]; }

start() {
  local network=(-p "127.0.0.1:$PORT:8000")
  [ "$NETWORK" = host ] && network=(--network host -e GLN_PORT="$PORT")
  docker rm -f "$NAME" >/dev/null 2>&1 || true
  docker run -d --name "$NAME" "${network[@]}" -v "$VOLUME:/var/lib/gln/snapshots" "$IMAGE" \
    >/dev/null
  wait_for 30 ready ready
}

examples_seen() {
  curl -sf "$S/v1/models/demo" | python3 -c 'import json, sys; print(json.load(sys.stdin)["examples_seen"])'
}

learn() {  # $1 requests of one row each
  for i in $(seq "$1"); do
    curl -sf -o /dev/null -X POST "$S/v1/models/demo/learn" -H "$JSON" \
      -d "{\"features\": [[$((i % 3)).5, -0.25, 1.0]], \"labels\": [$((i % 2))]}" \
      || fail "learn request $i"
  done
}

build_network=()
[ "$NETWORK" = host ] && build_network=(--network host)
docker build "${build_network[@]}" -f deploy/Dockerfile -t "$IMAGE" .

start
seconds=$(curl -sf -o /dev/null -w '%{time_total}' -X POST "$S/v1/models" -H "$JSON" \
  -d '{"name": "demo", "config": {"num_features": 3, "num_classes": 2, "layer_sizes": [16, 1]}}') \
  || fail "create"
echo "first model created in $seconds s"
# Compiling the kernels would take seconds; loading them from the image's cache does not.
python3 -c "import sys; sys.exit(float('$seconds') >= 2.0)" || fail "create took $seconds s"
learn 40
answer=$(curl -sf -X POST "$S/v1/models/demo/predict" -H "$JSON" \
  -d '{"features": [[0.5, 0.0, 1.0]]}') || fail "predict"
grep -q '"probabilities"' <<<"$answer" || fail "predict answered $answer"
wait_for 40 healthy healthy
echo "ready and healthy; 40 examples learned"

docker stop "$NAME" >/dev/null
logs=$(docker logs "$NAME" 2>&1)  # whole: grep -q would stop reading and fail the pipe
grep -q "every changed model snapshotted" <<<"$logs" || fail "no final snapshot"
start
[ "$(examples_seen)" = 40 ] || fail "restored $(examples_seen) examples after SIGTERM, not 40"
echo "SIGTERM: snapshotted, restored with 40 examples"

learn 3
docker kill -s KILL "$NAME" >/dev/null
start
[ "$(examples_seen)" = 43 ] || fail "restored $(examples_seen) examples after kill -9, not 43"
echo "kill -9: the log replayed, restored with 43 examples"
echo "image check passed"
