#!/usr/bin/env python3
"""The public API of the `idalloc` and `idalloc-client` crates against the last release's: a
breaking change fails unless the crate's version allows it (semver; before 1.0 a higher minor).

Both sides come from rustdoc's JSON output (`--output-format json`, unstable in rustc: the stable
toolchain gives it with `RUSTC_BOOTSTRAP=1`, set for rustdoc alone through `RUSTDOC`, so nothing
else is rebuilt). The release's source is `git archive`d under the target directory and built in
the same target directory, so it reuses the dependencies already checked; its JSON is cached there
by commit. Each public item, by every public path, is rendered to one normalized line (types by
their shortest public path, parameters without names), and the lines of both sides are compared.

Breaking: an item gone; a changed line (a function's parameters or return type, a field's type, a
variant's fields, generics, bounds); `#[non_exhaustive]` or a private field added; a trait item
losing its default; a public field or variant added to an exhaustive struct or enum; a trait
method, type or constant added without a default; an auto trait (`Send`, `Sync`, ...) lost.
Anything else is an addition and needs nothing. A renamed generic parameter or a type whose
shortest public path changed reads as a change: the check errs towards breaking.

Usage:
  scripts/public-api.py                  # against the last release; exit 1 on a break the
                                         # version does not allow, naming old and new lines
  scripts/public-api.py --baseline REV   # against another tag or commit
  scripts/public-api.py --print          # the working tree's API, one line an item
  scripts/public-api.py --release        # the release compared with: name and commit
  scripts/public-api.py --self-test      # builds a small crate in versions that break it in each
                                         # way above (and one that only adds): each must be caught
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CRATES = ["idalloc", "idalloc-client"]
# The last release's commit, used when the clone has no `v*` tag (tags can be lost in a copy of
# the repository where commits are not); the first change after a release updates it.
LAST_RELEASE = ("v0.1.0", "5fc7413")
AUTO_TRAITS = {"Send", "Sync", "Unpin", "UnwindSafe", "RefUnwindSafe"}


# --- rustdoc JSON ---------------------------------------------------------------------------------

def target_dir():
    return os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"))


def real_rustdoc():
    r = subprocess.run(["rustup", "which", "rustdoc"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "rustdoc"


def rustdoc_version():
    return subprocess.run([real_rustdoc(), "-V"], capture_output=True, text=True).stdout.strip()


def rustdoc_json(crate, src, extra=()):
    """Runs rustdoc (JSON) on `crate` of the workspace at `src` and returns the JSON parsed."""
    target = target_dir()
    out = os.path.join(target, "doc", crate.replace("-", "_") + ".json")
    # Another tree's crate of the same name writes the same file: never read a stale one.
    if os.path.exists(out):
        os.remove(out)
    with tempfile.TemporaryDirectory() as tmp:
        wrapper = os.path.join(tmp, "rustdoc")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nRUSTC_BOOTSTRAP=1 exec "{real_rustdoc()}" "$@"\n')
        os.chmod(wrapper, 0o755)
        env = dict(os.environ, RUSTDOC=wrapper)
        env.pop("RUSTDOCFLAGS", None)
        cmd = ["cargo", "rustdoc", "--quiet", *extra, "--target-dir", target, "-p", crate, "--lib",
               "--", "-Z", "unstable-options", "--output-format", "json"]
        r = subprocess.run(cmd, cwd=src, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"rustdoc of {crate} in {src} failed (exit {r.returncode})")
    with open(out) as f:
        return json.load(f)


def git(*args):
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def baseline(rev=None):
    """(name, commit) of the release to compare with: `rev`, else the newest `v*` tag before
    HEAD, else LAST_RELEASE's commit."""
    if rev is None:
        rev = git("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", "HEAD")
        name = rev
        if not rev:
            name, rev = LAST_RELEASE
    else:
        name = rev
    commit = git("rev-parse", "--verify", "--quiet", rev + "^{commit}")
    if not commit:
        raise RuntimeError(f"{rev} is not in this clone's history (shallow? fetch it): "
                           "no release to compare the API with")
    return name, commit


