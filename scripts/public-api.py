#!/usr/bin/env python3
"""The public API of the `idalloc` and `idalloc-client` crates, checked against a list in the
repository (`api/<crate>.txt`): a public item of the list that is gone fails the check, so a
breaking change cannot slip into a patch release unnoticed.

Each line of a list is one public item by its path: modules, types, functions, constants, trait
methods, enum variants, public fields, inherent methods and trait implementations, with a short
kind. The list is made from rustdoc's JSON output (`--output-format json`), which rustc marks
unstable: the stable toolchain produces it with `RUSTC_BOOTSTRAP=1`, set here for rustdoc alone
(through `RUSTDOC`), so nothing else is rebuilt. Signatures are not compared (a changed argument
type is not caught): the check is on names, which is what most breaks are.

Usage:
  scripts/public-api.py            # exit 1 naming every listed item that is gone; new items are
                                   # printed (add them with --update in the same change)
  scripts/public-api.py --update   # rewrite the lists from the code
  scripts/public-api.py --self-test  # a list naming an item that does not exist must fail
A release that removes items raises the minor version before 1.0 (see CHANGELOG.md) and runs
--update.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CRATES = ["idalloc", "idalloc-client"]


def rustdoc_json(crate):
    """Builds the crate's rustdoc JSON and returns it parsed."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    with tempfile.TemporaryDirectory() as tmp:
        wrapper = os.path.join(tmp, "rustdoc")
        real = subprocess.run(["rustup", "which", "rustdoc"], capture_output=True, text=True)
        rustdoc = real.stdout.strip() if real.returncode == 0 else "rustdoc"
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nRUSTC_BOOTSTRAP=1 exec "{rustdoc}" "$@"\n')
        os.chmod(wrapper, 0o755)
        env = dict(os.environ, RUSTDOC=wrapper)
        env.pop("RUSTDOCFLAGS", None)
        cmd = ["cargo", "rustdoc", "--quiet", "-p", crate, "--lib", "--",
               "-Z", "unstable-options", "--output-format", "json"]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    with open(os.path.join(target, "doc", crate.replace("-", "_") + ".json")) as f:
        return json.load(f)


def kind_of(item):
    inner = item.get("inner") or {}
    return next(iter(inner)) if isinstance(inner, dict) and inner else str(inner)


def type_name(t):
    """A short rendering of a rustdoc type (for trait implementations' names)."""
    if not isinstance(t, dict):
        return str(t)
    if "resolved_path" in t:
        return t["resolved_path"].get("path") or t["resolved_path"].get("name", "?")
    if "primitive" in t:
        return t["primitive"]
    if "borrowed_ref" in t:
        return "&" + type_name(t["borrowed_ref"].get("type"))
    return next(iter(t), "?")


def public_items(doc):
    index = doc["index"]
    out = set()
    seen = set()

    def public(item):
        return item.get("visibility") == "public"

    def impls(item_inner, path):
        for impl_id in item_inner.get("impls", []):
            impl = index.get(str(impl_id))
            if not impl:
                continue
            i = impl["inner"]["impl"]
            if i.get("is_synthetic") or i.get("blanket_impl"):
                continue
            trait = i.get("trait")
            if trait:
                out.add(f"impl {trait.get('path') or trait.get('name')} for {path}")
                continue
            for mid in i.get("items", []):
                m = index.get(str(mid))
                if m and public(m) and m.get("name"):
                    out.add(f"{kind_of(m)} {path}::{m['name']}")

    def walk(item_id, path):
        key = (str(item_id), path)
        if key in seen:
            return
        seen.add(key)
        item = index.get(str(item_id))
        if item is None:
            return
        kind = kind_of(item)
        inner = item["inner"][kind] if isinstance(item.get("inner"), dict) else {}
        if kind == "use":
            target = inner.get("id")
            if inner.get("is_glob"):
                t = index.get(str(target)) if target is not None else None
                if t and kind_of(t) == "module":
                    for child in t["inner"]["module"]["items"]:
                        c = index.get(str(child))
                        if c and public(c):
                            walk(child, f"{path}::{c.get('name') or ''}".rstrip(":"))
                else:
                    out.add(f"use {path}::* = {inner.get('source')}")
                return
            name = f"{path}::{inner.get('name')}"
            if target is not None and str(target) in index:
                walk(target, name)
            else:
                out.add(f"use {name} = {inner.get('source')}")
            return
        out.add(f"{kind} {path}")
        if kind == "module":
            for child in inner.get("items", []):
                c = index.get(str(child))
                if c and (public(c) or kind_of(c) == "use" and public(c)):
                    cname = c.get("name")
                    walk(child, f"{path}::{cname}" if cname else path)
        elif kind == "struct":
            k = inner.get("kind", {})
            fields = (k.get("plain") or {}).get("fields", []) if isinstance(k, dict) else []
            for fid in fields:
                f = index.get(str(fid))
                if f and public(f):
                    out.add(f"field {path}.{f['name']}")
            impls(inner, path)
        elif kind == "enum":
            for vid in inner.get("variants", []):
                v = index.get(str(vid))
                if v:
                    out.add(f"variant {path}::{v['name']}")
            impls(inner, path)
        elif kind == "trait":
            for mid in inner.get("items", []):
                m = index.get(str(mid))
                if m:
                    out.add(f"{kind_of(m)} {path}::{m['name']}")
        elif kind == "union":
            impls(inner, path)

    root = index[str(doc["root"])]
    walk(doc["root"], root["name"])
    return sorted(out)


def list_path(crate):
    return os.path.join(ROOT, "api", f"{crate}.txt")


def compare(crate, now, listed):
    gone = [i for i in listed if i not in set(now)]
    new = [i for i in now if i not in set(listed)]
    for i in new:
        print(f"public-api: {crate}: new public item (run --update to list it): {i}")
    for i in gone:
        print(f"public-api: {crate}: public item removed or renamed: {i}", file=sys.stderr)
    return gone


def read_list(crate):
    with open(list_path(crate)) as f:
        return [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]


HEADER = ("# The public API of {crate} (scripts/public-api.py --update writes this list; CI fails\n"
          "# when an item listed here is gone). One item a line: kind, then path.\n")


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        doc = rustdoc_json("idalloc-client")
        now = public_items(doc)
        assert now, "no public item found in idalloc-client"
        if not compare("idalloc-client", now, now + ["fn idalloc_client::no_such_item"]):
            print("public-api --self-test: a missing item was not reported", file=sys.stderr)
            return 1
        print("public-api --self-test: ok")
        return 0
    failed = False
    for crate in CRATES:
        now = public_items(rustdoc_json(crate))
        if args == ["--update"]:
            os.makedirs(os.path.dirname(list_path(crate)), exist_ok=True)
            with open(list_path(crate), "w") as f:
                f.write(HEADER.format(crate=crate) + "\n".join(now) + "\n")
            print(f"public-api: wrote {list_path(crate)} ({len(now)} items)")
        elif args:
            print(__doc__, file=sys.stderr)
            return 2
        else:
            failed |= bool(compare(crate, now, read_list(crate)))
    if failed:
        print("public-api: a public item is gone: a breaking change (CHANGELOG.md says which "
              "version that needs); if intended, run scripts/public-api.py --update", file=sys.stderr)
        return 1
    if not args:
        print("public-api: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
