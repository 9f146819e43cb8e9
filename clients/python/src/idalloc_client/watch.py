"""A pool's bindings kept locally, fed by the service's watch (Server-Sent Events)."""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import urllib.error
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .client import Binding, Pool, backoff_delay

log = logging.getLogger("idalloc_client")

UPSERT, DELETE, SYNCED, SPEC = "upsert", "delete", "synced", "spec"


@dataclass(frozen=True)
class Event:
    """A change of the pool's bindings as the view saw it: ``type`` is ``upsert`` (key bound to
    id), ``delete`` (the binding ended), ``synced`` (the view holds the whole pool) or ``spec``
    (the pool was resized: ``spec`` is the spec now in force, as ``show_pool`` gives it)."""

    type: str
    id: int = 0
    key: str = ""
    spec: Optional[Dict[str, Any]] = field(default=None, hash=False)


@dataclass(frozen=True)
class Msg:
    """One parsed message of the watch stream: upsert, delete, synced, spec, lagged, gone or
    other."""

    kind: str
    id: int = 0
    key: str = ""
    revision: int = 0
    spec: Optional[Dict[str, Any]] = field(default=None, hash=False)


def parse_event(event: str, data: str) -> Msg:
    """Parses one SSE event (name and data); ValueError names what is wrong."""
    try:
        if event in (UPSERT, DELETE):
            c = json.loads(data)
            return Msg(event, int(c["id"]), str(c["key"]))
        if event == SYNCED:
            return Msg(SYNCED, revision=int(json.loads(data)["revision"]))
        if event == SPEC:
            d = json.loads(data)
            spec = d["spec"]
            if not isinstance(spec, dict):
                raise TypeError(f"spec is {type(spec).__name__}, not an object")
            return Msg(SPEC, revision=int(d["revision"]), spec=spec)
        if event == "error":
            e = json.loads(data)
            if e.get("kind") == "lagged" and e.get("revision") is not None:
                return Msg("lagged", revision=int(e["revision"]))
            return Msg("gone")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{event} event with data {data}: {e}") from None
    return Msg("other")


class ViewState:
    """The bindings both ways. Pure: messages in, events out (the I/O is in :class:`View`).

    A stream opened without a revision lists the pool as of one revision R, then ``synced`` with
    id R: the listing is collected apart and swapped in whole at ``synced``, with events for the
    differences only, so a re-listing (after 410 gone, a failover to a replica whose history does
    not reach back) keeps answering from the old bindings until it is complete. A resumed stream
    sends the changes after its Last-Event-ID, applied as they come."""

    def __init__(self) -> None:
        self.by_key: Dict[str, int] = {}
        self.by_id: Dict[int, str] = {}
        self.revision = 0
        self.synced = False
        self.listing: Optional[Dict[int, str]] = None
        # The spec the last ``spec`` event brought (None before any resize was seen).
        self.spec: Optional[Dict[str, Any]] = None

    def resume_from(self) -> int:
        return self.revision if self.synced and self.revision > 0 else 0

    def opening(self, resume: bool) -> None:
        self.listing = None if resume else {}

    def forget(self) -> None:
        self.revision, self.synced = 0, False

    def apply(self, m: Msg, sse_id: str) -> List[Event]:
        out: List[Event] = []
        if m.kind == UPSERT:
            if self.listing is not None:
                self.listing[m.id] = m.key
            else:
                self._upsert(m.id, m.key, out)
        elif m.kind == DELETE:
            if self.listing is not None:
                self.listing.pop(m.id, None)
            else:
                self._delete(m.id, m.key, out)
        elif m.kind == SYNCED:
            if self.listing is not None:
                self._swap_in(self.listing, out)
                self.listing = None
            self.revision, self.synced = m.revision, True
            out.append(Event(SYNCED))
        elif m.kind == "lagged":
            if self.listing is None:
                self.revision = max(self.revision, m.revision)
        elif m.kind == "gone":
            self.forget()
        elif m.kind == SPEC:
            self.spec = m.spec
            out.append(Event(SPEC, spec=m.spec))
        if self.listing is None and self.synced and sse_id.strip().isdigit():
            self.revision = max(self.revision, int(sse_id.strip()))
        return out

    def _upsert(self, id: int, key: str, out: List[Event]) -> None:
        if self.by_id.get(id) == key:
            return
        old = self.by_key.get(key)
        if old is not None:
            self.by_id.pop(old, None)
        old_key = self.by_id.get(id)
        if old_key is not None:
            self.by_key.pop(old_key, None)
        self.by_id[id], self.by_key[key] = key, id
        out.append(Event(UPSERT, id, key))

    def _delete(self, id: int, key: str, out: List[Event]) -> None:
        if self.by_id.get(id) != key:
            return  # stale: the ID is bound to another key now
        del self.by_id[id]
        self.by_key.pop(key, None)
        out.append(Event(DELETE, id, key))

    def _swap_in(self, listing: Dict[int, str], out: List[Event]) -> None:
        for id, key in sorted((i, k) for i, k in self.by_id.items() if listing.get(i) != k):
            self._delete(id, key, out)
        for id in sorted(listing):
            self._upsert(id, listing[id], out)

    def snapshot(self) -> List[Binding]:
        return [Binding(i, self.by_id[i]) for i in sorted(self.by_id)]


