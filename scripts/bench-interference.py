#!/usr/bin/env python3
"""Another client's acquire latency while one client floods `idalloc serve`. Usage:
    scripts/bench-interference.py IDALLOC_BIN ETCD_URL [--csv PATH] [TIMED] (default 300 a run)

One `serve` with tokens on a fresh etcd prefix; pool `b` preloaded with 20,000 bindings (so a
10,000-binding page exists). A `victim` client times TIMED sequential one-key acquires of new keys
(each released after), then TIMED/10 sequential 100-key acquires, on its own connection, in
five runs:
  quiet     nobody else;
  bulk      the `flood` client, 8 connections, each acquiring 1,000 new keys then releasing them,
            over and over;
  pages     the `flood` client, 8 connections, each reading `GET /v1/pools/b/bindings?limit=10000`
            over and over;
  watches   the `flood` client holding watch streams at its cap (1,000, the default of
            --max-watches-per-client), one connection each, never reading them, so every change
            the victim makes is queued for 1,000 streams that never drain (a 1,001st is
            refused 429: the cap holds);
  quiet-after  nobody else again (the streams closed): the machine's drift over the runs.
Prints p50/p99 per run and the ratio to the quiet run; with --csv, every timed acquire. Run under `flock /work/bench.lock`, with a
release build (`cargo build --release -p idalloc-cli`)."""
import json, multiprocessing, os, socket, subprocess, sys, tempfile, threading, time, urllib.request
import http.client

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

class Conn:
    """One keep-alive HTTP/1.1 connection of one client."""
    def __init__(self, port, token):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.h = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    def call(self, method, path, body=None):
        self.c.request(method, path, body=None if body is None else json.dumps(body), headers=self.h)
        r = self.c.getresponse(); data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data or b"null")
    def raw(self, method, path, body=None):
        """`call` without parsing the answer (a body already encoded)."""
        self.c.request(method, path, body=body, headers=self.h)
        r = self.c.getresponse(); data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")

def flood_worker(kind, n, port, token, stop, done_calls):
    """One flooding connection, in a process of its own (the victim's timings must not wait for
    the flood's JSON work under one interpreter lock)."""
    # Bodies made once and answers read but not parsed: the harness's own CPU (2 shared cores)
    # must not be what slows the victim.
    c, r = Conn(port, token), 0
    body = json.dumps({"keys": [f"f-{n}-{j}" for j in range(1000)], "holder": "f"})
    while not stop.is_set():
        if kind == "bulk":
            c.raw("POST", "/v1/pools/b/acquire", body)
            c.raw("POST", "/v1/pools/b/release", body)
        else:
            c.raw("GET", "/v1/pools/b/bindings?limit=10000")
        with done_calls.get_lock():
            done_calls.value += 1
        r += 1

def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(len(xs) * p))]

