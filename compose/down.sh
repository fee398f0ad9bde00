#!/usr/bin/env bash
# Stop the composed deployment and remove its containers. The databases (named volumes) are
# kept unless asked: `compose/down.sh --volumes` deletes
# them too. Workers get SIGTERM and finish the message in hand (stop_grace_period).
#
# Env: COMPOSE_PROJECT_NAME (default harel-edge), and the port variables up.sh was given.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-harel-edge}
export HAREL_EDGE_KEYS_DIR=${HAREL_EDGE_KEYS_DIR:-$repo/.cache/compose/keys}
file=docker-compose.yml
[ "${HAREL_EDGE_COMPOSE:-replicas}" = namespaces ] && file=docker-compose.namespaces.yml
docker-compose --file "$here/$file" --project-name "$COMPOSE_PROJECT_NAME" \
    down --remove-orphans "$@"
