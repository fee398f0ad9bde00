#!/usr/bin/env bash
# Bring the composed deployment up: sqld primary + replica node (auth on) and N edge workers,
# each running `harel-edge worker` on the demo's statecharts or on a directory of your own.
#
# Why a script rather than a bare `docker-compose up`: the primary needs its JWT public key on
# disk and the workers a token before anything starts, the worker image has to exist, and the
# workers should start only once the primary answers (an embedded replica cannot even be
# opened while its primary is down). Idempotent: running it again reuses the keys and applies
# any change of the compose file or of HAREL_EDGE_WORKERS.
#
# Env (all optional):
#   HAREL_EDGE_COMPOSE       replicas (docker-compose.yml, the default) or namespaces
#                            (docker-compose.namespaces.yml: a database per tenant, HAREL_EDGE_DATABASES,
#                            default tenant1,tenant2,tenant3, made by its `tenants` service)
#   COMPOSE_PROJECT_NAME     compose project (default harel-edge)
#   HAREL_EDGE_WORKERS       number of edge workers (default 3; 2 with namespaces)
#   HAREL_EDGE_DEFINITIONS_DIR  the directory of .stm statecharts the workers run (and the Python
#                            modules their `bind` blocks name); default <repo>/harel_edge/examples
#   HAREL_EDGE_WORKER_LOG_LEVEL  the workers' --log-level (default info)
#   HAREL_EDGE_KEYS_DIR      keys and tokens, made by sqld/make-keys.py (default <repo>/.cache/compose/keys)
#   HAREL_EDGE_AUTH_TOKEN    the workers' token (default: the read-write token in the keys dir)
#   SQLD_PRIMARY_HTTP_PORT, SQLD_PRIMARY_GRPC_PORT, SQLD_REPLICA_HTTP_PORT (8080, 5001, 8081)
#   SQLD_IMAGE, HAREL_EDGE_WORKER_IMAGE, and the HAREL_EDGE_* variables docker-compose.yml passes on
#   UP_TIMEOUT               seconds to wait for sqld to answer (default 60)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-harel-edge}
export HAREL_EDGE_KEYS_DIR=${HAREL_EDGE_KEYS_DIR:-$repo/.cache/compose/keys}
timeout=${UP_TIMEOUT:-60}
say() { echo "up: $*" >&2; }
case ${HAREL_EDGE_COMPOSE:-replicas} in
    replicas) file=docker-compose.yml; workers=${HAREL_EDGE_WORKERS:-3}; nodes=(sqld-primary sqld-replica) ;;
    namespaces) file=docker-compose.namespaces.yml; workers=${HAREL_EDGE_WORKERS:-2}; nodes=(sqld-primary) ;;
    *) say "HAREL_EDGE_COMPOSE=$HAREL_EDGE_COMPOSE: say replicas (the default) or namespaces"; exit 2 ;;
esac
compose=(docker-compose --file "$here/$file" --project-name "$COMPOSE_PROJECT_NAME")

# The workers' statecharts: checked here, so a typo fails now rather than in N restarting containers.
definitions=${HAREL_EDGE_DEFINITIONS_DIR:-$repo/harel_edge/examples}
if [ ! -d "$definitions" ]; then
    say "HAREL_EDGE_DEFINITIONS_DIR=$definitions is not a directory: name the directory of .stm files the workers should run"
    exit 2
fi
HAREL_EDGE_DEFINITIONS_DIR=$(cd "$definitions" && pwd)
export HAREL_EDGE_DEFINITIONS_DIR
if ! compgen -G "$HAREL_EDGE_DEFINITIONS_DIR/*.stm" >/dev/null; then
    say "HAREL_EDGE_DEFINITIONS_DIR=$HAREL_EDGE_DEFINITIONS_DIR holds no .stm file: put the workers' statecharts there"
    exit 2
fi

# Keys: an existing key pair is reused, so tokens handed out before stay valid.
"$python" "$repo/sqld/make-keys.py" --out-dir "$HAREL_EDGE_KEYS_DIR" 2>/dev/null
if [ -z "${HAREL_EDGE_AUTH_TOKEN:-}" ]; then
    HAREL_EDGE_AUTH_TOKEN=$(cat "$HAREL_EDGE_KEYS_DIR/token-rw")
    export HAREL_EDGE_AUTH_TOKEN
fi

bash "$here/build-worker-image.sh"

"${compose[@]}" up --detach --remove-orphans "${nodes[@]}"

# Ready when /health answers 200: polled, never a fixed sleep.
wait_healthy() {
    local name=$1 port=$2 deadline=$((SECONDS + timeout))
    until "$python" -c "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:$port/health', timeout=2).status != 200)" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "$name did not answer on 127.0.0.1:$port within ${timeout}s; its log:"
            "${compose[@]}" logs --tail 30 "$name" >&2 || true
            exit 1
        fi
        sleep 0.2
    done
    say "$name answers on http://127.0.0.1:$port"
}
wait_healthy sqld-primary "${SQLD_PRIMARY_HTTP_PORT:-8080}"
if [ "$file" = docker-compose.yml ]; then
    wait_healthy sqld-replica "${SQLD_REPLICA_HTTP_PORT:-8081}"
else
    # Each tenant's database and schema before the workers serve them (one made already is kept).
    "${compose[@]}" run --rm tenants
fi

"${compose[@]}" up --detach --remove-orphans --scale edge-worker="$workers" edge-worker
if [ "$file" = docker-compose.yml ]; then
    nodes_said="replica node http://127.0.0.1:${SQLD_REPLICA_HTTP_PORT:-8081}"
else
    nodes_said="databases ${HAREL_EDGE_DATABASES:-tenant1,tenant2,tenant3}"
fi
say "project $COMPOSE_PROJECT_NAME: primary http://127.0.0.1:${SQLD_PRIMARY_HTTP_PORT:-8080}," \
    "$nodes_said, $workers edge workers running $HAREL_EDGE_DEFINITIONS_DIR" \
    "(token: $HAREL_EDGE_KEYS_DIR/token-rw)"
