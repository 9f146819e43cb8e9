#!/bin/bash
# Peak resident memory of `acquire --from` (new keys), `list`, `check` and `get` at given pool
# sizes (docs/scale.md, "`--from` memory"). Run from the repository root after
# `cargo build --release -p idalloc-cli`; data goes to target/tmp-bench/ (delete it after).
#   scripts/scale-memory.sh STORE_URL TAG SIZES...    e.g. etcd://127.0.0.1:2379 etcd 10000 100000
# Prints CSV rows: what,store,bindings,peak_kib,seconds (plus the load average as a comment).
# PFX sets the pools' name prefix (default m: pools m10000, m100000, ...), each filled from empty.
set -u
BIN=${BIN:-$PWD/target/release/idalloc}
STORE=$1; TAG=$2; shift 2
mkdir -p target/tmp-bench && cd target/tmp-bench || exit 1
for n in "$@"; do
  [ -f keys$n ] || seq -f "key-%035g" 1 "$n" > keys$n
  p=${PFX:-m}$n
  $BIN --store "$STORE" --timeout 300s pool create "$p" --range 1-16777215 >/dev/null 2>&1
  for cmd in "acquire $p --holder h --from keys$n" "list $p" "check $p" "get $p key-00000000000000000000000000000000001"; do
    what=${cmd%% *}
    [ "$what" = acquire ] && what="acquire --from"
    # shellcheck disable=SC2086
    /usr/bin/time -o t.out -f "%M %e" $BIN --store "$STORE" --timeout 600s $cmd > /dev/null 2> err.out \
      || echo "FAILED $cmd: $(tail -2 err.out)" >&2
    read -r kb secs < <(tail -1 t.out)
    echo "$what,$TAG,$n,$kb,$secs  # load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
