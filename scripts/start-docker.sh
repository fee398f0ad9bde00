#!/usr/bin/env bash
# Make a Docker engine reachable on this machine, installing and starting it if needed.
#
# Why: the machines harel_edge builds and tests on (Debian 12, root) ship without a running
# Docker engine, and CI must be able to run the sqld tests in a container. The engine is
# started without a bridge, iptables or IP forwarding because containers here run with
# network_mode=host and listen on 127.0.0.1 only (see sqld/README.md); no test traffic may
# reach a private-range address.
#
# Idempotent: does nothing when `docker info` already works.
# Env:
#   DOCKERD_LOG      where dockerd writes its log (default /tmp/harel-edge-dockerd.log)
#   DOCKERD_TIMEOUT  seconds to wait for the engine to answer (default 60)
set -euo pipefail

log=${DOCKERD_LOG:-/tmp/harel-edge-dockerd.log}
timeout=${DOCKERD_TIMEOUT:-60}

say() { echo "start-docker: $*" >&2; }

if docker info >/dev/null 2>&1; then
    say "a Docker engine is already reachable"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        say "dockerd is missing and this is not root: install docker.io yourself"
        exit 1
    fi
    say "installing docker.io and docker-compose with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io docker-compose >/dev/null
fi

if [ "$(id -u)" -ne 0 ]; then
    say "no Docker engine answers and starting dockerd needs root"
    exit 1
fi

# A live dockerd that does not answer yet is starting: wait for it rather than start a second.
# Otherwise a pid file left by a dockerd that was killed could stop the new one from starting
# ("pid file found") if its pid has been reused: remove it.
dockerd_running() {
    local pid
    for pid in $(pgrep -x dockerd || true); do
        grep -q '^State:[[:space:]]*[^Z]' "/proc/$pid/status" 2>/dev/null && return 0
    done
    return 1
}

if dockerd_running; then
    say "a dockerd is running but not answering yet; waiting for it"
else
    pidfile=/var/run/docker.pid
    if [ -f "$pidfile" ]; then
        say "removing the stale $pidfile"
        rm -f "$pidfile"
    fi
    say "starting dockerd (log: $log)"
    # setsid: dockerd gets its own session, so a Ctrl-C aimed at make or pytest spares it.
    setsid dockerd --bridge=none --iptables=false --ip-forward=false >"$log" 2>&1 </dev/null &
fi

deadline=$((SECONDS + timeout))
until docker info >/dev/null 2>&1; do
    if ! dockerd_running; then
        say "dockerd exited; last lines of its log ($log):"
        tail -n 40 "$log" >&2 || true
        exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "dockerd did not answer within ${timeout}s; last lines of its log ($log):"
        tail -n 40 "$log" >&2 || true
        exit 1
    fi
    sleep 0.2
done
say "Docker engine ready"
