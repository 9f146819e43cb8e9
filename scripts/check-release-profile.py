#!/usr/bin/env python3
"""The `idalloc` binary users build stays small: the release profile keeps no debug info.

A release build of `idalloc` takes many minutes on CI's two cores, so CI does not build one to
weigh it. What made it 117 MB was debug info (`debug = 1` in `[profile.release]`): without it the
binary weighs about a fifth of that (docs/guide/deployment.md, "Binary size", has the figure and
its command). This check fails when the workspace's `Cargo.toml` would bring debug info back into
the binary `cargo build --release` makes:

* `[profile.release]` has `debug` absent, `false`, `0` or `"none"`, and `strip` set to
  `"debuginfo"`, `"symbols"` or `true` (dependencies' debug info, e.g. the standard library's,
  is stripped too);
* no `[profile.release.package.*]` or `[profile.release.build-override]` turns debug info on;
* `[profile.profiling]`, the profile for `perf` and flame graphs, exists and inherits from
  `release`, so benchmarks keep their symbols without weighing the users' binary.

It does not bound growth from new dependencies; the release build measured in the docs does.

Usage: `python3 scripts/check-release-profile.py` (exit 1 naming each problem);
`--self-test` runs it on planted manifests and fails unless exactly the bad ones are refused.
"""
import os
import sys
import tomllib

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

NO_DEBUG = (None, False, 0, "none")
STRIPPED = ("debuginfo", "symbols", True)


def problems(manifest):
    out = []
    profiles = manifest.get("profile", {})
    release = profiles.get("release")
    if release is None:
        return ["[profile.release] is missing: cargo's default keeps the standard library's debug info"]
    if release.get("debug") not in NO_DEBUG:
        out.append(f"[profile.release] debug = {release.get('debug')!r}: the binary carries debug info (use --profile profiling)")
    if release.get("strip") not in STRIPPED:
        out.append(f"[profile.release] strip = {release.get('strip')!r}: want \"debuginfo\" or \"symbols\"")
    for name, pkg in release.get("package", {}).items():
        if pkg.get("debug") not in NO_DEBUG:
            out.append(f"[profile.release.package.{name}] debug = {pkg.get('debug')!r}")
    bo = release.get("build-override", {})
    if bo.get("debug") not in NO_DEBUG:
        out.append(f"[profile.release.build-override] debug = {bo.get('debug')!r}")
    prof = profiles.get("profiling")
    if prof is None or prof.get("inherits") != "release":
        out.append("[profile.profiling] must exist and inherit from release (benchmarks' symbols)")
    return out


def self_test():
    good = {"profile": {"release": {"debug": False, "strip": "debuginfo"},
                        "profiling": {"inherits": "release", "debug": 1}}}
    cases = [
        (good, 0),
        ({"profile": {"release": {"debug": 1, "strip": "debuginfo"}, "profiling": {"inherits": "release"}}}, 1),
        ({"profile": {"release": {"debug": False}, "profiling": {"inherits": "release"}}}, 1),
        ({"profile": {"release": {"strip": "symbols", "package": {"redb": {"debug": 2}}},
                      "profiling": {"inherits": "release"}}}, 1),
        ({"profile": {"release": {"strip": True}}}, 1),
        ({}, 1),
    ]
    for manifest, want in cases:
        got = len(problems(manifest))
        if got != want:
            print(f"check-release-profile self-test: {manifest} gave {got} problems, want {want}", file=sys.stderr)
            return 1
    print("check-release-profile self-test: ok")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        manifest = tomllib.load(f)
    found = problems(manifest)
    for p in found:
        print(f"Cargo.toml: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
