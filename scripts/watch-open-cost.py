#!/usr/bin/env python3
"""Open N watch streams on POOL at once through SERVE; time until each has its `synced`.
Prints etcd's range requests, bytes sent and CPU spent between before and after."""
import asyncio, sys, time, urllib.request, os

serve, etcd, pool, n, etcd_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

def metrics():
    text = urllib.request.urlopen(etcd + "/metrics", timeout=60).read().decode()
    want = {"etcd_debugging_mvcc_range_total": 0.0, "etcd_network_client_grpc_sent_bytes_total": 0.0}
    for l in text.splitlines():
        if l.startswith("#"): continue
        name = l.split("{")[0].split(" ")[0]
        if name in want: want[name] += float(l.rsplit(" ", 1)[1])
    return want

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

host, port = serve.replace("http://", "").split(":")
async def one(t0):
    r, w = await asyncio.open_connection(host, int(port))
    w.write(f"GET /v1/pools/{pool}/watch HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await w.drain()
    buf = b""; got = 0
    while True:
        chunk = await r.read(1 << 16)
        if not chunk: return None, got, buf[:300]
        got += len(chunk)
        buf = (buf + chunk)[-4096:] if got > 4096 else buf + chunk
        if b"event: synced" in buf:
            w.close(); return time.monotonic() - t0, got

async def main():
    t0 = time.monotonic()
    res = await asyncio.gather(*[one(t0) for _ in range(n)], return_exceptions=True)
    return res

m0, c0 = metrics(), cpu(etcd_pid)
res = asyncio.run(main())
m1, c1 = metrics(), cpu(etcd_pid)
ok = [r[0] for r in res if isinstance(r, tuple) and r[0] is not None]
bad = [r for r in res if not (isinstance(r, tuple) and r[0] is not None)]
ok.sort()
print(f"streams {n}: synced {len(ok)}, failed {len(bad)} {bad[:2]}")
if ok: print(f"  all synced in {ok[-1]:.2f} s, median {ok[len(ok)//2]:.2f} s, bytes per stream {res[0][1] if isinstance(res[0], tuple) else '?'}")
dr = m1["etcd_debugging_mvcc_range_total"] - m0["etcd_debugging_mvcc_range_total"]
db = m1["etcd_network_client_grpc_sent_bytes_total"] - m0["etcd_network_client_grpc_sent_bytes_total"]
print(f"  etcd range requests {dr:.0f} ({dr/n:.2f} per stream), etcd sent {db/1e6:.2f} MB ({db/n/1e3:.1f} KB per stream), etcd CPU {c1-c0:.2f} s")
