#!/usr/bin/env python3
"""Quota-limited (`refs=`) against unlimited acquire latency of `idalloc serve` on etcd, at growing
pool sizes. Usage:
    scripts/bench-quota.py IDALLOC_BIN ETCD_URL [--csv PATH] [SIZES...] (default 1000 100000)

Starts one `serve` on a fresh prefix, preloads the pool with durable references of another client
(1,000 keys per request, 4 requests at once), then times sequential single-key acquires of new keys, alternating an
unlimited client and one with `refs=` (each holds the same number of references), and prints
p50/p99 per size; with --csv, every timed acquire (size, client, i, ms) too. Run it under
`flock /work/bench.lock`."""
import json, os, socket, subprocess, sys, tempfile, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def call(port, token, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {token}",
                                          "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")

def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(len(xs) * p))]

def main():
    binary, etcd = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    csv = None
    if "--csv" in rest:
        i = rest.index("--csv"); csv = rest[i + 1]; del rest[i:i + 2]
    sizes = [int(x) for x in rest] or [1000, 100000]
    raw = []
    d = tempfile.mkdtemp()
    toks = {n: f"tok-{n}-{os.getpid()}-bench-quota" for n in ["lim", "free", "load", "root"]}
    lines = ["lim allocate file:lim.token refs=10000000", "free allocate file:free.token",
             "load allocate file:load.token", "root admin file:root.token"]
    for n, t in toks.items():
        with open(os.path.join(d, f"{n}.token"), "w") as f: f.write(t)
        os.chmod(os.path.join(d, f"{n}.token"), 0o600)
    with open(os.path.join(d, "tokens"), "w") as f: f.write("\n".join(lines) + "\n")
    os.chmod(os.path.join(d, "tokens"), 0o600)
    port = free_port()
    prefix = f"bench-quota-{os.getpid()}-{int(time.time())}"
    env = dict(os.environ, RUST_LOG="warn,idalloc::audit=off")
    proc = subprocess.Popen([binary, "--store", etcd, "--prefix", prefix, "--timeout", "30s", "serve",
                             "--listen", f"127.0.0.1:{port}", "--auth-tokens", os.path.join(d, "tokens")],
                            env=env)
    try:
        for _ in range(300):
            try: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1); break
            except Exception: time.sleep(0.1)
        call(port, toks["root"], "POST", "/v1/pools", {"name": "b", "min": 1, "max": 100000000})
        loaded, n_timed = 0, 300
        print(f"| references in the pool | unlimited p50 | unlimited p99 | `refs=` p50 | `refs=` p99 |")
        print("|---|---|---|---|---|")
        for size in sizes:
            t0 = time.time()
            starts = list(range(loaded, size, 1000))

            def load(start):
                k = min(1000, size - start)
                call(port, toks["load"], "POST", "/v1/pools/b/acquire",
                     {"keys": [f"load-{start + i}" for i in range(k)], "holder": "h"})

            with ThreadPoolExecutor(4) as ex:
                list(ex.map(load, starts))
            loaded = size
            print(f"preloaded to {size:,} in {time.time() - t0:.0f} s; load "
                  f"{open('/proc/loadavg').read().split()[:3]}", file=sys.stderr, flush=True)
            t = {"free": [], "lim": []}
            for i in range(n_timed):
                for who in ("free", "lim"):
                    s = time.perf_counter()
                    call(port, toks[who], "POST", "/v1/pools/b/acquire",
                         {"key": f"{who}-{size}-{i}", "holder": "h"})
                    t[who].append((time.perf_counter() - s) * 1000)
                    raw.append((size, who, i, t[who][-1]))
            f, l = t["free"], t["lim"]
            print(f"| {size:,} | {pct(f, .5):.1f} ms | {pct(f, .99):.1f} ms | {pct(l, .5):.1f} ms | {pct(l, .99):.1f} ms |", flush=True)
        if csv:
            with open(csv, "w") as f:
                f.write("references,client,i,acquire_ms\n")
                f.writelines(f"{n},{'refs' if w == 'lim' else 'unlimited'},{i},{ms:.3f}\n"
                             for n, w, i, ms in raw)
    finally:
        proc.terminate(); proc.wait()

main()
