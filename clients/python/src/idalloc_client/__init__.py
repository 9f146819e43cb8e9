"""A client of ``idalloc serve`` for Python, standard library only (Python >= 3.9).

Talks to the service's HTTP API (docs/guide/api.md). A :class:`Session` holds IDs for as long as it is
renewed: if this process dies, its references vanish after the session's TTL, exactly as they
would for a process linking the Rust library.

    from idalloc_client import Client, Exhausted
    c = Client(["http://10.0.0.1:7379", "http://10.0.0.2:7379"])   # fails over between them
    c.ensure_pool("vni", 4096, 16777215)
    vni = c.pool("vni")
    view = vni.watch()                      # a local copy, fed by the service's watch
    with c.session(ttl=15) as s:            # renewed in a background thread
        i = s.acquire(vni, "tenant-blue")
        view.wait_synced(30)
        ...
        s.release(vni, "tenant-blue")

A service run with --auth-tokens and TLS (docs/guide/security.md) takes a bearer token, a CA file and,
for mutual TLS, a client certificate:

    c = Client("https://idalloc.example:7379", token=open("/run/secrets/idalloc-token").read().strip(),
               cafile="/etc/idalloc/ca.crt", certfile="/etc/idalloc/agent.crt",
               keyfile="/etc/idalloc/agent.key")

Every error is an :class:`IdallocError` (one subclass per kind of the service's errors, and
:class:`TransportError` when no endpoint answered).
"""

from .client import (MAX_KEYS_PER_REQUEST, MAX_SESSION_TTL, Acquired, Binding, Client, Page,
                     Pool, Released)
from .errors import (AccessDenied, BadAnswer, Conflict, Corrupt, Exhausted, Forbidden, Gone,
                     HolderReserved, IdallocError, Internal, InvalidInput, MethodNotAllowed,
                     NotFound, Overloaded, PoolInUse, PoolNotFound, PoolReplaced, QuotaExceeded,
                     RangeMismatch, RateLimited, SessionLost, SessionNotFound, TooLarge,
                     TransportError, Unauthenticated, Unavailable, UnsupportedMediaType)
from .session import Session
from .watch import Event, View

__all__ = [
    "MAX_KEYS_PER_REQUEST", "MAX_SESSION_TTL", "Acquired", "Binding", "Client", "Page", "Pool",
    "Released", "Session", "Event", "View", "AccessDenied", "BadAnswer", "Conflict", "Corrupt",
    "Exhausted", "Forbidden", "Gone", "HolderReserved", "IdallocError", "Internal",
    "InvalidInput", "MethodNotAllowed", "NotFound", "Overloaded", "PoolInUse", "PoolNotFound",
    "PoolReplaced", "QuotaExceeded", "RangeMismatch", "RateLimited", "SessionLost",
    "SessionNotFound", "TooLarge", "TransportError", "Unauthenticated", "Unavailable",
    "UnsupportedMediaType",
]
