#!/usr/bin/env bash
# Writes one file-store format fixture with the idalloc binary of the build that writes that format.
# Not run in CI: the fixtures are checked in (crates/idalloc-cli/tests/fixtures/), and
# crates/idalloc-cli/tests/file_formats.rs opens them with today's build.
#
#   scripts/make-format-fixtures.sh FORMAT IDALLOC_BINARY
#
# FORMAT 1: a binary built from a commit that writes format 1 (any commit before the format-2
#   store, e.g. fd58f11):
#     git worktree add /tmp/idalloc-f1 fd58f11
#     (cd /tmp/idalloc-f1 && cargo build -p idalloc-cli)
#     scripts/make-format-fixtures.sh 1 /tmp/idalloc-f1/target/debug/idalloc
# FORMAT 2: today's build:  cargo build -p idalloc-cli && scripts/make-format-fixtures.sh 2 target/debug/idalloc
#
# What every fixture holds (the test expects exactly this; change both together):
#   pool fx: range 1-100, reserved 5,7-9, strategy lowest, idle_grace 0, reuse_delay 720h
#     alpha -> 1 (alice), beta -> 2 (alice, bob), "a/b %c" -> 3 ("carol/x"),
#     gone -> 4 acquired and released by dave: a tombstone on a quarantine lease, and dave's
#     holder fence record;
#     through `serve`, a client session (ttl 86400 s): leased references on "leased" -> 6 and on
#     beta; the server is stopped with SIGTERM (sessions are not revoked at shutdown).
#   pool fy: range 1-10, prefix bits 0x100: k -> 1 (alice).
# Leases keep wall-clock deadlines in the file; the test moves them forward before opening.
set -euo pipefail

format="${1:?usage: $0 FORMAT IDALLOC_BINARY}"
bin="$(realpath "${2:?usage: $0 FORMAT IDALLOC_BINARY}")"
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/crates/idalloc-cli/tests/fixtures/file-format-$format.redb"
work="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

store="file:$work/store.redb"
run() { "$bin" --store "$store" "$@"; }

run pool create fx --range 1-100 --reserve 5,7-9 --strategy lowest --idle-grace 0 --reuse-delay 720h
run pool create fy --range 1-10 --prefix-bits 100 --strategy lowest
run acquire fx alpha --holder alice
run acquire fx beta --holder alice
run acquire fx beta --holder bob
run acquire fx 'a/b %c' --holder 'carol/x'
run acquire fx gone --holder dave
run release fx gone --holder dave
run acquire fy k --holder alice

# Leased references: a client session of `serve`.
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$bin" --store "$store" serve --listen "127.0.0.1:$port" >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 0.1
done
api="http://127.0.0.1:$port/v1"
session="$(curl -sf -X POST -H 'content-type: application/json' -d '{"ttl":86400}' "$api/sessions" | jq -r .session)"
curl -sf -X POST -H 'content-type: application/json' \
    -d "{\"keys\":[\"leased\",\"beta\"],\"session\":\"$session\"}" "$api/pools/fx/acquire"
echo
kill -TERM "$server"
wait "$server" || true
server=""

run list fx
run check
mkdir -p "$(dirname "$out")"
cp "$work/store.redb" "$out"
echo "wrote $out ($(stat -c %s "$out") bytes) with $("$bin" --version)"