def release_json(crate, commit):
    """The release's rustdoc JSON, cached under the target directory by commit (and toolchain:
    another rustdoc may render the same source differently)."""
    base = os.path.join(target_dir(), "api-prev", commit)
    cached = os.path.join(base, crate.replace("-", "_") + ".json")
    stamp, toolchain = cached + ".rustdoc", rustdoc_version()
    if os.path.exists(cached) and os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == toolchain:
                with open(cached) as f:
                    return json.load(f)
    src = os.path.join(base, "src")
    if not os.path.exists(os.path.join(src, ".complete")):
        shutil.rmtree(src, ignore_errors=True)
        os.makedirs(src)
        archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {commit} failed")
        open(os.path.join(src, ".complete"), "w").close()
    try:  # offline first: the registry cache usually holds every version
        doc = rustdoc_json(crate, src, ["--locked", "--offline"])
    except RuntimeError:
        doc = rustdoc_json(crate, src, ["--locked"])
    shutil.copyfile(os.path.join(target_dir(), "doc", os.path.basename(cached)), cached)
    with open(stamp, "w") as f:
        f.write(toolchain)
    return doc


# --- rendering ------------------------------------------------------------------------------------

class Renderer:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.public = {}

    def item(self, i):
        return self.index.get(str(i))

    def canon(self, i, written):
        if str(i) in self.public:  # the crate's own item: its shortest public path
            return self.public[str(i)]
        p = self.paths.get(str(i)) if i is not None else None
        return "::".join(p["path"]) if p else written

    def ty(self, t):
        if t is None:
            return "()"
        if isinstance(t, str):
            return "_" if t == "infer" else t
        k, v = next(iter(t.items()))
        if k == "resolved_path":
            return self.path(v)
        if k == "dyn_trait":
            s = " + ".join(self.poly(p) for p in v["traits"])
            return "dyn " + s + (f" + {v['lifetime']}" if v.get("lifetime") else "")
        if k in ("generic", "primitive"):
            return v
        if k == "function_pointer":
            return (self.header(v["header"]) + self.hrtb(v.get("generic_params"))
                    + "fn(" + ", ".join(self.ty(t) for _, t in v["sig"]["inputs"]) + ")"
                    + self.ret(v["sig"]["output"]))
        if k == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if k == "slice":
            return f"[{self.ty(v)}]"
        if k == "array":
            return f"[{self.ty(v['type'])}; {v['len']}]"
        if k == "pat":
            return self.ty(v["type"])
        if k == "impl_trait":
            return "impl " + self.bounds(v)
        if k == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if k == "borrowed_ref":
            lt = f"{v['lifetime']} " if v.get("lifetime") else ""
            return "&" + lt + ("mut " if v["is_mutable"] else "") + self.ty(v["type"])
        if k == "qualified_path":
            self_ty = self.ty(v["self_type"])
            base = f"<{self_ty} as {self.path(v['trait'])}>" if v.get("trait") else self_ty
            return f"{base}::{v['name']}{self.args(v.get('args'))}"
        return f"<{k}>"

    def path(self, p):
        return self.canon(p.get("id"), p.get("path") or p.get("name", "?")) + self.args(p.get("args"))

    def args(self, a):
        if not a:
            return ""
        k, v = next(iter(a.items())) if isinstance(a, dict) else (a, None)
        if k == "angle_bracketed":
            parts = [self.garg(x) for x in v.get("args", [])]
            parts += [self.constraint(c) for c in v.get("constraints", [])]
            return f"<{', '.join(parts)}>" if parts else ""
        if k == "parenthesized":
            out = self.ret(v.get("output"))
            return "(" + ", ".join(self.ty(t) for t in v["inputs"]) + ")" + out
        return "(..)"

    def garg(self, x):
        if isinstance(x, str):
            return "_"
        k, v = next(iter(x.items()))
        if k == "lifetime":
            return v
        if k == "type":
            return self.ty(v)
        if k == "const":
            return v.get("expr") or str(v.get("value"))
        return "_"

    def constraint(self, c):
        b = c.get("binding", {})
        head = c["name"] + self.args(c.get("args"))
        if "equality" in b:
            term = b["equality"]
            return f"{head} = " + (self.ty(term["type"]) if "type" in term
                                   else str(term.get("constant", {}).get("expr")))
        return f"{head}: {self.bounds(b.get('constraint', []))}"

    def hrtb(self, params):
        return f"for<{', '.join(p['name'] for p in params)}> " if params else ""

    def poly(self, p):
        return self.hrtb(p.get("generic_params")) + self.path(p["trait"])

    def bound(self, b):
        k, v = next(iter(b.items()))
        if k == "trait_bound":
            m = {"maybe": "?", "maybe_const": "~const "}.get(v.get("modifier"), "")
            return m + self.hrtb(v.get("generic_params")) + self.path(v["trait"])
        if k == "outlives":
            return v
        if k == "use":
            return "use<" + ", ".join(x if isinstance(x, str) else next(iter(x.values()))
                                      for x in v) + ">"
        return k

    def bounds(self, bs):
        return " + ".join(self.bound(b) for b in bs)

    def generics(self, g):
        out = []
        for p in g.get("params", []):
            k, v = next(iter(p["kind"].items()))
            if k == "lifetime":
                out.append(p["name"] + (": " + " + ".join(v["outlives"]) if v.get("outlives") else ""))
            elif k == "type":
                if v.get("is_synthetic"):
                    continue
                s = p["name"] + (": " + self.bounds(v["bounds"]) if v.get("bounds") else "")
                out.append(s + (" = " + self.ty(v["default"]) if v.get("default") else ""))
            elif k == "const":
                s = f"const {p['name']}: {self.ty(v['type'])}"
                out.append(s + (f" = {v['default']}" if v.get("default") else ""))
        return f"<{', '.join(out)}>" if out else ""

    def where(self, g):
        preds = []
        for w in g.get("where_predicates", []):
            k, v = next(iter(w.items()))
            if k == "bound_predicate":
                preds.append(self.hrtb(v.get("generic_params")) + self.ty(v["type"]) + ": "
                             + self.bounds(v["bounds"]))
            elif k == "lifetime_predicate":
                preds.append(v["lifetime"] + ": " + " + ".join(v["outlives"]))
            elif k == "eq_predicate":
                rhs = v["rhs"]
                preds.append(self.ty(v["lhs"]) + " = "
                             + (self.ty(rhs["type"]) if "type" in rhs else str(rhs)))
        return " where " + ", ".join(preds) if preds else ""

    def header(self, h):
        s = ("const " if h.get("is_const") else "") + ("async " if h.get("is_async") else "")
        s += "unsafe " if h.get("is_unsafe") else ""
        abi = h.get("abi", "Rust")
        if abi != "Rust":
            s += f'extern "{abi if isinstance(abi, str) else next(iter(abi))}" '
        return s

    def ret(self, t):
        return "" if t is None else " -> " + self.ty(t)

    def fn(self, path, f, names):
        params = []
        for n, t in f["sig"]["inputs"]:
            if n == "self" and t == {"generic": "Self"}:
                params.append("self")
            elif n == "self" and "borrowed_ref" in t and t["borrowed_ref"]["type"] == {"generic": "Self"}:
                r = t["borrowed_ref"]
                lt = f"{r['lifetime']} " if r.get("lifetime") else ""
                params.append("&" + lt + ("mut " if r["is_mutable"] else "") + "self")
            else:
                params.append(f"{n}: {self.ty(t)}" if names else self.ty(t))
        g = f["generics"]
        return (f"{self.header(f['header'])}fn {path}{self.generics(g)}({', '.join(params)})"
                f"{self.ret(f['sig']['output'])}{self.where(g)}")


