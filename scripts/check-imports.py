#!/usr/bin/env python3
"""No import cycles between the library's modules (issue 10): builds the graph of `use crate::…` /
`use super::…` lines of crates/idalloc/src, one node per file, and fails on any cycle."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "idalloc", "src")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, "::")
    for suffix in ("::mod",):
        if rel.endswith(suffix):
            rel = rel[: -len(suffix)]
    return "" if rel in ("lib",) else rel


def files():
    for d, _, fs in os.walk(ROOT):
        for f in fs:
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def main():
    mods = {module_of(p): p for p in files()}
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        text = open(p, encoding="utf-8").read()
        # Test modules may use anything.
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)[0]
        parent = m.rsplit("::", 1)[0] if "::" in m else ""
        for path in re.findall(r"\buse\s+((?:crate|super)::[A-Za-z0-9_:]+)", text):
            parts = path.split("::")
            base = parent.split("::") if parent else []
            if parts[0] == "crate":
                segs = parts[1:]
                base = []
            else:
                segs = parts[1:]
            # The longest prefix that names a module file.
            target = None
            for i in range(len(segs), 0, -1):
                cand = "::".join(base + segs[:i])
                if cand in mods:
                    target = cand
                    break
            if target and target != m and not m.endswith("::tests") and not m.startswith("tests"):
                graph[m].add(target)
    # Find cycles (Tarjan's SCC).
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    if sccs:
        for scc in sccs:
            print("import cycle between modules:", ", ".join(scc))
            for v in scc:
                print("  ", v, "->", ", ".join(sorted(graph[v] & set(scc))))
        return 1
    print(f"no import cycles among {len(graph)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
