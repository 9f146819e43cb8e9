#!/usr/bin/env python3
"""No import cycles between the library's files.

One node per source file of crates/idalloc/src (`allocator.rs` and each `allocator/*.rs` child are
separate nodes). An edge A -> B means: the code of A names something that is *defined* in B. The
edges are the ones a reader sees:

* every `use` / `pub use` / `pub(crate) use` declaration, grouped trees included
  (`use crate::{a, b::{c, self}}`), with `crate::`, `super::`, `self::` or a child module first;
* every path in expressions and types (`crate::x::y(…)`, `super::X::new()`, `child::f()`), and
  paths that start with a name brought in by a `use` of this file (`metrics::swept(…)` after
  `use crate::metrics`).

A path is resolved the way rustc does it, module by module from the module tree the `mod`
declarations build (`mod x;` in `a.rs` is `a/x.rs` or `a/x/mod.rs`): while the next segment is a
module it descends; when it is a name the module imports (a re-export like
`pub(crate) use registry::Inner`), it follows the import to where the item is defined. So a child
that writes `super::Inner` depends on `registry.rs`, the file that defines `Inner`, not on the
facade that re-exports it; the facade's own `pub use` line is its edge to `registry.rs`. Walking
through a module on the way (`crate::allocator::pool_state::PoolState` passes `allocator.rs`) is
not an edge: only the file that defines the named item is.

Comments, string literals and test code (`#[cfg(test)]` items and `#[cfg(test)] mod x;` files) are
ignored: tests may use anything.

`--self-test` runs the checker on small synthetic trees (with and without cycles) and fails unless
it finds exactly the cycles planted there, so the check is proven able to fail.
"""
import os
import re
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "idalloc", "src")

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# --- reading a file ---------------------------------------------------------------------------------


