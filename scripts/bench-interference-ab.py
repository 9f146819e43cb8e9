#!/usr/bin/env python3
"""Two or more `idalloc serve` builds (or settings) side by side under the floods of
`bench-interference.py`, their blocks interleaved in one run, so the machine's drift falls on all
of them alike. Usage:
    scripts/bench-interference-ab.py IDALLOC_BIN ETCD_URL PER_BLOCK ROUNDS CONDITIONS NAME:[ENV] ...
CONDITIONS is a comma list of quiet, bulk, pages; each NAME:ENV is one `serve` on its own etcd
prefix (pool `b` preloaded with 20,000 bindings, its own 8 flood processes), ENV a comma list of
VAR=VALUE for it (BIN=PATH runs another binary). Each round times PER_BLOCK one-key acquires and
PER_BLOCK/10 100-key acquires of a `victim` client under every (serve, condition) pair, in a
shuffled order; all other floods parked. Prints p50/p90/p99 per pair with the ratio to the same
serve's quiet blocks, and each flood's pace. Example (the build before a change against this one):
    scripts/bench-interference-ab.py target/release/idalloc http://127.0.0.1:2379 150 8 \
        quiet,bulk,pages before:BIN=/tmp/idalloc-before after:
Run under `flock /work/bench.lock`, with release builds."""
import json, multiprocessing, os, socket, subprocess, sys, tempfile, time, urllib.request, random
import http.client
PARK, BULK, PAGES = 0, 1, 2
class Conn:
    def __init__(self, port, token):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.h = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    def raw(self, method, path, body=None):
        self.c.request(method, path, body=body, headers=self.h)
        r = self.c.getresponse(); data = r.read()
        if r.status != 200: raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return data
def flood_worker(n, port, token, mode, busy, done_calls):
    c = Conn(port, token)
    body = json.dumps({"keys": [f"f-{n}-{j}" for j in range(1000)], "holder": "f"})
    while True:
        m = mode.value
        if m == PARK:
            if busy[n]: c = Conn(port, token)
            busy[n] = 0; time.sleep(0.005); continue
        busy[n] = 1
        if m == BULK:
            c.raw("POST", "/v1/pools/b/acquire", body); c.raw("POST", "/v1/pools/b/release", body)
        else:
            c.raw("GET", "/v1/pools/b/bindings?limit=10000")
        with done_calls.get_lock(): done_calls.value += 1
def pct(xs, p): xs = sorted(xs); return xs[min(len(xs) - 1, int(len(xs) * p))]
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def main():
    binary, etcd = sys.argv[1], sys.argv[2]
    per_block = int(sys.argv[3]); rounds = int(sys.argv[4]); conds = sys.argv[5].split(",")
    variants = [v.split(":", 1) for v in sys.argv[6:]]   # name:VAR=VAL,VAR=VAL
    d = tempfile.mkdtemp()
    names = {"victim": "allocate", "flood": "allocate", "root": "admin"}
    toks = {n: f"tok-{n}-{os.getpid()}-ab-bench-xx" for n in names}
    for n, t in toks.items():
        open(os.path.join(d, f"{n}.token"), "w").write(t); os.chmod(os.path.join(d, f"{n}.token"), 0o600)
    open(os.path.join(d, "tokens"), "w").write("".join(f"{n} {s} file:{n}.token\n" for n, s in names.items()))
    os.chmod(os.path.join(d, "tokens"), 0o600)
    V = {}
    procs = []
    try:
        for name, envs in variants:
            env = dict(os.environ, RUST_LOG="warn,idalloc::audit=off")
            for kv in filter(None, envs.split(",")):
                k, v = kv.split("="); env[k] = v
            port = free_port()
            p = subprocess.Popen([env.pop("BIN", binary), "--store", etcd, "--prefix", f"ab-{name}-{os.getpid()}-{int(time.time())}",
                                  "--timeout", "60s", "serve", "--listen", f"127.0.0.1:{port}",
                                  "--auth-tokens", os.path.join(d, "tokens")], env=env)
            procs.append(p)
            for _ in range(300):
                try: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1); break
                except Exception: time.sleep(0.1)
            root = Conn(port, toks["root"])
            root.raw("POST", "/v1/pools", json.dumps({"name": "b", "min": 1, "max": 100000000}))
            for i in range(20):
                root.raw("POST", "/v1/pools/b/acquire", json.dumps({"keys": [f"load-{i}-{j}" for j in range(1000)], "holder": "load"}))
            mode = multiprocessing.Value("i", PARK); busy = multiprocessing.Array("i", 8); done = multiprocessing.Value("i", 0)
            fl = [multiprocessing.Process(target=flood_worker, daemon=True, args=(n, port, toks["flood"], mode, busy, done)) for n in range(8)]
            for f in fl: f.start()
            procs.extend(fl)
            V[name] = dict(port=port, mode=mode, busy=busy, done=done)
        res = {}
        def block(name, cond, tag):
            v = V[name]; m = {"quiet": PARK, "bulk": BULK, "pages": PAGES}[cond]
            for o in V.values():
                if o is not v or o["mode"].value != m:
                    o["mode"].value = PARK
            for o in V.values():
                while any(o["busy"]): time.sleep(0.01)
            v["mode"].value = m
            if m != PARK:
                while not all(v["busy"]): time.sleep(0.01)
                time.sleep(1)
            victim = Conn(v["port"], toks["victim"])
            c0, st = v["done"].value, time.perf_counter()
            t, tb = [], []
            for i in range(per_block):
                k = json.dumps({"key": f"v-{tag}-{i}", "holder": "v"})
                s = time.perf_counter(); victim.raw("POST", "/v1/pools/b/acquire", k); t.append((time.perf_counter() - s) * 1000)
                victim.raw("POST", "/v1/pools/b/release", k)
            for i in range(max(per_block // 10, 1)):
                body = json.dumps({"keys": [f"w-{tag}-{i}-{j}" for j in range(100)], "holder": "v"})
                s = time.perf_counter(); victim.raw("POST", "/v1/pools/b/acquire", body); tb.append((time.perf_counter() - s) * 1000)
                victim.raw("POST", "/v1/pools/b/release", body)
            secs = time.perf_counter() - st
            r = res.setdefault((name, cond), [[], [], 0, 0.0])
            r[0] += t; r[1] += tb; r[2] += v["done"].value - c0; r[3] += secs
        pairs = [(n, c) for n, _ in variants for c in conds]
        for r in range(rounds):
            random.Random(r).shuffle(pairs)
            for n, c in pairs: block(n, c, f"{r}-{n}-{c}")
            print(f"round {r+1}", file=sys.stderr, flush=True)
        for n, _ in variants:
            q = res[(n, "quiet")]
            for c in conds:
                x = res[(n, c)]
                cells = " ".join(f"{pct(x[0],p):.1f}({pct(x[0],p)/pct(q[0],p):.2f}x)" for p in (.5, .9, .99))
                cellb = " ".join(f"{pct(x[1],p):.1f}({pct(x[1],p)/pct(q[1],p):.2f}x)" for p in (.5, .9, .99))
                print(f"{n:10} {c:6} one: {cells} | 100: {cellb} | flood {x[2]/x[3]:.2f}/s")
    finally:
        for p in procs: p.terminate()
main()
