#!/usr/bin/env bash
# Builds the `idalloc` binary of the previous build, for the mixed-build chaos test
# (crates/idalloc-chaos/tests/mixed_builds.rs), and prints its path. Until a second release is
# tagged, "previous" is the last commit before the fence floor (8b926b8^), as
# docs/design/compatibility.md says.
#
# The source comes from `git archive` into target/prev-src/<commit> (no worktree is registered);
# it builds in a target directory of its own (target/prev-build: sharing this workspace's saves
# little, as most dependencies differ in version or features, and would let the older build's
# uplifted files replace this build's), its binary renamed `idalloc-prev`. The binary is kept at
# target/prev/idalloc-<commit>: later runs reuse it.
# Exits non-zero, with the reason on stderr, when the commit is not in the history (a shallow
# clone) or does not build.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
commit="$(git rev-parse --verify --quiet '8b926b8^{commit}^' || true)"
if [ -z "$commit" ]; then
    echo "build-previous: commit 8b926b8^ is not in this clone's history (shallow?)" >&2
    exit 1
fi
out="$root/target/prev/idalloc-$commit"
if [ -x "$out" ]; then
    echo "$out"
    exit 0
fi
src="$root/target/prev-src/$commit"
rm -rf "$src"
mkdir -p "$src" "$root/target/prev"
git archive "$commit" | tar -x -C "$src"
sed -i 's/^name = "idalloc"$/name = "idalloc-prev"/' "$src/crates/idalloc-cli/Cargo.toml"
grep -q '^name = "idalloc-prev"$' "$src/crates/idalloc-cli/Cargo.toml" || {
    echo "build-previous: could not rename the binary in $src/crates/idalloc-cli/Cargo.toml" >&2
    exit 1
}
start=$(date +%s)
build() {
    (cd "$src" && cargo build --quiet --locked "$@" --target-dir "$root/target/prev-build" -p idalloc-cli --bin idalloc-prev) >&2
}
# Offline first (the registry cache usually holds every version); then with the network.
build --offline || build
cp "$root/target/prev-build/debug/idalloc-prev" "$out"
echo "build-previous: built $commit in $(( $(date +%s) - start ))s" >&2
echo "$out"