def strip_comments_and_literals(text):
    """Blanks out comments, string literals and char literals (keeping newlines), so paths inside
    them are not taken for code. Lifetimes (`'a`) are kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 260]) if c in "rb" and (i == 0 or not re.match(r"\w", text[i - 1])) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "'":
            m = re.match(r"'(?:\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'\n])'", text[i:i + 16])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def block_end(text, i):
    """Index just past the item starting at `i`: its `;` or its matching `}`."""
    depth = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


ATTR = re.compile(r"#\[cfg\(test\)\]")


def remove_test_items(text):
    """Removes every `#[cfg(test)]` item; returns (text, names of `#[cfg(test)] mod x;` files)."""
    test_mods = set()
    while True:
        m = ATTR.search(text)
        if not m:
            return text, test_mods
        j = m.end()
        # Further attributes of the same item.
        while True:
            a = re.match(r"\s*#\[", text[j:])
            if not a:
                break
            depth, k = 0, j + a.end() - 1
            while k < len(text):
                if text[k] == "[":
                    depth += 1
                elif text[k] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            j = k + 1
        d = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text[j:])
        if d:
            test_mods.add(d.group(1))
        end = block_end(text, j)
        text = text[: m.start()] + "\n" * text.count("\n", m.start(), end) + text[end:]


# --- use trees ----------------------------------------------------------------------------------------


def parse_use_tree(src):
    """`crate::{a, b::{self, c as d}, e::*}` -> [(path segments, bound name or None for `*`)]."""
    toks = re.findall(r"::|[{},*]|" + IDENT, src)
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        t = peek()
        pos[0] += 1
        return t

    def tree(prefix):
        out = []
        if peek() == "::":  # a leading `::` (extern path)
            take()
        if peek() == "{":
            take()
            while peek() not in (None, "}"):
                out += tree(prefix)
                if peek() == ",":
                    take()
            take()
            return out
        if peek() == "*":
            take()
            return [(prefix, None)]
        name = take()
        if name is None:
            return out
        if peek() == "::":
            take()
            if name == "self" and prefix:
                return tree(prefix)
            return tree(prefix + [name])
        if name == "self":
            path, bound = prefix, prefix[-1] if prefix else None
        else:
            path, bound = prefix + [name], name
        if peek() == "as":
            take()
            bound = take()
        return [(path, bound)]

    res = []
    while peek() is not None:
        res += tree([])
        if peek() == ",":
            take()
        else:
            break
    return res


USE = re.compile(r"\b(?:pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]*);")


# --- the module tree ----------------------------------------------------------------------------------


class Module:
    def __init__(self, path, file):
        self.path = path  # ("allocator", "registry")
        self.file = file
        self.children = {}  # name -> Module
        self.imports = {}  # bound name -> absolute segments (or None when unresolvable)
        self.globs = []  # absolute segments of `use x::*`
        self.refs = []  # raw (segments, relative to this module) to resolve into edges
        self.code = ""


def child_file(parent_file, is_dir_owner, name):
    base = os.path.dirname(parent_file) if is_dir_owner else parent_file[:-3]
    for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def load(root):
    """Builds the module tree from `lib.rs` by following `mod x;` declarations."""
    modules = {}
    top = Module((), os.path.join(root, "lib.rs"))
    todo = [top]
    while todo:
        mod = todo.pop()
        modules[mod.path] = mod
        raw = open(mod.file, encoding="utf-8").read()
        code, test_mods = remove_test_items(strip_comments_and_literals(raw))
        mod.code = code
        owner = os.path.basename(mod.file) in ("lib.rs", "mod.rs")
        for name in re.findall(r"\bmod\s+(" + IDENT + r")\s*;", code):
            if name in test_mods:
                continue
            f = child_file(mod.file, owner, name)
            if f is None:
                continue
            child = Module(mod.path + (name,), f)
            mod.children[name] = child
            todo.append(child)
    return modules


def absolute(mod, segs):
    """Turns a path as written in `mod` into segments from the crate root, or None if it names
    something outside the crate (std, other crates)."""
    if not segs:
        return None
    here = list(mod.path)
    i = 0
    if segs[0] == "crate":
        here, i = [], 1
    else:
        while i < len(segs) and segs[i] in ("self", "super"):
            if segs[i] == "super":
                if not here:
                    return None
                here.pop()
            i += 1
        if i == 0:
            first = segs[0]
            if first in mod.children:
                pass
            elif first in mod.imports and mod.imports[first] is not None:
                return mod.imports[first] + segs[1:]
            else:
                return None
    return here + segs[i:]


def collect(modules):
    for mod in modules.values():
        spans = []
        for m in USE.finditer(mod.code):
            spans.append((m.start(), m.end()))
            for segs, bound in parse_use_tree(m.group(1)):
                mod.refs.append(segs)
                if bound is None:
                    mod.globs.append(segs)
                elif bound != "_":
                    mod.imports[bound] = segs  # made absolute below
        # Paths outside `use` declarations.
        rest = list(mod.code)
        for a, b in spans:
            rest[a:b] = " " * (b - a)
        rest = "".join(rest)
        for m in re.finditer(r"(?<![\w:])((?:" + IDENT + r")(?:\s*::\s*" + IDENT + r")+)", rest):
            segs = re.split(r"\s*::\s*", m.group(1))
            mod.refs.append(segs)
    # Imports relative to their module, made absolute (children and `self`/`super` first, so
    # a later import may start with the name of an earlier one).
    for mod in modules.values():
        raw = dict(mod.imports)
        mod.imports = {}
        for _ in range(3):
            for name, segs in raw.items():
                mod.imports[name] = absolute(mod, segs)
        mod.globs = [g for g in (absolute(mod, s) for s in mod.globs) if g is not None]


def resolve(modules, segs, depth=0):
    """The module (path tuple) that defines what the absolute path `segs` names."""
    cur = modules[()]
    i = 0
    while i < len(segs):
        s = segs[i]
        if s in cur.children:
            cur = cur.children[s]
            i += 1
            continue
        if s in cur.imports and cur.imports[s] is not None and depth < 20:
            return resolve(modules, cur.imports[s] + segs[i + 1:], depth + 1)
        return cur.path
    return cur.path


def build_graph(root):
    modules = load(root)
    collect(modules)
    graph = {m.file: set() for m in modules.values()}
    why = {}
    for mod in modules.values():
        for segs in mod.refs:
            a = absolute(mod, segs)
            if a is None:
                continue
            target = modules[resolve(modules, a)].file
            if target != mod.file:
                graph[mod.file].add(target)
                why.setdefault((mod.file, target), "::".join(segs))
    return graph, why


# --- cycles ---------------------------------------------------------------------------------------------


def sccs_of(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def one_cycle(graph, scc):
    """A shortest cycle through the first file of a strongly connected component."""
    members = set(scc)
    start = scc[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [start] + list(reversed(path))[1:] + [start] if v != start else [start, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return scc


def check(root, quiet=False):
    graph, why = build_graph(root)
    sccs = sccs_of(graph)
    rel = lambda p: os.path.relpath(p, root)  # noqa: E731
    if sccs:
        for scc in sccs:
            cyc = one_cycle(graph, scc)
            if not quiet:
                print("import cycle between files: " + " -> ".join(rel(f) for f in cyc))
                for a, b in zip(cyc, cyc[1:]):
                    print(f"   {rel(a)} -> {rel(b)}  (names {why[(a, b)]})")
                if len(scc) > len(cyc) - 1:
                    print("   (the cycle's files, with others: " + ", ".join(rel(f) for f in scc) + ")")
        return 1, sccs
    if not quiet:
        edges = sum(len(v) for v in graph.values())
        print(f"no import cycles among {len(graph)} files ({edges} edges)")
    return 0, []


# --- self-test -------------------------------------------------------------------------------------------


def write_tree(root, files):
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)


SELF_TESTS = [
    # (name, files, expected cycles as sets of relative files)
    ("expression path", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::X;\npub fn g() {}\n",
        "b.rs": "pub struct X;\nfn f() { crate::a::g() }\n",
    }, [{"a.rs", "b.rs"}]),
    ("grouped use and super", {
        "lib.rs": "mod d;\n",
        "d.rs": "mod c1;\nmod c2;\npub fn top() { let _ = c2::Y; }\n",
        "d/c1.rs": "use super::{c2::Y, top};\npub struct X;\n",
        "d/c2.rs": "use crate::d::{c1::X};\npub struct Y;\n",
    }, [{"d.rs", "d/c1.rs", "d/c2.rs"}]),
    ("parent and child (the allocator's old shape)", {
        "lib.rs": "mod drv;\nmod sync;\n",
        "drv.rs": "mod state;\npub(crate) use state::State;\nfn go() { crate::sync::run(); }\n",
        "drv/state.rs": "pub struct State;\n",
        "sync.rs": "use crate::drv::State;\npub fn run() { let _ = super::drv::go; }\n",
    }, [{"drv.rs", "sync.rs"}]),
    ("pub use cycle, name brought by use", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "pub use crate::b::B;\npub struct A;\n",
        "b.rs": "use crate::a;\npub struct B;\nfn f() { let _ = a::A; }\n",
    }, [{"a.rs", "b.rs"}]),
    ("no cycle: facade re-export, comments, strings and tests", {
        "lib.rs": "mod drv;\npub use drv::Pool;\n",
        "drv.rs": "mod handle;\nmod inner;\npub use handle::Pool;\npub(crate) use inner::Inner;\n",
        "drv/handle.rs": "use super::Inner;\npub struct Pool(Inner);\n// crate::drv::handle in a comment\n",
        "drv/inner.rs": "pub struct Inner;\nconst S: &str = \"crate::drv::handle::Pool\";\n"
                        "#[cfg(test)]\nmod tests { use crate::drv::handle::Pool; }\n",
    }, []),
    ("no cycle: test-only module file", {
        "lib.rs": "mod a;\n#[cfg(test)]\nmod t;\n",
        "a.rs": "pub fn f() {}\n",
        "t.rs": "use crate::a::f;\n",
    }, []),
]


def self_test():
    failed = 0
    for name, files, expected in SELF_TESTS:
        with tempfile.TemporaryDirectory() as d:
            write_tree(d, files)
            rc, sccs = check(d, quiet=True)
            got = [{os.path.relpath(f, d) for f in scc} for scc in sccs]
            ok = sorted(map(sorted, got)) == sorted(map(sorted, expected)) and rc == (1 if expected else 0)
            print(f"self-test {'ok  ' if ok else 'FAIL'} {name}: found {got or 'no cycle'}")
            failed += not ok
    if failed:
        print(f"check-imports self-test: {failed} case(s) failed")
        return 1
    print(f"check-imports self-test: {len(SELF_TESTS)} cases passed")
    return 0


def main(argv):
    if "--self-test" in argv:
        return self_test()
    root = ROOT
    if "--root" in argv:
        root = argv[argv.index("--root") + 1]
    rc, _ = check(os.path.abspath(root))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
