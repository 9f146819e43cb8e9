"""The client, its transport (failover and retries) and pool handles."""

from __future__ import annotations

import http.client
import json
import random
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import errors
from .errors import IdallocError, InvalidInput, NotFound, PoolNotFound, TransportError

MAX_KEYS_PER_REQUEST = 1000
MAX_SESSION_TTL = 86400
_POOL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@dataclass(frozen=True)
class Acquired:
    """The answer to an acquire: the key's ID, and whether this call bound it."""

    key: str
    id: int
    new: bool


@dataclass(frozen=True)
class Released:
    """The answer to a release: whether the holder held the key, and whether its ID went back."""

    key: str
    held: bool
    reclaimed: bool


@dataclass(frozen=True)
class Binding:
    """A key with its ID and the holders referencing it."""

    id: int
    key: str
    holders: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Page:
    """One page of a pool's bindings in ID order; ``next_after`` is None on the last one."""

    bindings: List[Binding] = field(default_factory=list)
    next_after: Optional[int] = None


def backoff_delay(base: float, cap: float, attempt: int, endpoints: int, retry_after: float,
                  unit: float) -> float:
    """The wait before ``attempt`` (0 never waits) over ``endpoints`` endpoints: every endpoint
    once without waiting, then steps from ``base`` doubling to ``cap`` with full jitter (``unit``
    in [0, 1]), never shorter than the service's ``Retry-After``. Pure, so it is tested alone."""
    n = max(endpoints, 1)
    d = 0.0
    if attempt >= n:
        step = base * (2 ** min(attempt // n - 1, 62))
        d = min(step, cap) * unit
    return max(d, retry_after)


def check_pool(name: str) -> None:
    if not isinstance(name, str) or not _POOL_NAME.fullmatch(name):
        raise InvalidInput(0, "invalid_input",
                           f"pool name {name!r} is not allowed: [a-z0-9][a-z0-9._-]{{0,62}}")


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key.encode("utf-8", "surrogatepass")) > 4096:
        raise InvalidInput(0, "invalid_input",
                           f"key {key!r} is not allowed: non-empty UTF-8 of at most 4096 bytes")


def check_holder(holder: str) -> None:
    if not isinstance(holder, str) or not holder:
        raise InvalidInput(0, "invalid_input", f"holder {holder!r} is not allowed: a non-empty name")


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _redact(text: str, secret: Optional[str]) -> str:
    return text.replace(secret, "<session>") if secret else text


class Client:
    """A client of one ``idalloc serve`` deployment: one or more replicas sharing a store.

    ``endpoints`` is a URL or a list of them (http:// or https://), tried in order and failed
    over between. Thread-safe. A call is retried on the next endpoint on no answer, 503
    (unavailable, overloaded, a proxy's 502–504), 429 rate_limited (not before Retry-After) and
    409 pool_replaced: each endpoint once without waiting, then exponential backoff with full
    jitter, ``attempts`` in all. Nothing else is retried; every call it makes is safe to repeat.
    """

    def __init__(self, endpoints: Union[str, Sequence[str]], *, token: Optional[str] = None,
                 cafile: Optional[str] = None, certfile: Optional[str] = None,
                 keyfile: Optional[str] = None, timeout: float = 10.0, attempts: int = 8,
                 backoff_base: float = 0.1, backoff_max: float = 2.0,
                 watch_idle_timeout: float = 45.0) -> None:
        eps = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not eps:
            raise InvalidInput(0, "invalid_input", "endpoints: at least one endpoint is needed")
        self.endpoints: List[str] = []
        for e in eps:
            u = urllib.parse.urlsplit(e)
            if u.scheme not in ("http", "https") or not u.netloc or u.query or u.fragment:
                raise InvalidInput(0, "invalid_input",
                                   f"endpoint {e!r} is not allowed: an http:// or https:// URL of an "
                                   "idalloc serve (e.g. http://127.0.0.1:7379), without query or fragment")
            self.endpoints.append(e.rstrip("/"))
        if attempts < 1 or timeout <= 0 or watch_idle_timeout <= 0 or backoff_base < 0 \
                or backoff_max < backoff_base:
            raise InvalidInput(0, "invalid_input",
                               f"options attempts={attempts} timeout={timeout} "
                               f"watch_idle_timeout={watch_idle_timeout} backoff={backoff_base}..{backoff_max} "
                               "are not allowed: attempts >= 1, positive timeouts, backoff_max >= backoff_base")
        if keyfile and not certfile:
            raise InvalidInput(0, "invalid_input", f"keyfile {keyfile!r} without a certfile")
        self.timeout, self.attempts = timeout, attempts
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.watch_idle_timeout = watch_idle_timeout
        self._token = token
        self._context: Optional[ssl.SSLContext] = None
        if cafile or certfile:
            self._context = ssl.create_default_context(cafile=cafile)
            if certfile:
                self._context.load_cert_chain(certfile, keyfile)
        self._current = 0
        self._lock = threading.Lock()
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"Client(endpoints={self.endpoints!r})"

    # --- transport ---------------------------------------------------------------------------

    def _index(self) -> int:
        with self._lock:
            return self._current % len(self.endpoints)

    def _advance(self, i: int) -> None:
        with self._lock:
            if self._current % len(self.endpoints) == i:
                self._current = (i + 1) % len(self.endpoints)

    def _unit(self) -> float:
        with self._lock:
            return self._rng.random()

    def _headers(self, body: bool) -> Dict[str, str]:
        h = {"accept": "application/json"}
        if body:
            h["content-type"] = "application/json"
        if self._token:
            h["authorization"] = "Bearer " + self._token
        return h

    def _open(self, i: int, method: str, path: str, data: Optional[bytes], timeout: float,
              headers: Dict[str, str]) -> Any:
        req = urllib.request.Request(self.endpoints[i] + path, data=data, method=method,
                                     headers=headers)
        return urllib.request.urlopen(req, timeout=timeout, context=self._context)

    def call(self, op: str, method: str, path: str, body: Any = None,
             secret: Optional[str] = None) -> Any:
        """``method path`` with a JSON body, retried and failed over; the decoded answer.
        ``secret`` (a session id in the path) is redacted from every error text."""
        data = None if body is None else json.dumps(body).encode()
        last = ("", "no attempt")
        for attempt in range(self.attempts):
            i = self._index()
            try:
                with self._open(i, method, path, data, self.timeout, self._headers(data is not None)) as r:
                    raw = r.read()
                try:
                    return json.loads(raw) if raw else None
                except ValueError as e:
                    raise errors.BadAnswer(r.status, "", f"not JSON: {e}", op) from None
            except urllib.error.HTTPError as e:
                status = e.code
                raw = e.read() if e.fp is not None else b""
                retry_after = _retry_after(e.headers.get("Retry-After") if e.headers else None)
                e.close()
                kind, message = None, f"HTTP {status}"
                try:
                    b = json.loads(raw)
                    if isinstance(b, dict) and isinstance(b.get("kind"), str):
                        kind, message = b["kind"], str(b.get("message", ""))
                except ValueError:
                    pass
                err = errors.from_answer(status, kind, _redact(message, secret), op, retry_after)
                if not err.retryable or attempt + 1 == self.attempts:
                    raise err from None
                self._advance(i)
                time.sleep(backoff_delay(self.backoff_base, self.backoff_max, attempt + 1,
                                         len(self.endpoints), retry_after, self._unit()))
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                reason = getattr(e, "reason", None) or e
                last = (self.endpoints[i], _redact(f"{type(e).__name__}: {reason}", secret))
                self._advance(i)
                if attempt + 1 < self.attempts:
                    time.sleep(backoff_delay(self.backoff_base, self.backoff_max, attempt + 1,
                                             len(self.endpoints), 0.0, self._unit()))
        raise TransportError(op, last[0], last[1])

    # --- pools -------------------------------------------------------------------------------

    def ensure_pool(self, name: str, min: int, max: int, **spec: Any) -> Dict[str, Any]:
        """Creates the pool, or succeeds if an equal spec is stored; a different stored spec
        raises :class:`RangeMismatch`. ``spec``: reserved, prefix, strategy, idle_grace_ms,
        reuse_delay_ms. Returns the stored spec."""
        check_pool(name)
        return self.call("pool create", "POST", "/v1/pools", dict(name=name, min=min, max=max, **spec))

    create_pool = ensure_pool

    def show_pool(self, name: str) -> Dict[str, Any]:
        """The pool's spec and usage (capacity, bound, quarantined, used, free)."""
        check_pool(name)
        return self.call("pool show", "GET", f"/v1/pools/{_seg(name)}")

    def list_pools(self) -> List[Dict[str, Any]]:
        """Every pool's spec, sorted by name."""
        return list(self.call("pool list", "GET", "/v1/pools")["pools"])

    def resize_pool(self, name: str, min: int, max: int,
                    reserved: Optional[List[List[int]]] = None) -> Dict[str, Any]:
        """Gives the pool the range [min, max] and, if given, the ``reserved`` ranges (else its
        reserved IDs inside the new range stay). Growing always succeeds; narrowing while an ID it
        would exclude is bound or quarantined raises :class:`PoolInUse` naming the ID and its key.
        Returns the spec now in force."""
        check_pool(name)
        body: Dict[str, Any] = dict(min=min, max=max)
        if reserved is not None:
            body["reserved"] = reserved
        return self.call("pool resize", "PATCH", f"/v1/pools/{_seg(name)}", body)

    def delete_pool(self, name: str, force: bool = False) -> bool:
        """Deletes the pool (with ``force`` its bindings too); False if there was none. A pool
        with records, without force, raises :class:`PoolInUse`."""
        check_pool(name)
        try:
            self.call("pool delete", "DELETE", f"/v1/pools/{_seg(name)}?force={'true' if force else 'false'}")
            return True
        except PoolNotFound:
            return False

    def pool(self, name: str) -> "Pool":
        """A handle on pool ``name`` (no request)."""
        check_pool(name)
        return Pool(self, name)

    def session(self, ttl: int = 15, auto_keepalive: bool = True) -> "Session":
        """Opens a client session of ``ttl`` seconds, renewed in a background thread."""
        from .session import Session
        return Session(self, ttl, auto_keepalive)

    # --- the single-file client's calls, kept -------------------------------------------------

    def get(self, pool: str, key: str) -> Optional[int]:
        """The ID of ``key`` in ``pool`` (the service's cache), or None."""
        return self.pool(pool).lookup(key)

    def acquire_durable(self, pool: str, key: str, holder: str) -> int:
        return self.pool(pool).acquire_durable(holder, key).id

    def release_durable(self, pool: str, key: str, holder: str) -> Released:
        return self.pool(pool).release_durable(holder, key)


def _retry_after(v: Optional[str]) -> float:
    try:
        return float(int((v or "").strip()))
    except ValueError:
        return 0.0


def _chunks(keys: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(keys), MAX_KEYS_PER_REQUEST):
        yield keys[i:i + MAX_KEYS_PER_REQUEST]


class Pool:
    """A handle on one pool: durable references, lookups, listings, watches."""

    def __init__(self, client: Client, name: str) -> None:
        self.client, self.name = client, name
        self._path = f"/v1/pools/{_seg(name)}"

    def __repr__(self) -> str:
        return f"Pool({self.name!r})"

    def _keys_call(self, op: str, keys: Sequence[str], owner: Dict[str, str],
                   secret: Optional[str]) -> List[Dict[str, Any]]:
        for k in keys:
            check_key(k)
        out: List[Dict[str, Any]] = []
        for chunk in _chunks(list(keys)):
            r = self.client.call(op, "POST", f"{self._path}/{op}", dict(keys=list(chunk), **owner), secret)
            out.extend(r["results"])
        return out

    def _one(self, op: str, key: str, owner: Dict[str, str], secret: Optional[str]) -> Dict[str, Any]:
        check_key(key)
        return self.client.call(op, "POST", f"{self._path}/{op}", dict(key=key, **owner), secret)

    def acquire_durable(self, holder: str, key: str) -> Acquired:
        """References ``key`` for the durable ``holder``; idempotent per holder."""
        check_holder(holder)
        r = self._one("acquire", key, {"holder": holder}, None)
        return Acquired(r["key"], r["id"], r["new"])

    def acquire_many_durable(self, holder: str, keys: Sequence[str]) -> List[Acquired]:
        check_holder(holder)
        return [Acquired(r["key"], r["id"], r["new"])
                for r in self._keys_call("acquire", keys, {"holder": holder}, None)]

    def release_durable(self, holder: str, key: str) -> Released:
        """Drops the durable ``holder``'s reference (``held`` False if it had none)."""
        check_holder(holder)
        r = self._one("release", key, {"holder": holder}, None)
        return Released(r["key"], r["held"], r["reclaimed"])

    def release_many_durable(self, holder: str, keys: Sequence[str]) -> List[Released]:
        check_holder(holder)
        return [Released(r["key"], r["held"], r["reclaimed"])
                for r in self._keys_call("release", keys, {"holder": holder}, None)]

    def lookup(self, key: str, consistent: bool = False) -> Optional[int]:
        """``key``'s ID from the service (its store with ``consistent``, else its cache), or None."""
        check_key(key)
        q = "?consistent=true" if consistent else ""
        try:
            return int(self.client.call("lookup", "GET", f"{self._path}/keys/{_seg(key)}{q}")["id"])
        except NotFound:
            return None

    def lookup_id(self, id: int, consistent: bool = False) -> Optional[str]:
        """The key bound to ``id``, or None."""
        q = "?consistent=true" if consistent else ""
        try:
            return str(self.client.call("lookup", "GET", f"{self._path}/ids/{int(id)}{q}")["key"])
        except NotFound:
            return None

    def list_page(self, after: Optional[int] = None, limit: Optional[int] = None) -> Page:
        """One page of bindings with IDs above ``after`` (None: from the start), at most
        ``limit`` (None: the service's default, 1000; at most 10000)."""
        if limit is not None and not 1 <= limit <= 10000:
            raise InvalidInput(0, "invalid_input", f"limit {limit} is not allowed: 1 to 10000")
        q = {}
        if after is not None:
            q["after"] = str(int(after))
        if limit is not None:
            q["limit"] = str(limit)
        path = f"{self._path}/bindings" + ("?" + urllib.parse.urlencode(q) if q else "")
        r = self.client.call("list", "GET", path)
        return Page([Binding(b["id"], b["key"], tuple(b.get("holders", ()))) for b in r["bindings"]],
                    r.get("next_after"))

    def bindings(self, page_size: Optional[int] = None) -> Iterator[Binding]:
        """Every binding, page after page (pages are not at one revision)."""
        after: Optional[int] = None
        while True:
            page = self.list_page(after, page_size)
            yield from page.bindings
            if page.next_after is None:
                return
            after = page.next_after

    def list(self) -> List[Binding]:
        return list(self.bindings())

    def sweep(self) -> int:
        """Reclaims the pool's unreferenced bindings now; how many were reclaimed."""
        return len(self.client.call("sweep", "POST", f"{self._path}/sweep")["reclaimed"])

    def watch(self) -> "View":
        """Starts a local view of the pool fed by the service's watch (see :class:`View`)."""
        from .watch import View
        return View(self)