class Entry:
    """One public item: `line` as printed, `core` compared (no parameter names, no flags),
    `flags` (`non_exhaustive`, `private_fields`, `provided`), `parent` (the key of its struct,
    enum or trait), `owner` (that, or the type of its impl: additions print under it)."""

    def __init__(self, line, core=None, flags=(), parent=None, owner=None):
        self.line, self.core, self.flags, self.parent = line, core or line, set(flags), parent
        self.owner = owner or parent

    def show(self):
        pre = "#[non_exhaustive] " if "non_exhaustive" in self.flags else ""
        post = " { .. }" if "private_fields" in self.flags else ""
        post += " { <default> }" if "provided" in self.flags else ""
        return pre + self.line + post


def public_api(doc):
    """{key: Entry} for every public item of the crate, by every public path."""
    r = Renderer(doc)
    api = {}
    seen = set()
    found = {}

    def add(key, *a, **kw):
        e = Entry(*a, **kw)
        if key in api and api[key].line != e.line:  # one key, two items: keep both apart
            key += " #" + str(sum(k.startswith(key) for k in api))
        api[key] = e

    def fields_of(ids):
        return [r.item(i) for i in ids if i is not None]

    def trait_impls(inner, path, owner):
        for impl_id in inner.get("impls", []):
            impl = (r.item(impl_id) or {}).get("inner", {}).get("impl")
            if not impl or impl.get("blanket_impl"):
                continue
            trait = impl.get("trait")
            g = impl["generics"]
            if trait:
                name = r.path(trait)
                if impl.get("is_synthetic") and trait.get("path") not in AUTO_TRAITS:
                    continue
                neg = "!" if impl.get("is_negative") else ""
                key = f"impl {neg}{name} for {r.ty(impl['for'])}"
                add(key, f"impl{r.generics(g)} {neg}{name} for {r.ty(impl['for'])}{r.where(g)}",
                    owner=owner)
                continue
            ctx = f" [in impl{r.generics(g)}{r.where(g)}]" if g["params"] or g["where_predicates"] else ""
            for mid in impl.get("items", []):
                m = r.item(mid)
                if m and m.get("visibility") == "public" and m.get("name"):
                    member(m, f"{path}::{m['name']}", None, ctx, owner)

    def member(m, path, parent, ctx="", owner=None):
        kind = next(iter(m["inner"]))
        v = m["inner"][kind]
        if kind == "function":
            flags = {"provided"} if parent and v.get("has_body") else set()
            add(f"fn {path}", r.fn(path, v, True) + ctx, r.fn(path, v, False) + ctx, flags, parent,
                owner)
        elif kind == "assoc_const":
            flags = {"provided"} if parent and v.get("value") is not None else set()
            add(f"const {path}", f"const {path}: {r.ty(v['type'])}{ctx}", flags=flags, parent=parent,
                owner=owner)
        elif kind == "assoc_type":
            b = f": {r.bounds(v['bounds'])}" if v.get("bounds") else ""
            if parent:  # a trait's: the default is not part of the contract
                flags = {"provided"} if v.get("type") else set()
                add(f"type {path}", f"type {path}{r.generics(v['generics'])}{b}", flags=flags,
                    parent=parent)
            else:
                add(f"type {path}", f"type {path} = {r.ty(v.get('type'))}{ctx}", owner=owner)
        else:
            add(f"{kind} {path}", f"{kind} {path}{ctx}", owner=owner)

    def walk(item_id, path):
        if (str(item_id), path) in seen:
            return
        seen.add((str(item_id), path))
        found.setdefault(str(item_id), []).append(path)
        item = r.item(item_id)
        if item is None:
            return
        kind = next(iter(item["inner"]))
        v = item["inner"][kind]
        nonexh = {"non_exhaustive"} if any(a == "non_exhaustive" or a == "#[non_exhaustive]"
                                           for a in item.get("attrs", [])) else set()
        key = f"{kind} {path}"
        if kind == "use":
            target = v.get("id")
            name = path if v.get("is_glob") else f"{path}::{v['name']}"
            t = r.item(target) if target is not None else None
            if t and v.get("is_glob"):
                if next(iter(t["inner"])) == "module":
                    for child in t["inner"]["module"]["items"]:
                        c = r.item(child)
                        if c and c.get("visibility") == "public":
                            walk(child, f"{path}::{c['name']}" if c.get("name") else path)
                    return
            if t:
                walk(target, name)
            else:
                src = r.canon(target, v.get("source"))
                add(f"use {name}", f"use {name}{'::*' if v.get('is_glob') else ''} = {src}")
            return
        if kind == "module":
            add(key, f"mod {path}")
            for child in v["items"]:
                c = r.item(child)
                if c and c.get("visibility") == "public":
                    walk(child, f"{path}::{c['name']}" if c.get("name") else path)
        elif kind in ("struct", "union"):
            g = v["generics"]
            sk = v["kind"] if kind == "struct" else {"plain": v}
            flags = set(nonexh)
            if isinstance(sk, dict) and "plain" in sk:
                if sk["plain"].get("has_stripped_fields"):
                    flags.add("private_fields")
                fields, shape = fields_of(sk["plain"]["fields"]), ""
            elif isinstance(sk, dict) and "tuple" in sk:
                if None in sk["tuple"]:
                    flags.add("private_fields")
                fields, shape = fields_of(sk["tuple"]), "(..)"
            else:
                fields, shape = [], ";"
            add(key, f"{kind} {path}{r.generics(g)}{shape}{r.where(g)}", flags=flags)
            for f in fields:
                if f.get("visibility") == "public":
                    add(f"field {path}.{f['name']}",
                        f"field {path}.{f['name']}: {r.ty(f['inner']['struct_field'])}", parent=key)
            trait_impls(v, path, key)
        elif kind == "enum":
            g = v["generics"]
            flags = nonexh | ({"private_fields"} if v.get("has_stripped_variants") else set())
            add(key, f"enum {path}{r.generics(g)}{r.where(g)}", flags=flags)
            for vid in v["variants"]:
                var = r.item(vid)
                vk = var["inner"]["variant"]["kind"]
                vflags = {"non_exhaustive"} if "non_exhaustive" in var.get("attrs", []) else set()
                if isinstance(vk, dict) and "tuple" in vk:
                    fs = ", ".join(r.ty(f["inner"]["struct_field"]) if f else "_"
                                   for f in (r.item(i) if i is not None else None for i in vk["tuple"]))
                    shape = f"({fs})"
                elif isinstance(vk, dict) and "struct" in vk:
                    fs = [f"{f['name']}: {r.ty(f['inner']['struct_field'])}"
                          for f in fields_of(vk["struct"]["fields"])]
                    shape = " { " + ", ".join(fs) + (", .." if vk["struct"].get("has_stripped_fields")
                                                     else "") + " }"
                else:
                    d = var["inner"]["variant"].get("discriminant")
                    shape = f" = {d['expr']}" if d else ""
                add(f"variant {path}::{var['name']}", f"variant {path}::{var['name']}{shape}",
                    flags=vflags, parent=key)
            trait_impls(v, path, key)
        elif kind == "trait":
            g = v["generics"]
            sup = f": {r.bounds(v['bounds'])}" if v.get("bounds") else ""
            unsafe = "unsafe " if v.get("is_unsafe") else ""
            add(key, f"{unsafe}trait {path}{r.generics(g)}{sup}{r.where(g)}")
            for mid in v["items"]:
                m = r.item(mid)
                if m:
                    member(m, f"{path}::{m['name']}", key)
        elif kind == "function":
            add(f"fn {path}", r.fn(path, v, True), r.fn(path, v, False))
        elif kind == "constant":
            add(f"const {path}", f"const {path}: {r.ty(v['type'])}")
        elif kind == "static":
            mut = "mut " if v.get("is_mutable") else ""
            add(f"static {path}", f"static {mut}{path}: {r.ty(v['type'])}")
        elif kind == "type_alias":
            g = v["generics"]
            add(f"type {path}", f"type {path}{r.generics(g)}{r.where(g)} = {r.ty(v['type'])}")
        elif kind in ("macro", "proc_macro"):
            add(f"macro {path}", f"macro {path}!")
        else:
            add(key, f"{kind} {path}")

    # Twice: the first walk finds each item's public paths, so that the second names types by
    # their shortest one, not by the private module that defines them (which may change).
    root = r.item(doc["root"])
    walk(doc["root"], root["name"])
    r.public = {i: min(ps, key=lambda p: (p.count("::"), p)) for i, ps in found.items()}
    api.clear()
    seen.clear()
    walk(doc["root"], root["name"])
    return api


