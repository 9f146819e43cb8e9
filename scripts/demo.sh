#!/usr/bin/env bash
# Quick start: builds the idalloc CLI and walks through a pool on the default embedded file store,
# in a throwaway directory. Installs protoc (needed to build the etcd client) only if it is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v protoc >/dev/null 2>&1; then
    echo "demo: installing protobuf-compiler (protoc is needed to build the etcd client)" >&2
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update
    "${sudo[@]}" apt-get install -y protobuf-compiler
fi

echo "demo: building the idalloc CLI (release)" >&2
cargo build --release -q -p idalloc-cli
target_dir="$(cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
bin="${target_dir:-$PWD/target}/release/idalloc"

work="$(mktemp -d -t idalloc-demo.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"

step() {
    echo
    echo "\$ idalloc $*"
    "$bin" "$@"
}

echo "demo: working in $work (the store is the file idalloc.redb there)"
step pool create vni --range 4096-4196 --reserve 4100-4109 --strategy lowest
step acquire vni tenant-blue
step acquire vni tenant-green
step acquire vni tenant-red --holder ops
step acquire vni tenant-blue            # same key, same ID
step pool list
step list vni
step release vni tenant-green
step --json get vni tenant-blue
step gc
step gc --holder ops --dry-run
step status
echo
echo "demo: done"
