#!/usr/bin/env bash
# The public API of the `idalloc` and `idalloc-client` crates against the last release, by
# cargo-semver-checks: more rules than scripts/public-api.py (CI's check), so it is a second
# opinion run at release time, by hand (installing it takes minutes); see
# docs/design/compatibility.md.
#
#   scripts/semver-check.sh [BASELINE]     # BASELINE: a tag or commit; default the last release
#                                          # (the newest v* tag, else its commit in public-api.py)
set -euo pipefail
cd "$(dirname "$0")/.."
baseline="${1:-$(python3 scripts/public-api.py --release | cut -d' ' -f2)}"
echo "semver-check: idalloc and idalloc-client against $baseline"
cargo semver-checks check-release --package idalloc --package idalloc-client --baseline-rev "$baseline"