# --- comparison -----------------------------------------------------------------------------------

def compare(old, new):
    """(breaking, added): breaking is a list of (key, why, old line or None, new line or None)."""
    breaking, added = [], []
    for key, o in sorted(old.items()):
        n = new.get(key)
        if n is None:
            breaking.append((key, "removed", o.show(), None))
        elif o.core != n.core:
            breaking.append((key, "changed", o.show(), n.show()))
        elif "non_exhaustive" in n.flags - o.flags:
            breaking.append((key, "made #[non_exhaustive]", o.show(), n.show()))
        elif "private_fields" in n.flags - o.flags:
            breaking.append((key, "gained private fields: no longer built with a literal", o.show(),
                             n.show()))
        elif "provided" in o.flags - n.flags:
            breaking.append((key, "lost its default: implementations must add it", o.show(), n.show()))
    for key, n in sorted(new.items()):
        if key in old:
            continue
        p = old.get(n.parent) if n.parent else None
        exhaustive = p is not None and not p.flags & {"non_exhaustive", "private_fields"}
        if key.startswith(("field ", "variant ")) and exhaustive:
            why = ("field added to an exhaustive struct: its literals break" if key.startswith("field ")
                   else "variant added to an exhaustive enum: a match without a wildcard breaks")
            breaking.append((key, why, None, n.show()))
        elif p is not None and p.line.startswith(("trait ", "unsafe trait ")) \
                and "provided" not in n.flags:
            breaking.append((key, "trait item added without a default: implementations break", None,
                             n.show()))
        elif n.owner is None or n.owner in old:  # not a part of an item itself new
            added.append(n.show())
    return breaking, added


