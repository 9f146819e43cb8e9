#!/usr/bin/env bash
# Benchmark (not a test) of the idalloc CLI end to end: one `idalloc acquire` process (median of
# RUNS runs, each a new key, process start to exit) and `acquire --from` of KEYS keys (keys per
# second), on the file store and on etcd. etcd: $IDALLOC_BENCH_ETCD if set, else one started here on
# free loopback ports and killed (by PID) at the end. Results go to stdout; docs/guide/cli.md quotes them.
#
#   scripts/bench-cli.sh            # RUNS=50 KEYS=100000
#   RUNS=20 KEYS=10000 scripts/bench-cli.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS="${RUNS:-50}"
KEYS="${KEYS:-100000}"

cargo build --release -q -p idalloc-cli
bin="$PWD/target/release/idalloc"
work="$(mktemp -d -t idalloc-bench.XXXXXX)"
etcd_pid=""
cleanup() {
    if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then echo "$port"; return; fi
    done
}

etcd_url="${IDALLOC_BENCH_ETCD:-}"
if [ -z "$etcd_url" ]; then
    cport="$(free_port)"; pport="$(free_port)"
    etcd_url="http://127.0.0.1:${cport}"
    etcd --name bench --data-dir "$work/etcd" \
        --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
        --listen-peer-urls "http://127.0.0.1:${pport}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${pport}" \
        --initial-cluster "bench=http://127.0.0.1:${pport}" >"$work/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 1 100); do
        if "$bin" --store "$etcd_url" --timeout 1s status >/dev/null 2>&1; then break; fi
        sleep 0.2
    done
fi

now_ns() { date +%s%N; }

median_ms() { sort -n | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.1f", m / 1e6}'; }

bench_store() {
    local name="$1" store="$2"
    export IDALLOC_STORE="$store" IDALLOC_PREFIX="bench-$$-$name"
    "$bin" pool create one --range 1-1000000 >/dev/null
    "$bin" pool create many --range 1-1000000 >/dev/null
    "$bin" acquire one warmup >/dev/null
    local times=()
    for i in $(seq 1 "$RUNS"); do
        local t0; t0="$(now_ns)"
        "$bin" acquire one "key-$i" >/dev/null
        times+=($(( $(now_ns) - t0 )))
    done
    local med; med="$(printf '%s\n' "${times[@]}" | median_ms)"
    echo "$name: one 'idalloc acquire' process, new key: median ${med} ms over $RUNS runs"

    seq -f "bulk-key-%.0f" 1 "$KEYS" > "$work/keys.txt"
    local t0; t0="$(now_ns)"
    "$bin" acquire many --from "$work/keys.txt" > "$work/out-$name.tsv"
    local ns=$(( $(now_ns) - t0 ))
    local lines; lines="$(wc -l < "$work/out-$name.tsv")"
    awk -v n="$lines" -v ns="$ns" -v name="$name" 'BEGIN { printf "%s: acquire --from %d new keys: %.1f s, %.0f keys/s\n", name, n, ns/1e9, n/(ns/1e9) }'
    # Again: every key already bound and held by the same holder (one round trip each, no write
    # of a new binding).
    t0="$(now_ns)"
    "$bin" acquire many --from "$work/keys.txt" > /dev/null
    ns=$(( $(now_ns) - t0 ))
    awk -v n="$lines" -v ns="$ns" -v name="$name" 'BEGIN { printf "%s: acquire --from %d keys already held: %.1f s, %.0f keys/s\n", name, n, ns/1e9, n/(ns/1e9) }'
}

echo "idalloc CLI benchmark: $(nproc) CPUs, $(uname -sr), etcd $(etcd --version 2>/dev/null | head -n1 | awk '{print $3}')"
bench_store file "file:$work/bench.redb"
bench_store etcd "$etcd_url"
