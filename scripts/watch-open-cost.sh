#!/bin/bash
# usage (from the repository top): scripts/watch-open-cost.sh ABSOLUTE_PATH_OF_IDALLOC BINDINGS N...   (one etcd, one serve replica of BIN, N streams at once)
set -e
HERE=$(cd "$(dirname "$0")" && pwd); mkdir -p target/tmp-bench; cd target/tmp-bench
BIN=$1; B=$2; shift 2
D=$(mktemp -d -p . etcd-XXXX)
P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
Q=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
etcd --data-dir $D --listen-client-urls http://127.0.0.1:$P --advertise-client-urls http://127.0.0.1:$P \
  --listen-peer-urls http://127.0.0.1:$Q --initial-advertise-peer-urls http://127.0.0.1:$Q \
  --initial-cluster default=http://127.0.0.1:$Q > $D.log 2>&1 &
EPID=$!
sleep 3
../release/examples/fill_pool --endpoint http://127.0.0.1:$P --pool p --bindings $B --max 16777215 --per-txn 40 > $D.fill 2>&1
RUST_LOG=warn,idalloc::audit=off $BIN --endpoints http://127.0.0.1:$P --prefix idalloc --timeout 10s serve --listen 127.0.0.1:0 \
  --sweep-interval 1h --max-requests 100000 --max-requests-per-client 100000 > $D.serve 2>&1 &
SPID=$!
for i in $(seq 1 50); do grep -q "listening on" $D.serve && break; sleep 0.2; done
ADDR=$(grep -o "listening on [0-9.:]*" $D.serve | head -1 | cut -d' ' -f3)
echo "bin $BIN, $B bindings, serve $ADDR, etcd pid $EPID; $(uptime)"
python3 "$HERE/watch-open-cost.py" http://$ADDR http://127.0.0.1:$P p 1 $EPID | sed 's/^/warm-up: /'
for N in "$@"; do python3 "$HERE/watch-open-cost.py" http://$ADDR http://127.0.0.1:$P p $N $EPID; echo "  serve CPU so far $(awk '{print ($14+$15)/100}' /proc/$SPID/stat) s; $(uptime)"; done
kill $SPID $EPID; wait $EPID 2>/dev/null || true
rm -rf $D
