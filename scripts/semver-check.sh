#!/usr/bin/env bash
# The public API of the `idalloc` and `idalloc-client` crates has no breaking change against the
# newest release (the newest `vX.Y.Z` tag) unless the crates' version says so: cargo-semver-checks
# compares the rustdoc of both and reads the release type from the version bump (before 1.0, a
# breaking change needs 0.x -> 0.(x+1)). scripts/test.sh runs it; see docs/design/compatibility.md.
#
#   scripts/semver-check.sh [BASELINE]     # BASELINE: a tag or commit; default the newest v* tag
#
# Without a release tag there is nothing to compare against, and it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
baseline="${1:-$(git describe --tags --abbrev=0 --match 'v[0-9]*' 2>/dev/null || true)}"
if [ -z "$baseline" ]; then
    echo "semver-check: no release tag (v*) in this clone: no API to compare against"
    exit 0
fi
echo "semver-check: idalloc and idalloc-client against $baseline"
cargo semver-checks check-release --package idalloc --package idalloc-client --baseline-rev "$baseline"