class View:
    """A local copy of a pool's bindings: ``get``/``key_of`` answer from memory. A background
    thread follows the watch stream: a broken stream resumes from the last revision the view
    has all of (Last-Event-ID) on the next endpoint, after a random wait of up to the backoff
    base (agents of a replica that died do not all arrive at the next one at once); 410 gone
    re-lists (the listing swapped in whole, events for the differences only); a stream ended for
    lagging resumes from the revision it names; a stream silent for ``watch_idle_timeout`` is
    taken as dead. ``close()`` stops it."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._state = ViewState()
        self._lock = threading.Lock()
        self._subs: List["queue.Queue[Event]"] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._follow, name=f"idalloc-watch-{pool.name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"View(pool={self.pool.name!r}, bindings={len(self)})"

    def get(self, key: str) -> Optional[int]:
        with self._lock:
            return self._state.by_key.get(key)

    def key_of(self, id: int) -> Optional[str]:
        with self._lock:
            return self._state.by_id.get(id)

    def snapshot(self) -> List[Binding]:
        with self._lock:
            return self._state.snapshot()

    def __len__(self) -> int:
        with self._lock:
            return len(self._state.by_id)

    @property
    def revision(self) -> int:
        with self._lock:
            return self._state.revision

    @property
    def spec(self) -> Optional[Dict[str, Any]]:
        """The pool's spec as the last ``spec`` event brought it (a resize seen while watching),
        or None if the view has seen none (the spec is then ``show_pool``'s)."""
        with self._lock:
            return None if self._state.spec is None else dict(self._state.spec)

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the view held the whole pool once (True) or ``timeout`` passes."""
        return self._synced.wait(timeout)

    def subscribe(self, maxsize: int = 0) -> "queue.Queue[Event]":
        """A queue of the view's events from now on. With ``maxsize`` a full queue drops the
        oldest event (a subscriber that does not read cannot stall the view)."""
        q: "queue.Queue[Event]" = queue.Queue(maxsize)
        with self._lock:
            self._subs.append(q)
        return q

    def close(self) -> None:
        self._stop.set()
        r = self._resp
        if r is not None:
            try:  # wakes a read blocked on the stream
                r.fp.raw._sock.shutdown(socket.SHUT_RDWR)
            except Exception:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.pool.client.timeout + 5)

    def __enter__(self) -> "View":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _publish(self, events: List[Event]) -> None:
        for e in events:
            if e.type == SYNCED:
                self._synced.set()
            with self._lock:
                subs = list(self._subs)
            for q in subs:
                while True:
                    try:
                        q.put_nowait(e)
                        break
                    except queue.Full:
                        try:
                            q.get_nowait()
                        except queue.Empty:
                            pass

    def _follow(self) -> None:
        c = self.pool.client
        failed_opens = 0
        while not self._stop.is_set():
            with self._lock:
                resume = self._state.resume_from()
                self._state.opening(resume > 0)
            i = c._index()
            end, streamed = self._stream(i, resume)
            if end == "stop":
                return
            if end == "relist":
                with self._lock:
                    self._state.forget()
                failed_opens, wait = 0, c.backoff_base * c._unit()
            elif end == "resume":
                failed_opens, wait = 0, 0.0
            else:
                c._advance(i)
                if streamed:
                    failed_opens, wait = 0, c.backoff_base * c._unit()
                else:
                    failed_opens += 1
                    wait = backoff_delay(c.backoff_base, c.backoff_max, failed_opens,
                                         len(c.endpoints), 0.0, c._unit())
            if self._stop.wait(wait):
                return

    def _stream(self, i: int, resume: int) -> Tuple[str, bool]:
        c = self.pool.client
        headers = c._headers(False)
        headers["accept"] = "text/event-stream"
        if resume:
            headers["last-event-id"] = str(resume)
        try:
            resp = c._open(i, "GET", f"{self.pool._path}/watch", None, c.timeout, headers)
        except urllib.error.HTTPError as e:
            e.close()
            return ("relist" if e.code == 410 else "failed"), False
        except Exception as e:  # no answer: the next endpoint
            log.debug("watch of %s on %s failed: %s", self.pool.name, c.endpoints[i], e)
            return "failed", False
        self._resp = resp
        try:
            try:  # from now on a read may wait up to the idle timeout
                resp.fp.raw._sock.settimeout(c.watch_idle_timeout)
            except Exception:
                pass
            event, data, sse_id = "", [], ""
            while not self._stop.is_set():
                raw = resp.readline()
                if not raw:
                    return "failed", True
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line:
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        event = value
                    elif field == "data":
                        data.append(value)
                    elif field == "id":
                        sse_id = value
                    continue
                if not event and not data and not sse_id:
                    continue
                try:
                    m = parse_event(event or "message", "\n".join(data))
                except ValueError as e:
                    log.warning("unreadable watch event; re-opening the stream: %s", e)
                    return "failed", True
                with self._lock:
                    out = self._state.apply(m, sse_id)
                event, data, sse_id = "", [], ""
                self._publish(out)
                if m.kind == "gone":
                    return "relist", True
                if m.kind == "lagged":
                    return "resume", True
            return "stop", True
        except Exception as e:  # a broken or silent stream
            if self._stop.is_set():
                return "stop", True
            log.debug("watch stream of %s broke: %s", self.pool.name, e)
            return "failed", True
        finally:
            self._resp = None
            try:
                resp.close()
            except Exception:
                pass
