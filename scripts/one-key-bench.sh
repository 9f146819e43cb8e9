#!/usr/bin/env bash
# One-key CLI costs (issue 21 item 0; docs/scale.md, "One key"): wall time and peak resident
# memory of `acquire` (a new key, then a key another holder bound), `get`, `lookup` and `release`
# against POOL, each run RUNS times; prints the median of each.
#
#   scripts/one-key-bench.sh ENDPOINT POOL FILL_KEY FILL_ID [RUNS] [IDALLOC]
#
# FILL_KEY/FILL_ID: a binding the pool already has (crates/idalloc/examples/fill_pool.rs names
# its keys pod-<12 digits>.node-17.cluster-a.example and spreads IDs every max/N).
set -euo pipefail
endpoint=$1 pool=$2 fill_key=$3 fill_id=$4 runs=${5:-5} bin=${6:-target/debug/idalloc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
measure() { # NAME ARGS... : appends "milliseconds kB" of one run to $tmp/NAME
  local name=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  /usr/bin/time -f "%M" -o "$tmp/one" "$bin" --endpoints "$endpoint" "$@" >/dev/null
  t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000000 )) $(cat "$tmp/one")" >>"$tmp/$name"
}
for i in $(seq 1 "$runs"); do
  key="bench-$$-$i"
  measure acquire-new acquire "$pool" "$key" --holder bench
  measure acquire-bound acquire "$pool" "$fill_key" --holder bench
  measure get get "$pool" "$fill_key"
  measure lookup lookup "$pool" "$fill_id"
  measure release-bound release "$pool" "$fill_key" --holder bench
  measure release-reclaim release "$pool" "$key" --holder bench
done
printf '%-16s %10s %12s\n' command 'median ms' 'median MB'
for name in acquire-new acquire-bound get lookup release-bound release-reclaim; do
  ms=$(awk '{print $1}' "$tmp/$name" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  mb=$(awk '{print $2/1024}' "$tmp/$name" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}')
  printf '%-16s %10s %12s\n' "$name" "$ms" "$mb"
done