def version(v):
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", v or "")
    if not m:
        raise RuntimeError(f"cannot read the version {v!r}")
    return tuple(int(x) for x in m.groups())


def allows_break(old, new):
    """Semver: a break needs a higher major, or before 1.0 a higher minor."""
    o, n = version(old), version(new)
    return n[0] > o[0] if o[0] > 0 else n[:2] > o[:2]


def verdict(crate, old_doc, new_doc, release):
    """Prints the comparison; returns False when a break is not allowed by the version."""
    old_v, new_v = old_doc.get("crate_version"), new_doc.get("crate_version")
    if old_doc["format_version"] != new_doc["format_version"]:
        raise RuntimeError(f"rustdoc JSON format {old_doc['format_version']} (release) against "
                           f"{new_doc['format_version']}: not comparable")
    breaking, added = compare(public_api(old_doc), public_api(new_doc))
    for a in added:
        print(f"public-api: {crate}: added: {a}")
    ok = not breaking or allows_break(old_v, new_v)
    for _, why, o, n in breaking:
        print(f"public-api: {crate}: breaking ({why}):")
        if o:
            print(f"    was: {o}")
        if n:
            print(f"    now: {n}")
    tail = (f"{len(breaking)} breaking, {len(added)} added since {release} ({old_v}); "
            f"version {new_v}")
    sys.stdout.flush()
    if breaking and ok:
        print(f"public-api: {crate}: {tail}: breaking changes are allowed")
    elif breaking:
        o = version(old_v)
        need = f"{o[0] + 1}.0.0-dev" if o[0] else f"0.{o[1] + 1}.0-dev"
        print(f"public-api: {crate}: {tail} does not allow breaking changes: keep the old API, or "
              f"give every crate the version {need} and mark the change **Breaking** in "
              "CHANGELOG.md (docs/design/compatibility.md)", file=sys.stderr)
    else:
        print(f"public-api: {crate}: {tail}: no breaking change")
    return ok


