#!/usr/bin/env bash
# Build the edge workers' runtime image FROM scratch out of this host's Python and venv.
#
# Why: no base image (python:3.11-slim or any other) can be pulled on the machines this project
# builds on, so the image is assembled from files of the host, the way sqld/build-image.sh
# assembles sqld's: the interpreter at its own path, its standard library (no tests, no GUI),
# the venv's installed distributions, every shared library `ldd` lists for the interpreter and
# each extension module, the loader and the CA bundle (for libsql:// URLs over TLS).
#
# What it leaves out on purpose: harel_edge itself and the definitions. docker-compose.yml
# mounts them read-only from the checkout, so the containers always run the code of the tree
# (the venv only links to it, editable), and the image changes only when the interpreter or the
# dependencies do. It is labelled with a hash of those and rebuilt only when the hash changes.
# docs/deploy.md says where this image is not the right tool (another machine, another arch).
#
# Env: WORKER_IMAGE (default harel-edge/worker:dev), PYTHON (default <repo>/.venv/bin/python),
#      WORKER_CONTEXT_DIR (default <repo>/.cache/worker-image)
# Options: --force  rebuild even when the hash matches
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
image=${WORKER_IMAGE:-harel-edge/worker:dev}
python=${PYTHON:-$repo/.venv/bin/python}
context=${WORKER_CONTEXT_DIR:-$repo/.cache/worker-image}
say() { echo "build-worker-image: $*" >&2; }

force=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) say "unknown option $arg"; exit 2 ;;
    esac
done
# One build at a time (two deployments starting at once, e.g. parallel tests): the second waits,
# then finds the image built and its hash matching.
mkdir -p "$(dirname "$context")"
exec 9>"$context.lock"
flock 9
if ! docker info >/dev/null 2>&1; then
    say "no Docker engine answers (start one with scripts/start-docker.sh)"
    exit 1
fi
[ -x "$python" ] || { say "no Python at $python (run make venv, or set PYTHON)"; exit 1; }

read -r base purelib stdlib real < <("$python" -c '
import os, sys, sysconfig
paths = sysconfig.get_paths()
print(sys.base_prefix, paths["purelib"], paths["stdlib"], os.path.realpath(sys.executable))')

runtime_hash=$( {
    sha256sum "${BASH_SOURCE[0]}"
    "$python" -c 'import sys; print(sys.version, sys.base_prefix)'
    "$python" -m pip freeze --exclude-editable 2>/dev/null
} | sha256sum | cut -c1-16)
current=$(docker image inspect --format '{{ index .Config.Labels "harel-edge.runtime-hash" }}' "$image" 2>/dev/null || true)
if [ "$force" -eq 0 ] && [ "$current" = "$runtime_hash" ]; then
    say "image $image is up to date (runtime $runtime_hash)"
    exit 0
fi
say "interpreter $real, stdlib $stdlib, packages $purelib"

rm -rf "$context"
root=$context/rootfs
mkdir -p "$root/tmp" "$root/etc/ssl/certs" "$root/opt/harel-edge/src" "$root/opt/harel-edge/definitions" \
    "$root/var/lib/harel-edge"
chmod 1777 "$root/tmp"
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"

# The interpreter at its own path: its RUNPATH and its idea of its prefix are absolute.
mkdir -p "$root$base/bin" "$root$base/lib"
cp -L "$real" "$root$base/bin/python3"
for lib in "$base"/lib/libpython3*.so.1.0; do
    [ -e "$lib" ] && cp -L "$lib" "$root$base/lib/"
done
name=$(basename "$stdlib")
tar -C "$(dirname "$stdlib")" \
    --exclude="$name/site-packages" --exclude="$name/test" --exclude="$name/idlelib" \
    --exclude="$name/tkinter" --exclude="$name/turtledemo" --exclude="$name/ensurepip" \
    --exclude='*_tkinter*' -cf - "$name" | tar -C "$root$base/lib" -xf -

# The installed distributions, without the editable link to the checkout and the test tooling.
site=$root/opt/harel-edge/site-packages
mkdir -p "$site"
tar -C "$purelib" --exclude='__editable__*' --exclude='./pip' --exclude='./pip-*' \
    --exclude='./_pytest' --exclude='./hypothesis' -cf - . | tar -C "$site" -xf -

# Every shared library the interpreter and the extension modules need, and the loader.
libs=$( { ldd "$real"; find "$root" -name '*.so*' -type f -exec ldd {} \; 2>/dev/null; } |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
for lib in $libs; do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done

cat > "$context/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs/ /
LABEL harel-edge.runtime-hash="$runtime_hash"
ENV PYTHONPATH=/opt/harel-edge/src:/opt/harel-edge/site-packages \\
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \\
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
WORKDIR /var/lib/harel-edge
ENTRYPOINT ["$base/bin/python3"]
CMD ["-m", "harel_edge.cli", "worker", "--definitions", "/opt/harel-edge/definitions"]
DOCKERFILE
say "building $image from a $(du -sh "$context" | cut -f1) context"
docker build --quiet --tag "$image" "$context" >/dev/null
rm -rf "$context"
# A smoke check: the interpreter starts and the driver's native module loads (with the tree mounted).
check=$(docker run --rm --network none -v "$repo/harel_edge:/opt/harel-edge/src/harel_edge:ro" "$image" \
    -c 'import sys, libsql, harel_edge; print(sys.version.split()[0], "harel_edge", harel_edge.__version__)')
say "built $image (runtime $runtime_hash): $check"
