#!/usr/bin/env python3
"""Another client's acquire latency while one client floods `idalloc serve`. Usage:
    scripts/bench-interference.py IDALLOC_BIN ETCD_URL [--csv PATH] [--rounds R] [TIMED]
    (TIMED one-key acquires per condition, default 300; R rounds, default 10)

One `serve` with tokens on a fresh etcd prefix; pool `b` preloaded with 20,000 bindings (so a
10,000-binding page exists). A `victim` client times sequential one-key acquires of new keys
(each released after), then sequential 100-key acquires (a tenth as many), on its own
connection, under each condition:
  quiet     nobody else;
  bulk      the `flood` client, 8 connections, each acquiring 1,000 new keys then releasing them,
            over and over;
  pages     the `flood` client, 8 connections, each reading `GET /v1/pools/b/bindings?limit=10000`
            over and over;
  watches   the `flood` client holding watch streams at its cap (1,000, the default of
            --max-watches-per-client), one connection each, never reading them, so every change
            the victim makes is queued for 1,000 streams that never drain (a 1,001st is
            refused 429: the cap holds).
Quiet, bulk and pages are interleaved: R rounds, each timing TIMED/R calls under each of the
three (in an order that rotates), so the machine's drift over minutes (2 shared cores, a shared
disk) falls on all three alike; the flood's 8 processes stay up and are parked between its
blocks. Watches come last, in blocks of their own between quiet blocks (opening 1,000 streams
takes a while). A block is timed 2 s after the flood changed (what the flood left behind, its
releases' sweeps and etcd's commits, is done by then), on a new connection whose first call is
not timed. Prints p50/p90/p99 per condition, each with its ratio to the quiet blocks timed
beside it; with --csv, every timed acquire. Run under `flock /work/bench.lock`, with a release
build (`cargo build --release -p idalloc-cli`), against an etcd on a fresh data directory started
as docs/guide/deployment.md says (`--snapshot-count=10000`, rare compactions): a long-lived etcd
with 3.4's defaults holds its last 100,000 big txns in memory and its tails, not the allocator's,
are what a run then measures."""
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

# What the flood's processes do, set by the main process: park (finish the call under way, then
# wait), or call over and over.
PARK, BULK, PAGES = 0, 1, 2

def flood_worker(n, port, token, mode, busy, done_calls):
    """One flooding connection, in a process of its own (the victim's timings must not wait for
    the flood's JSON work under one interpreter lock). `busy[n]` is 1 from its first call after
    `mode` leaves PARK until it has seen PARK again with no call under way."""
    # Bodies made once and answers read but not parsed: the harness's own CPU (2 shared cores)
    # must not be what slows the victim.
    c = Conn(port, token)
    body = json.dumps({"keys": [f"f-{n}-{j}" for j in range(1000)], "holder": "f"})
    while True:
        m = mode.value
        if m == PARK:
            if busy[n]:
                # A new connection for the next calls: this one may be closed as idle while
                # the flood is parked.
                c = Conn(port, token)
            busy[n] = 0
            time.sleep(0.005)
            continue
        busy[n] = 1
        if m == BULK:
            c.raw("POST", "/v1/pools/b/acquire", body)
            c.raw("POST", "/v1/pools/b/release", body)
        else:
            c.raw("GET", "/v1/pools/b/bindings?limit=10000")
        with done_calls.get_lock():
            done_calls.value += 1

def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(len(xs) * p))]