# --- self-test ------------------------------------------------------------------------------------

SELF_TEST_BASE = """
pub fn stable(a: u32) -> u32 { a }
pub fn sig_param(a: u32) -> u32 { a }
pub fn sig_ret() -> u32 { 0 }
pub fn removed() {}
pub mod inner { pub struct Moved; }
pub struct Open { pub a: u32 }
pub struct Typed { pub a: u32 }
pub struct Literal { pub a: u32 }
pub struct Closed { pub a: u32, b: u32 }
impl Closed { pub fn new() -> Self { Closed { a: 0, b: 0 } } pub fn get(&self) -> u32 { self.b } }
pub enum Exhaustive { A, B(u32) }
pub enum ChangedVariant { A(u32) }
pub enum MadeNonExhaustive { A }
#[non_exhaustive] pub enum Open2 { A }
pub trait Tr { fn req(&self); fn dflt(&self) {} }
pub trait Grows { fn a(&self); }
pub struct Sends(pub u32);
"""

# Each breaking change of the base, with the key the comparison must report.
SELF_TEST_BREAKING = """
pub fn stable(a: u32) -> u32 { a }
pub fn sig_param(a: u64) -> u32 { a as u32 }
pub fn sig_ret() -> i64 { 0 }
pub mod inner { }
pub struct Open { pub a: u32, pub c: u32 }
pub struct Typed { pub a: String }
pub struct Literal { pub a: u32, b: u32 }
pub struct Closed { pub a: u32, b: u32 }
impl Closed { pub fn new() -> Self { Closed { a: 0, b: 0 } } pub fn get(&self, x: u8) -> u32 { self.b + x as u32 } }
pub enum Exhaustive { A, B(u32), C }
pub enum ChangedVariant { A(u64) }
#[non_exhaustive] pub enum MadeNonExhaustive { A }
#[non_exhaustive] pub enum Open2 { A }
pub trait Tr { fn req(&self); fn dflt(&self); }
pub trait Grows { fn a(&self); fn b(&self); }
pub struct Sends(pub u32, pub std::rc::Rc<u32>);
"""
EXPECTED_BREAKING = {
    "removed": {"fn demo::removed", "struct demo::inner::Moved"}
    | {f"impl core::{t} for demo::inner::Moved" for t in
       ["marker::Send", "marker::Sync", "marker::Unpin", "panic::unwind_safe::UnwindSafe",
        "panic::unwind_safe::RefUnwindSafe"]},
    "auto trait lost": {"impl core::marker::Send for demo::Sends",
                        "impl core::marker::Sync for demo::Sends"},
    "changed": {"fn demo::sig_param", "fn demo::sig_ret", "field demo::Typed.a",
                "fn demo::Closed::get", "variant demo::ChangedVariant::A"},
    "added": {"field demo::Open.c", "field demo::Sends.1", "variant demo::Exhaustive::C",
              "fn demo::Grows::b"},
    "flag": {"enum demo::MadeNonExhaustive", "fn demo::Tr::dflt", "struct demo::Literal"},
}