def main():
    binary, etcd = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    csv = None
    if "--csv" in rest:
        i = rest.index("--csv"); csv = rest[i + 1]; del rest[i:i + 2]
    timed = int(rest[0]) if rest else 300
    d = tempfile.mkdtemp()
    names = {"victim": "allocate", "flood": "allocate", "root": "admin"}
    toks = {n: f"tok-{n}-{os.getpid()}-bench-interference" for n in names}
    for n, t in toks.items():
        with open(os.path.join(d, f"{n}.token"), "w") as f: f.write(t)
        os.chmod(os.path.join(d, f"{n}.token"), 0o600)
    with open(os.path.join(d, "tokens"), "w") as f:
        f.write("".join(f"{n} {s} file:{n}.token\n" for n, s in names.items()))
    os.chmod(os.path.join(d, "tokens"), 0o600)
    port = free_port()
    prefix = f"bench-interference-{os.getpid()}-{int(time.time())}"
    env = dict(os.environ, RUST_LOG="warn,idalloc::audit=off")
    proc = subprocess.Popen([binary, "--store", etcd, "--prefix", prefix, "--timeout", "60s", "serve",
                             "--listen", f"127.0.0.1:{port}", "--auth-tokens", os.path.join(d, "tokens")],
                            env=env)
    held = []
    try:
        for _ in range(300):
            try: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1); break
            except Exception: time.sleep(0.1)
        root = Conn(port, toks["root"])
        root.call("POST", "/v1/pools", {"name": "b", "min": 1, "max": 100000000})
        for i in range(20):
            root.call("POST", "/v1/pools/b/acquire",
                      {"keys": [f"load-{i}-{j}" for j in range(1000)], "holder": "load"})
        def victim_run(tag):
            # A connection of its own per run: one kept from the run before may have been
            # closed as idle while the flood was set up (the watch streams take a while).
            victim = Conn(port, toks["victim"])
            t = []
            for i in range(timed):
                k = f"v-{tag}-{i}"
                s = time.perf_counter()
                victim.call("POST", "/v1/pools/b/acquire", {"key": k, "holder": "v"})
                t.append((time.perf_counter() - s) * 1000)
                victim.call("POST", "/v1/pools/b/release", {"key": k, "holder": "v"})
            return t

        def bulk_victim_run(tag):
            # Another client's many-key work: TIMED/10 sequential 100-key acquires.
            victim = Conn(port, toks["victim"])
            t = []
            for i in range(max(timed // 10, 10)):
                body = json.dumps({"keys": [f"w-{tag}-{i}-{j}" for j in range(100)], "holder": "v"})
                s = time.perf_counter()
                victim.raw("POST", "/v1/pools/b/acquire", body)
                t.append((time.perf_counter() - s) * 1000)
                victim.raw("POST", "/v1/pools/b/release", body)
            return t

        stop = multiprocessing.Event()
        counts = {"bulk": 0, "pages": 0}
        done_calls = multiprocessing.Value("i", 0)

        def subscribers():
            metrics = Conn(port, toks["root"])
            metrics.c.request("GET", "/metrics", headers=metrics.h)
            body = metrics.c.getresponse().read().decode()
            for line in body.splitlines():
                if line.startswith('idalloc_watch_subscribers{pool="b"}'):
                    return int(float(line.split()[-1]))
            return 0

        def watches():
            # One after another (a stream being set up holds a request slot: 128 at once would
            # be refused by --max-requests-per-client); each answers 200 (its head arrives),
            # nothing is read after that.
            # A head that does not come within 30 s is counted, not waited for (three: stop opening).
            answers = {}
            for n in range(1000):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(30)
                s.connect(("127.0.0.1", port))
                s.sendall(f"GET /v1/pools/b/watch HTTP/1.1\r\nhost: x\r\n"
                          f"authorization: Bearer {toks['flood']}\r\n\r\n".encode())
                held.append(s)
                try:
                    head = s.recv(12).decode(errors="replace")[9:] or "closed"
                except socket.timeout:
                    head = "no head in 30 s"
                answers[head] = answers.get(head, 0) + 1
                if answers.get("no head in 30 s", 0) >= 3:
                    break
            counts["watch answers"] = answers
            # One more: refused 429 while all 1,000 hold their slots; a stream the service ended
            # (it lagged: its client reads nothing) has freed its slot.
            extra = socket.create_connection(("127.0.0.1", port))
            extra.sendall(f"GET /v1/pools/b/watch HTTP/1.1\r\nhost: x\r\n"
                          f"authorization: Bearer {toks['flood']}\r\n\r\n".encode())
            extra.settimeout(30)
            try:
                counts["1001st watch"] = extra.recv(12).decode(errors="replace")[9:] or "closed"
            except socket.timeout:
                counts["1001st watch"] = "no head in 30 s"
            held.append(extra)
            counts["subscribers at the start"] = subscribers()

        rows, raw = [], []
        runs = (("quiet", None), ("bulk", "bulk"), ("pages", "pages"), ("watches", None),
                ("quiet-after", None))
        for tag, kind in runs:
            stop.clear()
            threads = []
            if kind:
                with done_calls.get_lock():
                    done_calls.value = 0
                threads = [multiprocessing.Process(target=flood_worker, daemon=True,
                                                   args=(kind, n, port, toks["flood"], stop, done_calls))
                           for n in range(8)]
                for th in threads: th.start()
                time.sleep(2)
            if tag == "watches":
                watches(); time.sleep(2)
            before = dict(counts)
            start, c0 = time.perf_counter(), done_calls.value
            t = victim_run(tag)
            tb = bulk_victim_run(tag)
            secs, c1 = time.perf_counter() - start, done_calls.value
            stop.set()
            for th in threads: th.join()
            if kind:
                counts[kind] += done_calls.value
            if tag == "watches":
                counts["subscribers at the end"] = subscribers()
                for s in held: s.close()
                held.clear()
                time.sleep(2)
            done = {k: (v - before[k] if isinstance(v, int) and k in ("bulk", "pages") else v)
                    for k, v in counts.items() if v != before.get(k)}
            if kind:
                done[f"{kind} calls a second"] = round((c1 - c0) / secs, 1)
            rows.append((tag, pct(t, .5), pct(t, .99), pct(tb, .5), pct(tb, .99), done))
            raw.extend((tag, "one key", i, ms) for i, ms in enumerate(t))
            raw.extend((tag, "100 keys", i, ms) for i, ms in enumerate(tb))
            print(f"{tag}: done ({counts})", file=sys.stderr, flush=True)
        q99, qb99 = rows[0][2], rows[0][4]
        print(f"load {open('/proc/loadavg').read().split()[:3]}; {timed} timed one-key acquires "
              f"and {max(timed // 10, 10)} of 100 keys a run")
        print("| run | one key p50 | one key p99 | / quiet | 100 keys p50 | 100 keys p99 | / quiet "
              "| flood during the run |")
        print("|---|---|---|---|---|---|---|---|")
        for tag, p50, p99, b50, b99, done in rows:
            flood = ", ".join(f"{v} {k}" for k, v in done.items()) or "-"
            print(f"| {tag} | {p50:.1f} ms | {p99:.1f} ms | {p99 / q99:.2f}× | {b50:.1f} ms "
                  f"| {b99:.1f} ms | {b99 / qb99:.2f}× | {flood} |")
        if csv:
            with open(csv, "w") as f:
                f.write("run,call,i,acquire_ms\n")
                f.writelines(f"{tag},{call},{i},{ms:.3f}\n" for tag, call, i, ms in raw)
    finally:
        for s in held: s.close()
        proc.terminate(); proc.wait()

main()
