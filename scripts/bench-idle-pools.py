#!/usr/bin/env python3
"""Resident memory of `idalloc serve` per idle pool. Usage:
    scripts/bench-idle-pools.py IDALLOC_BIN ETCD_URL [POOLS] (default 10000)

Starts two `serve` processes on one fresh etcd prefix: A, through which every pool is created and
then read once (`GET /v1/pools/NAME`, so A holds an open handle of each), and B, which only shares
the store. Each pool gets one binding, then nothing happens to it. Prints both processes' VmRSS
before the pools, after, and the difference per pool. Run under `flock /work/bench.lock` with a
release build (`cargo build --release -p idalloc-cli`)."""
import json, os, socket, subprocess, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def call(port, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

def start(binary, etcd, prefix):
    port = free_port()
    env = dict(os.environ, RUST_LOG="warn,idalloc::audit=off")
    p = subprocess.Popen([binary, "--store", etcd, "--prefix", prefix, "--timeout", "60s", "serve",
                          "--listen", f"127.0.0.1:{port}"], env=env)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1); break
        except Exception:
            time.sleep(0.1)
    return p, port

def main():
    binary, etcd = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
    prefix = f"bench-idle-{os.getpid()}-{int(time.time())}"
    (a, pa), (b, pb) = start(binary, etcd, prefix), start(binary, etcd, prefix)
    try:
        call(pa, "POST", "/v1/pools", {"name": "warm", "min": 1, "max": 1000})
        call(pa, "POST", "/v1/pools/warm/acquire", {"key": "k", "holder": "h"})
        call(pa, "GET", "/v1/pools/warm")
        time.sleep(2)
        before = rss_kib(a.pid), rss_kib(b.pid)
        t0 = time.time()

        def one(i):
            name = f"p{i}"
            call(pa, "POST", "/v1/pools", {"name": name, "min": 1, "max": 1000})
            call(pa, "POST", f"/v1/pools/{name}/acquire", {"key": "k", "holder": "h"})
            call(pa, "GET", f"/v1/pools/{name}")

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(one, range(n)))
        made = time.time() - t0
        time.sleep(10)
        after = rss_kib(a.pid), rss_kib(b.pid)
        print(f"pools: {n:,} (made in {made:.0f} s); load {open('/proc/loadavg').read().split()[:3]}")
        for who, x, y in (("A (serves them)", before[0], after[0]), ("B (shares the store)", before[1], after[1])):
            print(f"{who}: VmRSS {x / 1024:.1f} MiB -> {y / 1024:.1f} MiB, {(y - x) * 1024 / n / 1000:.1f} KB per pool")
    finally:
        for p in (a, b):
            p.terminate(); p.wait()

main()
