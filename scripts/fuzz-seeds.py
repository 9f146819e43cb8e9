#!/usr/bin/env python3
"""Writes the hand-made seed inputs of fuzz/corpus/<target>/ (docs/design/fuzzing.md).

Seeds are named `seed-NN`; inputs that a fuzzer found failing are kept beside them as
`crash-<what>` and are never rewritten by this script. Input formats are those of the property
functions in crates/idalloc-fuzz/src/. Run from anywhere: `python3 scripts/fuzz-seeds.py`.
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


def write(target, seeds):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    for i, s in enumerate(seeds):
        with open(os.path.join(d, f"seed-{i:02}"), "wb") as f:
            f.write(s if isinstance(s, bytes) else s.encode())


# records: <prefix selector><name len><name><value len><value>, repeated.
# Selectors: 0 none, 1 pool data, 2 id/, 3 key/, 4 ref/, 5 holder/, 6 pools/, 7 fence.
def rec(sel, name, value):
    name = name if isinstance(name, bytes) else name.encode()
    value = value if isinstance(value, bytes) else value.encode()
    return bytes([sel, len(name)]) + name + bytes([len(value)]) + value


spec = json.dumps({"name": "good", "min": 1, "max": 10})
records = [
    rec(2, "7", "a/b"), rec(2, "007", "k"), rec(2, "18446744073709551615", "k"),
    rec(2, "18446744073709551616", "k"), rec(2, "0", b"\xffold"), rec(2, "1", b"\xff"),
    rec(2, "2", b""), rec(2, "3", b"\xff\xff"), rec(2, "-1", "k"),
    rec(3, "a%2Fb", "7"), rec(3, "a%2fb", "7"), rec(3, "%", "07"), rec(3, "a/b", "7"),
    rec(3, "%41", "1"), rec(3, "", "1"), rec(4, "a%2Fb/h%2F1", "7"), rec(4, "k/h/x", "1"),
    rec(4, "k/", "1"), rec(4, "/h", "1"), rec(5, "h%2F1", ""), rec(5, "", ""),
    rec(6, "good", spec), rec(6, "lies", spec), rec(6, "Bad", spec), rec(6, "x/pools/y", spec),
    rec(6, "broken", "{not json"), rec(7, "", ""), rec(7, "x", ""), rec(1, "pools/q", "{}"),
    rec(1, "data/q/id/1", "k"), rec(0, "idalloc/data/other/id/1", "k"),
    rec(2, "7", "a/b") + rec(3, "a%2Fb", "7") + rec(4, "a%2Fb/h", "7") + rec(5, "h", ""),
    rec(2, "5", "x") + rec(2, "5", b"\xffx"),
]
write("records", records)


def sj(**kw):
    base = {"name": "p", "min": 1, "max": 10}
    base.update(kw)
    return json.dumps(base)


spec_json = [
    sj(), sj(reserved=[[2, 3], [3, 5]]), sj(reserved=[[5, 2]]), sj(min=0), sj(min=10, max=1),
    sj(max=18446744073709551615), sj(prefix=4294967296), sj(prefix=1, max=3),
    sj(strategy="lowest"), sj(strategy="Lowest"), sj(idle_grace_ms=18446744073709551615),
    sj(reuse_delay_ms=86400000), sj(name=""), sj(name="A"), sj(name="a/b"), sj(name="x" * 64),
    sj(future=1), '{"name":"p","min":1}', '{"name":"p","min":-1,"max":2}', '{"name":"p","min":1.5,"max":2}',
    "", "{", "null", "[]", '"p"', '{"name":"p","min":1,"max":10,"name":"q"}', b"\xff\xfe",
    sj(reserved=[[1, 10]]), sj(reserved=[[0, 18446744073709551615]]),
]
write("spec_json", spec_json)


def esc(split, s):
    s = s if isinstance(s, bytes) else s.encode()
    return bytes([split]) + s


key_escape = [
    esc(1, "ab"), esc(1, "aa"), esc(3, "a/bc"), esc(3, "%2Fa/"), esc(1, "/%2F"), esc(0, "%2F"),
    esc(3, "%25%"), esc(2, b"\x00\x01\x00\x01"), esc(2, b"\x7f\x7f"), esc(4, "é😀é😀"),
    esc(2, b"\xff\xfe\xff\xfe"), esc(1, "%41"), esc(3, "%2f%2F"), esc(5, "a b\nc"), esc(0, ""),
    esc(255, "only a"), esc(2, "a%"), esc(3, "a%2"), esc(6, "node-1/7node-1"), esc(3, "k/hk/h"),
    esc(1, "\r\n"), esc(4, "%0A%0a"),
]
write("key_escape", key_escape)

from_input = [
    "a\nb c\r\nd", "a\n", "", "a\n\nb\n", b"a\nb\n\xff\n", "ok\n" + "k" * 4097 + "\n", "k" * 4096,
    "\n", "\r\n", "a\r\r\n", "a\rb\n", " \n", "a\tb\n", "x\x00y\n", "a/b%2F\n", "é\n😀\n",
    "\r", "a\n\r", "last line without newline", "dup\ndup\n", b"\xef\xbb\xbfbom\n",
    "a\r\nb\r\n", "\n\n",
]
write("from_input", from_input)

# http_body: <route selector><body>. Routes: 0 create pool, 1 acquire p, 2 release p,
# 3 open session, 4 acquire in a missing pool.
def hb(route, body):
    body = body if isinstance(body, bytes) else body.encode()
    return bytes([route]) + body


http_body = [
    hb(0, sj()), hb(0, sj(name="q", max=5)), hb(0, sj(min=10, max=1)), hb(0, sj(strategy="nope")),
    hb(0, sj(reserved=[[5, 2]])), hb(0, sj(name="p", max=99)), hb(0, sj(bogus=1)), hb(0, "{"),
    hb(1, '{"key":"k","holder":"h"}'), hb(1, '{"keys":["a","b/c"],"holder":"h"}'),
    hb(1, '{"keys":[],"holder":"h"}'), hb(1, '{"key":"k"}'), hb(1, '{"key":"","holder":"h"}'),
    hb(1, '{"key":"k","session":"nope"}'), hb(1, '{"key":"k","holder":"h","session":"s"}'),
    hb(1, '{"key":"k","keys":["k"],"holder":"h"}'), hb(1, '{"key":"a%2F","holder":"h/1"}'),
    hb(2, '{"key":"k","holder":"h"}'), hb(2, '{"keys":["k","k"],"holder":"h"}'),
    hb(3, '{"ttl":30}'), hb(3, '{"ttl":0}'), hb(3, '{"ttl":18446744073709551615}'),
    hb(3, '{"ttl":86401}'), hb(4, '{"key":"k","holder":"h"}'), hb(1, ""), hb(1, "null"),
    hb(1, '{"key":"' + "k" * 5000 + '","holder":"h"}'), hb(3, b"\xff"),
]
write("http_body", http_body)


# damaged_file: 0 + whole file; 1 + u32 LE length (cut of the clean file); 2 + patches
# (<offset u32 LE><len byte><bytes>).
def patch(*ps):
    out = b"\x02"
    for at, data in ps:
        out += struct.pack("<I", at) + bytes([len(data)]) + data
    return out


def cut(n):
    return b"\x01" + struct.pack("<I", n)


damaged = [
    b"\x00", b"\x00not a store file", b"\x00" + b"\x00" * 64, b"\x00redb\x1a\x0a\xa9\x0d\x0a",
    cut(0), cut(1), cut(9), cut(64), cut(512), cut(4096), cut(8192), cut(0x7FFFFFFF),
    patch((0, b"\x00" * 8)), patch((9, b"\xff" * 8)), patch((32, b"\x00" * 32)),
    patch((64, b"\xff" * 16)), patch((100, b"\x01")), patch((320, b"\xff" * 8)),
    patch((4096, b"\xff" * 8)), patch((4096 + 8, b"\x00" * 8)), patch((8192, b"\x41" * 16)),
    patch((12288, b"\xff" * 8)), patch((16384, b"\x00" * 8)), patch((0xFFFFFFF0, b"\x07" * 8)),
    patch((200, b"\xff"), (4100, b"\x00"), (9000, b"\x80")), b"\x02",
]
write("damaged_file", damaged)