# Additions only: none of them may be reported as breaking.
SELF_TEST_ADDITIVE = SELF_TEST_BASE + """
pub fn new_fn(_: &str) {}
pub mod more { pub const C: u8 = 1; }
pub trait Tr2 { fn r(&self); }
pub enum NewEnum { X }
"""
SELF_TEST_ADDITIVE = SELF_TEST_ADDITIVE.replace(
    "pub struct Closed { pub a: u32, b: u32 }", "pub struct Closed { pub a: u32, pub c: u8, b: u32 }"
).replace("#[non_exhaustive] pub enum Open2 { A }", "#[non_exhaustive] pub enum Open2 { A, B }"
).replace("fn dflt(&self) {} }", "fn dflt(&self) {} fn more(&self) {} }"
).replace("pub trait Grows { fn a(&self); }", "pub trait Grows { fn a(&self) {} }"
).replace("pub fn sig_param(a: u32)", "pub fn sig_param(renamed: u32)")
EXPECTED_ADDED = {
    "mod demo::more", "const demo::more::C: u8", "enum demo::NewEnum", "trait demo::Tr2",
    "field demo::Closed.c: u8", "fn demo::Tr::more(&self) { <default> }", "fn demo::new_fn(_: &str)",
    "variant demo::Open2::B",
}


