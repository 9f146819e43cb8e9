"""``python3 -m idalloc_client --demo URL [--token-file F] [--cafile F]``: a demonstration that
prints one JSON line per step (used by the service's tests)."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

from . import Client, SessionNotFound


def demo(base: str, token: Optional[str] = None, cafile: Optional[str] = None) -> None:
    c = Client(base, token=token, cafile=cafile)

    def show(**kv: Any) -> None:
        print(json.dumps(kv), flush=True)

    c.ensure_pool("demo", 1, 1000)
    show(step="pool", pool="demo")
    s = c.session(ttl=10, auto_keepalive=False)
    show(step="session", holder=s.holder, ttl=s.ttl)
    i = s.acquire("demo", "tenant/blue")
    show(step="acquire", key="tenant/blue", id=i)
    assert c.get("demo", "tenant/blue") == i
    show(step="keepalive", ttl=s.keepalive()["ttl"])
    r = s.release("demo", "tenant/blue")
    show(step="release", held=r.held, reclaimed=r.reclaimed)
    s.end()
    show(step="end")
    try:
        s.keepalive()
        raise SystemExit("keepalive of an ended session succeeded")
    except SessionNotFound as e:
        assert e.status == 404 and e.kind == "session_not_found", e


def main(argv: "list[str]") -> None:
    opts = dict(zip(argv[2::2], argv[3::2]))
    if len(argv) >= 2 and argv[0] == "--demo" and len(argv) % 2 == 0 \
            and set(opts) <= {"--token-file", "--cafile"}:
        token = None
        if "--token-file" in opts:
            with open(opts["--token-file"]) as f:
                token = f.read().strip()
        demo(argv[1], token=token, cafile=opts.get("--cafile"))
    else:
        sys.exit("usage: python3 -m idalloc_client --demo URL [--token-file FILE] [--cafile FILE]")


if __name__ == "__main__":
    main(sys.argv[1:])
