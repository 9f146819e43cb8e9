#!/usr/bin/env python3
"""A small idalloc client for Python, standard library only.

Talks to `idalloc serve` (see docs/guide/api.md). A Session holds IDs for as long as it is kept alive:
if this process dies, its references vanish after the session's TTL, exactly as they would for a
process linking the Rust library.

    from idalloc_client import Client
    c = Client("http://127.0.0.1:7379")
    c.create_pool("vni", 4096, 16777215)
    with c.session(ttl=15) as s:          # keeps itself alive in a background thread
        vni = s.acquire("vni", "tenant-blue")
        ...
        s.release("vni", "tenant-blue")

A service run with --auth-tokens and TLS (docs/guide/security.md) takes a bearer token and a CA file:

    c = Client("https://idalloc.example:7379", token=open("/run/secrets/idalloc-token").read().strip(),
               cafile="/etc/idalloc/ca.crt")       # certfile/keyfile too when it wants a client cert

Run `python3 idalloc_client.py --demo URL [--token-file F] [--cafile F]` for a demonstration that
prints one JSON line per step.
"""

import json
import ssl
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
    def __init__(self, base_url, timeout=30.0, token=None, cafile=None, certfile=None,
                 keyfile=None):
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.headers = {"content-type": "application/json"}
        if token:
            self.headers["authorization"] = "Bearer " + token
        self.context = None
        if cafile or certfile:
            self.context = ssl.create_default_context(cafile=cafile)
            if certfile:
                self.context.load_cert_chain(certfile, keyfile)

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as r:
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


def demo(base, token=None, cafile=None):
    c = Client(base, token=token, cafile=cafile)
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
    args = sys.argv[1:]
    opts = dict(zip(args[2::2], args[3::2]))
    if len(args) >= 2 and args[0] == "--demo" and len(args) % 2 == 0 \
            and set(opts) <= {"--token-file", "--cafile"}:
        token = None
        if "--token-file" in opts:
            with open(opts["--token-file"]) as f:
                token = f.read().strip()
        demo(args[1], token=token, cafile=opts.get("--cafile"))
    else:
        sys.exit("usage: idalloc_client.py --demo URL [--token-file FILE] [--cafile FILE]")
