#!/usr/bin/env python3
"""A small idalloc client for Python, standard library only.

Talks to `idalloc serve` (see docs/api.md). A Session holds IDs for as long as it is kept alive:
if this process dies, its references vanish after the session's TTL, exactly as they would for a
process linking the Rust library.

    from idalloc_client import Client
    c = Client("http://127.0.0.1:7379")
    c.create_pool("vni", 4096, 16777215)
    with c.session(ttl=15) as s:          # keeps itself alive in a background thread
        vni = s.acquire("vni", "tenant-blue")
        ...
        s.release("vni", "tenant-blue")

Run `python3 idalloc_client.py --demo URL` for a demonstration that prints one JSON line per step.
"""

import json
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request


class IdallocError(Exception):
    """An error answer of the service: HTTP status, kind (e.g. "exhausted") and message."""

    def __init__(self, status, kind, message):
        super().__init__(f"{status} {kind}: {message}")
        self.status, self.kind, self.message = status, kind, message


class Client:
    def __init__(self, base_url, timeout=30.0):
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            try:
                err = json.load(e)
            except ValueError:
                err = {"kind": "unknown", "message": str(e)}
            raise IdallocError(e.code, err.get("kind"), err.get("message")) from None

    def create_pool(self, name, min_id, max_id, **spec):
        return self._call("POST", "/v1/pools", dict(name=name, min=min_id, max=max_id, **spec))

    def get(self, pool, key):
        """The ID of key, or None."""
        try:
            q = urllib.parse.quote(key, safe="")
            return self._call("GET", f"/v1/pools/{pool}/keys/{q}")["id"]
        except IdallocError as e:
            if e.kind == "not_found":
                return None
            raise

    def acquire_durable(self, pool, key, holder):
        return self._call("POST", f"/v1/pools/{pool}/acquire", {"key": key, "holder": holder})["id"]

    def release_durable(self, pool, key, holder):
        return self._call("POST", f"/v1/pools/{pool}/release", {"key": key, "holder": holder})

    def session(self, ttl=15, auto_keepalive=True):
        return Session(self, ttl, auto_keepalive)


class Session:
    """Leased references: they vanish when the session ends or is not renewed for `ttl` seconds."""

    def __init__(self, client, ttl, auto_keepalive):
        self.client = client
        info = client._call("POST", "/v1/sessions", {"ttl": ttl})
        self.id, self.holder, self.ttl = info["session"], info["holder"], info["ttl"]
        self._stop = threading.Event()
        self._thread = None
        if auto_keepalive:
            self._thread = threading.Thread(target=self._renew, daemon=True)
            self._thread.start()

    def _renew(self):
        # Renew every third of the TTL, so one lost renewal does not lose the session.
        while not self._stop.wait(self.ttl / 3):
            try:
                self.keepalive()
            except IdallocError as e:
                if e.kind == "session_not_found":
                    return
            except OSError:
                pass  # the service is unreachable: try again next period

    def keepalive(self):
        return self.client._call("PUT", f"/v1/sessions/{self.id}/keepalive")

    def acquire(self, pool, key):
        return self.client._call("POST", f"/v1/pools/{pool}/acquire",
                                 {"key": key, "session": self.id})["id"]

    def acquire_many(self, pool, keys):
        r = self.client._call("POST", f"/v1/pools/{pool}/acquire", {"keys": keys, "session": self.id})
        return {x["key"]: x["id"] for x in r["results"]}

    def release(self, pool, key):
        return self.client._call("POST", f"/v1/pools/{pool}/release", {"key": key, "session": self.id})

    def end(self):
        self._stop.set()
        return self.client._call("DELETE", f"/v1/sessions/{self.id}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()


def demo(base):
    c = Client(base)
    show = lambda **kv: print(json.dumps(kv), flush=True)
    c.create_pool("demo", 1, 1000)
    show(step="pool", pool="demo")
    s = c.session(ttl=10, auto_keepalive=False)
    show(step="session", holder=s.holder, ttl=s.ttl)
    i = s.acquire("demo", "tenant/blue")
    show(step="acquire", key="tenant/blue", id=i)
    assert c.get("demo", "tenant/blue") == i
    show(step="keepalive", ttl=s.keepalive()["ttl"])
    r = s.release("demo", "tenant/blue")
    show(step="release", held=r["held"], reclaimed=r["reclaimed"])
    s.end()
    show(step="end")
    try:
        s.keepalive()
        raise SystemExit("keepalive of an ended session succeeded")
    except IdallocError as e:
        assert e.status == 404 and e.kind == "session_not_found", e


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--demo":
        demo(sys.argv[2])
    else:
        sys.exit("usage: idalloc_client.py --demo http://127.0.0.1:7379")