def main():
    binary, etcd = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    csv = None
    if "--csv" in rest:
        i = rest.index("--csv"); csv = rest[i + 1]; del rest[i:i + 2]
    rounds = 10
    if "--rounds" in rest:
        i = rest.index("--rounds"); rounds = int(rest[i + 1]); del rest[i:i + 2]
    timed = int(rest[0]) if rest else 300
    per_block, bulk_per_block = max(timed // rounds, 1), max(timed // 10 // rounds, 1)
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
            # A connection of its own per block: one kept from the block before may have been
            # closed as idle while the flood was set up (the watch streams take a while).
            victim = Conn(port, toks["victim"])
            # Untimed: the connection's setup.
            victim.call("POST", "/v1/pools/b/acquire", {"key": f"v-{tag}-warm", "holder": "v"})
            victim.call("POST", "/v1/pools/b/release", {"key": f"v-{tag}-warm", "holder": "v"})
            t = []
            for i in range(per_block):
                k = f"v-{tag}-{i}"
                s = time.perf_counter()
                victim.call("POST", "/v1/pools/b/acquire", {"key": k, "holder": "v"})
                t.append((time.perf_counter() - s) * 1000)
                victim.call("POST", "/v1/pools/b/release", {"key": k, "holder": "v"})
            return t

        def bulk_victim_run(tag):
            # Another client's many-key work: sequential 100-key acquires.
            victim = Conn(port, toks["victim"])
            t = []
            for i in range(bulk_per_block):
                body = json.dumps({"keys": [f"w-{tag}-{i}-{j}" for j in range(100)], "holder": "v"})
                s = time.perf_counter()
                victim.raw("POST", "/v1/pools/b/acquire", body)
                t.append((time.perf_counter() - s) * 1000)
                victim.raw("POST", "/v1/pools/b/release", body)
            return t

        mode = multiprocessing.Value("i", PARK)
        busy = multiprocessing.Array("i", 8)
        done_calls = multiprocessing.Value("i", 0)
        flood = [multiprocessing.Process(target=flood_worker, daemon=True,
                                         args=(n, port, toks["flood"], mode, busy, done_calls))
                 for n in range(8)]
        for f in flood: f.start()
        counts = {}

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

        timings = {}   # condition -> (one-key ms, 100-key ms, flood calls, seconds)
        pace, flood_since = {}, [None]   # condition -> (flood calls, seconds it ran)
        raw = []
        seq = [0]

        def block(tag, flood_mode=PARK):
            """One block: the flood set to `flood_mode` (running, or parked with nothing under
            way), then the victim's calls timed."""
            if mode.value != flood_mode:
                was = mode.value
                mode.value = PARK
                while any(busy): time.sleep(0.01)
                if was != PARK:
                    # The flood's pace: its calls done from its start to its park (a call can
                    # take longer than a block).
                    tag0, t0, c0 = flood_since[0]
                    calls, secs = pace.get(tag0, (0, 0.0))
                    pace[tag0] = (calls + done_calls.value - c0, secs + time.perf_counter() - t0)
                # The work a flood leaves behind (its releases' sweeps, etcd's backend commits)
                # is over before the next condition is timed.
                time.sleep(2)
            if mode.value != flood_mode and flood_mode != PARK:
                flood_since[0] = (tag, time.perf_counter(), done_calls.value)
            mode.value = flood_mode
            if flood_mode == PARK:
                while any(busy): time.sleep(0.01)
            else:
                while not all(busy): time.sleep(0.01)
                time.sleep(1)   # past the first calls: the flood at its steady pace
            c0, start = done_calls.value, time.perf_counter()
            t, tb = victim_run(f"{tag}-{seq[0]}"), bulk_victim_run(f"{tag}-{seq[0]}")
            secs, calls = time.perf_counter() - start, done_calls.value - c0
            one, many, n, total = timings.get(tag, ([], [], 0, 0.0))
            timings[tag] = (one + t, many + tb, n + calls, total + secs)
            raw.extend((tag, seq[0], "one key", i, ms) for i, ms in enumerate(t))
            raw.extend((tag, seq[0], "100 keys", i, ms) for i, ms in enumerate(tb))
            seq[0] += 1

        conditions = [("quiet", PARK), ("bulk", BULK), ("pages", PAGES)]
        for r in range(rounds):
            for tag, m in conditions[r % 3:] + conditions[:r % 3]:
                block(tag, m)
            print(f"round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
        # Watches: the streams held through `rounds` blocks, between quiet blocks before and after.
        block("quiet-beside-watches")
        watches(); time.sleep(2)
        for _ in range(rounds):
            block("watches")
        counts["subscribers at the end"] = subscribers()
        for s in held: s.close()
        held.clear()
        time.sleep(2)
        block("quiet-beside-watches")
        print(f"watches done ({counts})", file=sys.stderr, flush=True)

        def line(tag, base):
            one, many, calls, secs = timings[tag]
            q1, qm = timings[base][0], timings[base][1]
            cells = []
            for xs, qs in ((one, q1), (many, qm)):
                for p in (.5, .9, .99):
                    v, q = pct(xs, p), pct(qs, p)
                    cells.append(f"{v:.1f} ms" + ("" if tag == base else f" ({v / q:.2f}×)"))
            fc, fs = pace.get(tag, (0, 1.0))
            flood = {"bulk": f"{fc / fs:.2f} calls of 1,000 keys a second",
                     "pages": f"{fc / fs:.2f} pages a second",
                     "watches": f"{counts.get('subscribers at the end')} of 1,000 streams held "
                                f"at the end; 1,001st: {counts.get('1001st watch')}"}.get(tag, "-")
            return f"| {tag} | " + " | ".join(cells) + f" | {flood} |"

        print(f"load {open('/proc/loadavg').read().split()[:3]}; per condition {len(timings['quiet'][0])} "
              f"timed one-key acquires and {len(timings['quiet'][1])} of 100 keys, in {rounds} "
              f"interleaved rounds")
        print("| run | one key p50 | p90 | p99 | 100 keys p50 | p90 | p99 | flood during the run |")
        print("|---|---|---|---|---|---|---|---|")
        for tag in ("quiet", "bulk", "pages"):
            print(line(tag, "quiet"))
        print(line("quiet-beside-watches", "quiet-beside-watches"))
        print(line("watches", "quiet-beside-watches"))
        for tag in ("bulk", "pages"):
            # The spread: each round's p99 against the quiet block of the same round.
            per = []
            for r in range(rounds):
                def of(cond):
                    i = r * 3 + [c for c, _ in conditions[r % 3:] + conditions[:r % 3]].index(cond)
                    return [ms for t, b, call, _, ms in raw if b == i and call == "one key"]
                per.append(pct(of(tag), .99) / pct(of("quiet"), .99))
            print(f"{tag}: one-key p99 / the same round's quiet p99, per round: "
                  + " ".join(f"{x:.2f}" for x in per), file=sys.stderr)
        if csv:
            with open(csv, "w") as f:
                f.write("run,block,call,i,acquire_ms\n")
                f.writelines(f"{tag},{b},{call},{i},{ms:.3f}\n" for tag, b, call, i, ms in raw)
    finally:
        for s in held: s.close()
        for f in locals().get("flood", []): f.terminate()
        proc.terminate(); proc.wait()

main()