def self_test_doc(tmp, name, source, version):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    with open(os.path.join(d, "lib.rs"), "w") as f:
        f.write(source)
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    subprocess.run([real_rustdoc(), "--edition", "2021", "--crate-type", "lib", "--crate-name",
                    "demo", "--crate-version", version, "-Z", "unstable-options",
                    "--output-format", "json", "-o", d, os.path.join(d, "lib.rs")],
                   env=env, check=True)
    with open(os.path.join(d, "demo.json")) as f:
        return json.load(f)


def self_test():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = self_test_doc(tmp, "base", SELF_TEST_BASE, "0.1.0")
        broken = self_test_doc(tmp, "broken", SELF_TEST_BREAKING, "0.1.1")
        additive = self_test_doc(tmp, "additive", SELF_TEST_ADDITIVE, "0.1.1")
        bumped = self_test_doc(tmp, "bumped", SELF_TEST_BREAKING, "0.2.0-dev")
    breaking, _ = compare(public_api(base), public_api(broken))
    got = {key for key, *_ in breaking}
    want = set().union(*EXPECTED_BREAKING.values())
    failures += [f"not caught: {k}" for k in sorted(want - got)]
    failures += [f"reported but not planted: {k}" for k in sorted(got - want)]
    breaking, added = compare(public_api(base), public_api(additive))
    for _, why, o, n in breaking:
        failures.append(f"an addition reported as breaking ({why}): {o} -> {n}")
    if set(added) != EXPECTED_ADDED:
        failures.append(f"additions {sorted(added)}, expected {sorted(EXPECTED_ADDED)}")
    real_out = sys.stdout, sys.stderr
    try:
        sys.stdout = sys.stderr = open(os.devnull, "w")
        if verdict("demo", base, broken, "base"):
            failures.append("a break in 0.1.0 -> 0.1.1 passed")
        if not verdict("demo", base, bumped, "base"):
            failures.append("a break in 0.1.0 -> 0.2.0-dev failed")
        if not verdict("demo", base, additive, "base"):
            failures.append("additions in 0.1.0 -> 0.1.1 failed")
    finally:
        sys.stdout.close()
        sys.stdout, sys.stderr = real_out
    for (o, n, want_ok) in [("0.1.0", "0.1.5", False), ("0.1.0", "0.2.0", True),
                            ("1.2.0", "1.9.0", False), ("1.2.0", "2.0.0-rc.1", True)]:
        if allows_break(o, n) != want_ok:
            failures.append(f"allows_break({o}, {n}) is not {want_ok}")
    for f in failures:
        print(f"public-api --self-test: {f}", file=sys.stderr)
    if failures:
        return 1
    print(f"public-api --self-test: ok ({len(want)} planted breaks caught, additions pass)")
    return 0


# --- main -----------------------------------------------------------------------------------------

def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    if args == ["--print"]:
        for crate in CRATES:
            for e in sorted(public_api(rustdoc_json(crate, ROOT)).values(), key=lambda e: e.line):
                print(e.show())
        return 0
    if args == ["--release"]:
        print(*baseline())
        return 0
    rev = None
    if len(args) == 2 and args[0] == "--baseline":
        rev = args[1]
    elif args:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        name, commit = baseline(rev)
        ok = True
        for crate in CRATES:
            now = rustdoc_json(crate, ROOT)
            ok &= verdict(crate, release_json(crate, commit), now, f"{name} ({commit[:7]})")
    except RuntimeError as e:
        print(f"public-api: {e}", file=sys.stderr)
        return 1
    if not ok:
        return 1
    print("public-api: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
