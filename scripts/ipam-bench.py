#!/usr/bin/env python3
"""IPAM plugin benchmark: ADD+DEL latency per plugin exec (p50/p99) and the throughput of 1,000
ADDs from 10 simulated nodes, for idalloc-ipam through `idalloc serve`, idalloc-ipam directly on
etcd, and host-local (the lower bound of a per-node allocator), in one run on one machine.

Usage (docs/benchmarks/ipam.md):
    flock /work/bench.lock python3 scripts/ipam-bench.py [--bin-dir target/release] [--n 200]

Needs etcd on PATH and /usr/lib/cni/host-local. Starts its own single-member etcd and one
`idalloc serve` on free loopback ports, and stops them (by PID) at the end.
"""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def execute(plugin, cmd, cid, conf, cni_path):
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": cmd, "CNI_CONTAINERID": cid,
           "CNI_NETNS": "/var/run/netns/bench", "CNI_IFNAME": "eth0", "CNI_PATH": cni_path}
    t = time.perf_counter()
    r = subprocess.run([plugin], input=json.dumps(conf).encode(), env=env, capture_output=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{plugin} {cmd} {cid} failed: {r.stdout!r} {r.stderr!r}")
    return dt


def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default="target/release")
    ap.add_argument("--n", type=int, default=200, help="ADD+DEL pairs per contender")
    ap.add_argument("--throughput", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=10)
    a = ap.parse_args()
    ipam = os.path.abspath(os.path.join(a.bin_dir, "idalloc-ipam"))
    cli = os.path.abspath(os.path.join(a.bin_dir, "idalloc"))
    tmp = tempfile.mkdtemp(prefix="ipam-bench-")
    procs = []
    try:
        cport, pport = free_port(), free_port()
        etcd = subprocess.Popen(
            ["etcd", "--data-dir", f"{tmp}/etcd", "--listen-client-urls", f"http://127.0.0.1:{cport}",
             "--advertise-client-urls", f"http://127.0.0.1:{cport}",
             "--listen-peer-urls", f"http://127.0.0.1:{pport}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
             "--initial-cluster", f"default=http://127.0.0.1:{pport}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(etcd)
        store = f"http://127.0.0.1:{cport}"
        for _ in range(100):
            if subprocess.run(["etcdctl", "--endpoints", store, "endpoint", "health"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        serve = subprocess.Popen([cli, "--store", store, "serve", "--listen", "127.0.0.1:0"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 env={**os.environ, "RUST_LOG": "warn"})
        procs.append(serve)
        line = serve.stdout.readline().decode()
        addr = line.strip().split()[-1]
        cni_path = "/usr/lib/cni"
        subnet = "10.60.0.0/16"
        contenders = {
            "idalloc-ipam via serve": (ipam, {"type": "idalloc-ipam", "pool": "bench-serve",
                "subnet": subnet, "servers": [f"http://{addr}"]}),
            "idalloc-ipam on etcd": (ipam, {"type": "idalloc-ipam", "pool": "bench-etcd",
                "subnet": subnet, "store": f"etcd://127.0.0.1:{cport}"}),
            "host-local": ("/usr/lib/cni/host-local", {"type": "host-local", "subnet": subnet,
                "dataDir": f"{tmp}/host-local"}),
        }
        print(f"# {a.n} ADD+DEL pairs, one exec at a time; then {a.throughput} ADDs from "
              f"{a.nodes} nodes (one exec at a time per node)")
        print(f"| plugin | ADD p50 | ADD p99 | DEL p50 | DEL p99 | {a.throughput} ADDs, {a.nodes} nodes |")
        print("|---|---|---|---|---|---|")
        for name, (plugin, ipam_conf) in contenders.items():
            adds, dels = [], []
            for i in range(a.n):
                conf = {"cniVersion": "1.0.0", "name": "bench-" + name.split()[-1], "ipam": ipam_conf}
                adds.append(execute(plugin, "ADD", f"lat{i}", conf, cni_path))
                dels.append(execute(plugin, "DEL", f"lat{i}", conf, cni_path))
            per_node = a.throughput // a.nodes

            def node(n):
                c = dict(ipam_conf)
                if plugin == ipam:
                    c["node"] = f"node-{n}"
                else:  # host-local is per node: a directory of its own
                    c["dataDir"] = f"{tmp}/host-local-{n}"
                    c["subnet"] = f"10.{70 + n}.0.0/16"
                conf = {"cniVersion": "1.0.0", "name": "tput-" + name.split()[-1], "ipam": c}
                for i in range(per_node):
                    execute(plugin, "ADD", f"n{n}-c{i}", conf, cni_path)

            t = time.perf_counter()
            with ThreadPoolExecutor(a.nodes) as ex:
                list(ex.map(node, range(a.nodes)))
            wall = time.perf_counter() - t
            ms = lambda x: f"{x * 1000:.1f} ms"
            print(f"| {name} | {ms(pct(adds, 50))} | {ms(pct(adds, 99))} | {ms(pct(dels, 50))} | "
                  f"{ms(pct(dels, 99))} | {wall:.2f} s ({per_node * a.nodes / wall:.0f} ADD/s) |")
    finally:
        for p in reversed(procs):
            p.kill(); p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
