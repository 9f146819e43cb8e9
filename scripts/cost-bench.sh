#!/usr/bin/env bash
# Cost per binding of the whole-pool commands (docs/scale.md, "Linear cost,
# quiet"): `list`, `check`, `gc --dry-run` and a new process's sync (`watch --count 0`) on POOL of
# BINDINGS bindings, one run each. Per command it prints the client's CPU (user + sys), the etcd
# server's CPU over the command (utime + stime of ETCD_PID from /proc, when given), the wall time,
# the client's peak resident memory (`/usr/bin/time`'s maximum resident set size) and the CPU µs
# per binding (client + etcd), with the load average before and after.
#
#   scripts/cost-bench.sh STORE POOL BINDINGS [IDALLOC] [ETCD_PID] [COMMANDS]
#
# STORE: an etcd endpoint (http://HOST:PORT, passed as --endpoints) or a store file (file:PATH,
# passed as --store). COMMANDS: a space-separated subset of "list check gc sync" (default all).
# With REPEAT=R, each command runs R times in a row and the figures are per run (CPU and wall
# averaged, peak the largest): small pools cost a few clock ticks a run, too coarse alone.
# With LOCK=/path set, each command runs holding `flock` on that file (one measurement at a time
# on a shared machine), released between commands.
set -euo pipefail
store=$1 pool=$2 n=$3 bin=${4:-target/release/idalloc} etcd=${5:-} cmds=${6:-list check gc sync}
case $store in
  file:*) where=(--store "$store") ;;
  *) where=(--endpoints "$store") ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tick=$(getconf CLK_TCK)
etcd_cpu() { # utime + stime of the etcd process, in clock ticks (0 without one)
  if [ -n "$etcd" ]; then awk '{print $14 + $15}' "/proc/$etcd/stat"; else echo 0; fi
}
printf '%-5s %9s %9s %9s %10s %9s  %s\n' cmd client_s etcd_s wall_s peak_MB us/bind load
for c in $cmds; do
  case $c in
    list) args=(list "$pool") ;;
    check) args=(check "$pool") ;;
    gc) args=(gc --dry-run "$pool") ;;
    sync) args=(watch "$pool" --count 0) ;;
    *) echo "unknown command $c (list, check, gc, sync)" >&2; exit 2 ;;
  esac
  if [ -n "${LOCK:-}" ]; then exec 9>"$LOCK"; flock 9; fi
  before=$(cut -d' ' -f1 /proc/loadavg)
  e0=$(etcd_cpu)
  t0=$(date +%s%N)
  : >"$tmp/t"
  for _ in $(seq 1 "${REPEAT:-1}"); do
    /usr/bin/time -f "%U %S %M" -a -o "$tmp/t" "$bin" "${where[@]}" --timeout 300s "${args[@]}" \
      >/dev/null 2>"$tmp/err" || { echo "$c failed:" >&2; cat "$tmp/err" >&2; }
  done
  t1=$(date +%s%N)
  e1=$(etcd_cpu)
  after=$(cut -d' ' -f1 /proc/loadavg)
  if [ -n "${LOCK:-}" ]; then flock -u 9; exec 9>&-; fi
  r=${REPEAT:-1}
  read -r u s m < <(awk '$1 ~ /^[0-9.]+$/ { u += $1; s += $2; if ($3 > m) m = $3 }
    END { print u, s, m }' "$tmp/t")
  awk -v c="$c" -v u="$u" -v s="$s" -v m="$m" -v e=$((e1 - e0)) -v tk="$tick" -v r="$r" \
    -v w=$((t1 - t0)) -v n="$n" -v la="$before -> $after" 'BEGIN {
      cl = (u + s) / r; et = e / tk / r; w = w / r;
      printf "%-5s %9.2f %9.2f %9.2f %10.1f %9.1f  %s\n", c, cl, et, w / 1e9, m / 1024,
        (cl + et) * 1e6 / n, la }'
done
