"""Client sessions: leased references that vanish when the client stops renewing them."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Sequence

from .client import MAX_SESSION_TTL, Acquired, Client, Pool, Released
from .errors import IdallocError, InvalidInput, SessionLost, SessionNotFound

log = logging.getLogger("idalloc_client")


def renewal_wait(ttl: float, n: int, failed: bool, unit: float) -> float:
    """The wait before renewal ``n`` (0 is the first): every ttl/3, the first at a random point
    of the first third (sessions opened together then renew spread out), and after a renewal
    that failed on every endpoint at a random point of the next ttl/9. Pure."""
    if failed:
        return ttl / 9 * unit
    if n == 0:
        return ttl / 3 * unit
    return ttl / 3


class Session:
    """A client session of ``idalloc serve``: its references are on a lease that the store
    expires when the session is not renewed for ``ttl`` seconds (this process died or was cut
    off), so the IDs go back to their pools. It renews itself every ttl/3 from a background
    thread, through any replica (one that never saw the session adopts it).

    When the service says the session is gone, ``lost`` is set, ``error`` says why (a
    :class:`SessionLost`) and ``on_lost`` (if given) is called once from the renewal thread; the
    references are gone: open a new session and acquire again. The session id is a secret: it
    is in no exception text, ``repr`` or log line."""

    def __init__(self, client: Client, ttl: int = 15, auto_keepalive: bool = True,
                 on_lost: Optional[Callable[["Session"], Any]] = None) -> None:
        if not isinstance(ttl, int) or not 1 <= ttl <= MAX_SESSION_TTL:
            raise InvalidInput(0, "invalid_input",
                               f"session TTL {ttl!r} is not allowed: whole seconds from 1 to {MAX_SESSION_TTL}")
        self.client = client
        info = client.call("session open", "POST", "/v1/sessions", {"ttl": ttl})
        self._id: str = info["session"]
        self.holder: str = info["holder"]
        self.ttl: int = int(info.get("ttl") or ttl)
        self.lost = threading.Event()
        self.error: Optional[SessionLost] = None
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._lost_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if auto_keepalive:
            self._thread = threading.Thread(target=self._renew, name="idalloc-session", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:
        return f"Session(holder={self.holder!r}, ttl={self.ttl}, lost={self.lost.is_set()})"

    __str__ = __repr__

    def _path(self) -> str:
        return f"/v1/sessions/{self._id}"

    def _mark_lost(self, cause: str) -> None:
        with self._lost_lock:
            if self.lost.is_set():
                return
            self.error = SessionLost(404, "session_not_found", f"session {self.holder} is lost: {cause}")
            self.lost.set()
        log.warning("idalloc session %s lost: %s", self.holder, cause)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:  # a callback's failure must not kill the renewals' thread
                log.exception("on_lost callback of session %s failed", self.holder)

    def _call(self, op: str, method: str, path: str, body: Any = None) -> Any:
        try:
            return self.client.call(op, method, path, body, secret=self._id)
        except SessionNotFound as e:
            self._mark_lost(e.message)
            raise

    def _renew(self) -> None:
        failed, n = False, 0
        while not self._stop.wait(renewal_wait(self.ttl, n, failed, self.client._unit())):
            n += 1
            try:
                self.keepalive()
                failed = False
            except SessionNotFound:
                return
            except IdallocError as e:
                failed = True
                log.warning("renewing idalloc session %s failed: %s", self.holder, e)

    def keepalive(self) -> Any:
        """Renews the session now (the background thread does so every ttl/3)."""
        return self._call("session keepalive", "PUT", self._path() + "/keepalive")

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the session is lost (True) or ``timeout`` passes (False)."""
        return self.lost.wait(timeout)

    def acquire(self, pool: "Pool | str", key: str) -> int:
        """References ``key`` on this session and returns its ID (idempotent per session)."""
        return self.acquire_one(pool, key).id

    def acquire_one(self, pool: "Pool | str", key: str) -> Acquired:
        p = self._pool(pool)
        try:
            r = p._one("acquire", key, {"session": self._id}, self._id)
        except SessionNotFound as e:
            self._mark_lost(e.message)
            raise
        return Acquired(r["key"], r["id"], r["new"])

    def acquire_many(self, pool: "Pool | str", keys: Sequence[str]) -> "dict[str, int]":
        """Acquires every key (in requests of at most 1000); a dict key → ID."""
        return {a.key: a.id for a in self.acquire_many_results(pool, keys)}

    def acquire_many_results(self, pool: "Pool | str", keys: Sequence[str]) -> List[Acquired]:
        p = self._pool(pool)
        try:
            rs = p._keys_call("acquire", keys, {"session": self._id}, self._id)
        except SessionNotFound as e:
            self._mark_lost(e.message)
            raise
        return [Acquired(r["key"], r["id"], r["new"]) for r in rs]

    def release(self, pool: "Pool | str", key: str) -> Released:
        """Removes this session's reference to ``key`` (``held`` False if it had none)."""
        p = self._pool(pool)
        try:
            r = p._one("release", key, {"session": self._id}, self._id)
        except SessionNotFound as e:
            self._mark_lost(e.message)
            raise
        return Released(r["key"], r["held"], r["reclaimed"])

    def release_many(self, pool: "Pool | str", keys: Sequence[str]) -> List[Released]:
        p = self._pool(pool)
        try:
            rs = p._keys_call("release", keys, {"session": self._id}, self._id)
        except SessionNotFound as e:
            self._mark_lost(e.message)
            raise
        return [Released(r["key"], r["held"], r["reclaimed"]) for r in rs]

    def _pool(self, pool: "Pool | str") -> Pool:
        return pool if isinstance(pool, Pool) else self.client.pool(pool)

    def close(self) -> None:
        """Stops the renewals without ending the lease: the references vanish after the TTL."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def end(self) -> Any:
        """Stops the renewals and revokes the lease: the references vanish at once."""
        self.close()
        try:
            r = self.client.call("session end", "DELETE", self._path(), secret=self._id)
        except SessionNotFound:
            r = {"ended": True}  # ended already (a retried end whose answer was lost)
        with self._lost_lock:
            if not self.lost.is_set():
                self.error = SessionLost(404, "session_not_found", f"session {self.holder} was ended")
                self.lost.set()
        return r

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end()
