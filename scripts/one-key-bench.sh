#!/usr/bin/env bash
# One-key CLI costs (docs/scale.md, "One key"): wall time and peak resident
# memory (`/usr/bin/time`'s "maximum resident set size", as `-v` prints it) of `acquire` (a new
# key, then a key another holder bound), `get`, `lookup` and `release` against POOL, each run RUNS
# times; prints the median of each, and of `idalloc --version` (the process start alone, no
# store: what the machine costs, to tell it from what the pool costs).
#
#   scripts/one-key-bench.sh STORE POOL FILL_KEY FILL_ID [RUNS] [IDALLOC]
#
# STORE: an etcd endpoint (http://HOST:PORT, passed as --endpoints) or a store file (file:PATH,
# passed as --store). FILL_KEY/FILL_ID: a binding the pool already has
# (crates/idalloc/examples/fill_pool.rs names its keys pod-<12 digits>.node-17.cluster-a.example;
# it spreads IDs every max/N, or packs them from 1 with --strategy lowest).
set -euo pipefail
store=$1 pool=$2 fill_key=$3 fill_id=$4 runs=${5:-5} bin=${6:-target/debug/idalloc}
case $store in
  file:*) where=(--store "$store") ;;
  *) where=(--endpoints "$store") ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
measure() { # NAME ARGS... : appends "milliseconds kB" of one run to $tmp/NAME
  local name=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  /usr/bin/time -f "%M" -o "$tmp/one" "$bin" "$@" >/dev/null
  t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000000 )) $(cat "$tmp/one")" >>"$tmp/$name"
}
for i in $(seq 1 "$runs"); do
  key="bench-$$-$i"
  measure start --version
  measure acquire-new "${where[@]}" acquire "$pool" "$key" --holder bench
  measure acquire-bound "${where[@]}" acquire "$pool" "$fill_key" --holder bench
  measure get "${where[@]}" get "$pool" "$fill_key"
  measure lookup "${where[@]}" lookup "$pool" "$fill_id"
  measure release-bound "${where[@]}" release "$pool" "$fill_key" --holder bench
  measure release-reclaim "${where[@]}" release "$pool" "$key" --holder bench
done
printf '%-16s %10s %12s\n' command 'median ms' 'median MB'
for name in start acquire-new acquire-bound get lookup release-bound release-reclaim; do
  ms=$(awk '{print $1}' "$tmp/$name" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  mb=$(awk '{print $2/1024}' "$tmp/$name" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}')
  printf '%-16s %10s %12s\n' "$name" "$ms" "$mb"
done
