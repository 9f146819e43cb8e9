"""The Python client against a real ``idalloc serve`` on a real etcd (see conftest.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import subprocess
import time
import urllib.error
from pathlib import Path
from typing import Callable

import pytest

import idalloc_client as ia
from idalloc_client.client import backoff_delay
from idalloc_client.session import renewal_wait
from idalloc_client.watch import Event, Msg, ViewState, parse_event


def until(cond: Callable[[], bool], bound: float = 60.0) -> bool:
    """Polls ``cond`` every 20 ms until it holds or ``bound`` seconds (a bound for a loaded
    machine, not an expected delay) pass."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def client(*urls: str, **kw) -> ia.Client:
    kw.setdefault("backoff_base", 0.02)
    kw.setdefault("backoff_max", 0.2)
    return ia.Client(list(urls), **kw)


# --- pure parts ------------------------------------------------------------------------------

def test_every_endpoint_once_without_waiting_then_full_jitter_backoff_to_its_cap() -> None:
    d = lambda attempt, unit: backoff_delay(0.1, 1.0, attempt, 2, 0.0, unit)  # noqa: E731
    assert d(0, 0.9) == 0 and d(1, 0.99) == 0
    assert d(2, 0) == 0 and d(2, 0.25) == pytest.approx(0.025) and d(2, 1) == pytest.approx(0.1)
    assert d(4, 1) == pytest.approx(0.2) and d(40, 1) == 1.0 and d(10**9, 1) == 1.0
    assert backoff_delay(0.1, 1.0, 1, 2, 2.0, 0) == 2.0, "Retry-After is a floor"


def test_renewals_spread_the_first_over_a_third_and_retry_within_a_ninth() -> None:
    assert renewal_wait(9, 0, False, 0.5) == 1.5
    assert renewal_wait(9, 3, False, 0.1) == 3
    assert renewal_wait(9, 3, True, 1) == 1


def test_only_answers_said_to_be_retryable_are_retried() -> None:
    for kind in ("unavailable", "overloaded", "rate_limited", "pool_replaced"):
        assert ia.errors.from_answer(503, kind, "m", "x").retryable, kind
    for kind in ("access_denied", "quota_exceeded", "exhausted", "invalid_input", "internal",
                 "session_not_found"):
        assert not ia.errors.from_answer(409, kind, "m", "x").retryable, kind
    assert ia.errors.from_answer(502, None, "", "x").retryable
    assert not ia.errors.from_answer(404, None, "", "x").retryable
    assert isinstance(ia.errors.from_answer(409, "invalid_input", "m", "x"), ia.PoolInUse)
    assert isinstance(ia.errors.from_answer(409, "exhausted", "m", "x"), ia.Exhausted)


def test_a_listing_is_swapped_in_whole_at_synced_with_only_the_differences() -> None:
    v = ViewState()
    v.opening(False)
    assert v.apply(Msg("upsert", 1, "a"), "") == [], "collected apart"
    v.apply(Msg("upsert", 2, "b"), "")
    assert len(v.apply(Msg("synced", revision=7), "7")) == 3 and v.resume_from() == 7
    v.opening(True)
    v.apply(Msg("delete", 1, "a"), "")
    v.apply(Msg("upsert", 3, "c"), "9")
    assert "a" not in v.by_key and v.by_key["c"] == 3 and v.resume_from() == 9
    v.forget()
    assert v.resume_from() == 0
    v.opening(False)
    v.apply(Msg("upsert", 2, "b"), "")
    v.apply(Msg("upsert", 4, "d"), "")
    assert v.by_key["c"] == 3, "still answering"
    assert v.apply(Msg("synced", revision=12), "12") == [
        Event("delete", 3, "c"), Event("upsert", 4, "d"), Event("synced")]
    assert [(b.id, b.key) for b in v.snapshot()] == [(2, "b"), (4, "d")]


def test_stream_messages_parse_and_bad_ones_are_named() -> None:
    assert parse_event("upsert", '{"id":4,"key":"k","revision":3}') == Msg("upsert", 4, "k")
    assert parse_event("error", '{"kind":"lagged","message":"m","revision":5}') == Msg("lagged", revision=5)
    assert parse_event("error", '{"kind":"gone","message":"m"}').kind == "gone"
    assert parse_event("ping", "x").kind == "other"
    m = parse_event("spec", '{"revision":9,"spec":{"name":"p","min":1,"max":20,"reserved":[[3,4]]}}')
    assert (m.kind, m.revision, m.spec["max"]) == ("spec", 9, 20)
    with pytest.raises(ValueError, match=r'spec event with data \{"revision":9\}'):
        parse_event("spec", '{"revision":9}')
    with pytest.raises(ValueError, match="not an object"):
        parse_event("spec", '{"revision":9,"spec":[1]}')
    with pytest.raises(ValueError, match=r'upsert event with data \{"id":"x"\}'):
        parse_event("upsert", '{"id":"x"}')


def test_bad_options_and_inputs_are_refused_naming_the_value() -> None:
    for bad in ([], ["ftp://x"], ["http://h?x=1"]):
        with pytest.raises(ia.InvalidInput):
            ia.Client(bad)
    c = ia.Client("http://127.0.0.1:9")
    with pytest.raises(ia.InvalidInput, match="Bad Name"):
        c.pool("Bad Name")
    with pytest.raises(ia.InvalidInput, match="key ''"):
        c.pool("p").acquire_durable("h", "")


def test_no_answer_is_a_transport_error_never_a_urlerror() -> None:
    c = ia.Client(["http://127.0.0.1:9", "http://127.0.0.1:9/"], attempts=3, backoff_base=0.001,
                  backoff_max=0.002)
    with pytest.raises(ia.TransportError) as e:
        c.list_pools()
    assert not isinstance(e.value, urllib.error.URLError)
    assert isinstance(e.value, ia.Unavailable) and isinstance(e.value, ia.IdallocError)
    assert e.value.retryable and "127.0.0.1:9" in str(e.value)


# --- against serve ---------------------------------------------------------------------------

def test_pools_are_ensured_shown_listed_and_deleted(start_serve) -> None:
    s = start_serve()
    c = client(s.url())
    spec = dict(reserved=[[10, 11]], strategy="lowest")
    assert c.ensure_pool("vni", 10, 19, **spec)["max"] == 19
    c.ensure_pool("vni", 10, 19, **spec)  # an equal spec is fine
    with pytest.raises(ia.RangeMismatch):
        c.ensure_pool("vni", 10, 29, **spec)
    info = c.show_pool("vni")
    assert info["capacity"] == 8 and info["bound"] == 0
    with pytest.raises(ia.PoolNotFound):
        c.show_pool("nope")
    assert [p["name"] for p in c.list_pools()] == ["vni"]
    c.pool("vni").acquire_durable("cfg", "k")
    grown = c.resize_pool("vni", 10, 29)
    assert (grown["max"], grown["reserved"]) == (29, [[10, 11]])
    with pytest.raises(ia.PoolInUse, match='ID 12 is bound to key "k"'):
        c.resize_pool("vni", 13, 29)
    assert c.show_pool("vni")["capacity"] == 18
    with pytest.raises(ia.PoolInUse):
        c.delete_pool("vni")
    assert c.delete_pool("vni", force=True) is True
    assert c.delete_pool("vni", force=True) is False


def test_durable_and_session_references_lookups_and_paging(start_serve) -> None:
    s = start_serve()
    c = client(s.url())
    c.ensure_pool("p", 1, 1000)
    p = c.pool("p")
    a = p.acquire_durable("cfg", "tenant/blue?#%")
    assert a.new and a.id > 0
    again = p.acquire_durable("cfg", "tenant/blue?#%")
    assert not again.new and again.id == a.id
    assert p.lookup("tenant/blue?#%", consistent=True) == a.id
    assert p.lookup_id(a.id, consistent=True) == "tenant/blue?#%"
    assert p.lookup("missing", consistent=True) is None
    with pytest.raises(ia.HolderReserved):
        p.acquire_durable("session:x", "k")
    with c.session(ttl=10) as sess:
        keys = [f"k-{i:02d}" for i in range(25)]
        got = sess.acquire_many(p, keys)
        assert list(got) == keys and len(set(got.values()) | {a.id}) == 26
        pages, after, listed = 0, None, []
        while True:
            page = p.list_page(after, 10)
            pages += 1
            listed += page.bindings
            if page.next_after is None:
                break
            after = page.next_after
        assert pages == 3 and len(listed) == 26
        for b in listed:
            assert b.holders == (("cfg",) if b.key == "tenant/blue?#%" else (sess.holder,)), b
        assert len(p.list()) == 26
        r = sess.release(p, "k-00")
        assert r.held and r.reclaimed
        assert not sess.release(p, "k-00").held
        assert sess._id not in repr(sess) and sess._id not in str(sess)
    # Ended: the references are gone at once; the sweeper reclaims the IDs.
    assert until(lambda: p.lookup("k-01", consistent=True) is None)
    with pytest.raises(ia.SessionNotFound) as e:
        sess.acquire(p, "late")
    assert sess._id not in str(e.value) and sess._id not in repr(e.value)
    assert p.release_durable("cfg", "tenant/blue?#%").held


def test_a_full_pool_is_exhausted(start_serve) -> None:
    s = start_serve()
    c = client(s.url())
    c.ensure_pool("tiny", 1, 2)
    p = c.pool("tiny")
    p.acquire_many_durable("h", ["a", "b"])
    with pytest.raises(ia.Exhausted) as e:
        p.acquire_durable("h", "c")
    assert e.value.status == 409 and not e.value.retryable


def test_a_view_follows_the_pool_and_reports_events(start_serve) -> None:
    s = start_serve()
    c = client(s.url())
    c.ensure_pool("w", 1, 1000)
    p = c.pool("w")
    before = p.acquire_durable("h", "before")
    with p.watch() as v:
        q = v.subscribe()
        assert v.wait_synced(60)
        assert v.get("before") == before.id
        after = p.acquire_durable("h", "after")
        assert until(lambda: v.key_of(after.id) == "after")
        p.release_durable("h", "after")
        assert until(lambda: v.get("after") is None)
        seen = [q.get(timeout=60) for _ in range(4)]
        assert seen == [Event("upsert", before.id, "before"), Event("synced"),
                        Event("upsert", after.id, "after"), Event("delete", after.id, "after")]


def test_a_resize_during_a_watch_is_a_spec_event(start_serve) -> None:
    s = start_serve()
    c = client(s.url())
    c.ensure_pool("rs", 1, 10)
    p = c.pool("rs")
    with p.watch() as v:
        q = v.subscribe()
        assert v.wait_synced(60)
        assert v.spec is None
        c.resize_pool("rs", 1, 20, [[13, 14]])
        after = p.acquire_durable("h", "after")
        # The service re-lists the pool after a resize: a second synced may come, and is skipped.
        seen = [q.get(timeout=60)]
        while len(seen) < 3:
            e = q.get(timeout=60)
            if e.type != "synced":
                seen.append(e)
        shown = c.show_pool("rs")["spec"]
        assert seen == [Event("synced"), Event("spec", spec=shown), Event("upsert", after.id, "after")]
        assert (shown["max"], shown["reserved"]) == (20, [[13, 14]])
        assert v.spec == shown


def test_a_view_relists_when_the_service_forgot_its_history(start_serve, prefix) -> None:
    s1, s2 = start_serve(prefix), start_serve(prefix)
    c = client(s1.url(), s2.url())
    c.ensure_pool("r", 1, 1000)
    p = c.pool("r")
    kept = p.acquire_durable("h", "kept")
    p.acquire_durable("h", "gone")
    with p.watch() as v:
        assert v.wait_synced(60)
        rev = v.revision
        q = v.subscribe()
        s1.kill()  # the stream moves to s2, which never watched the pool: 410, re-list
        p.release_durable("h", "gone")
        added = p.acquire_durable("h", "added")
        assert until(lambda: v.get("gone") is None and v.get("added") == added.id), v.snapshot()
        assert v.get("kept") == kept.id and v.revision > rev
        while True:
            e = q.get(timeout=60)
            assert e.key != "kept", f"an unchanged binding is no event: {e}"
            if e == Event("upsert", added.id, "added"):
                break


def test_a_lost_session_is_reported(start_serve, caplog) -> None:
    s = start_serve()
    c = client(s.url())
    told = []
    sess = ia.Session(c, ttl=3, on_lost=told.append)
    try:
        # An admin ends it by its holder name, as an operator would; the next renewal learns it.
        c.call("session end", "DELETE", f"/v1/sessions/{sess.holder}")
        with caplog.at_level(logging.DEBUG, logger="idalloc_client"):
            assert sess.wait_lost(60), "the loss was never reported"
            assert until(lambda: told == [sess])
        assert isinstance(sess.error, ia.SessionLost)
        assert sess._id not in str(sess.error) and sess._id not in caplog.text
    finally:
        sess.close()


def test_failover_when_one_of_two_replicas_is_killed(start_serve, prefix) -> None:
    s1, s2 = start_serve(prefix), start_serve(prefix)
    c = client(s1.url(), s2.url())
    c.ensure_pool("f", 1, 100000)
    p = c.pool("f")
    sess = c.session(ttl=3)
    try:
        with p.watch() as v:
            first = sess.acquire_one(p, "first")
            assert c._index() == 0 and v.wait_synced(60)
            s1.kill()
            again = sess.acquire_one(p, "first")
            assert again.id == first.id and not again.new, "the same ID through the other replica"
            assert c._index() == 1
            second = sess.acquire(p, "second")
            sess.keepalive()  # the other replica adopted the session
            assert until(lambda: v.get("second") == second), v.snapshot()
            # Past two TTLs the session lives on (renewed through s2) and holds both keys.
            time.sleep(2 * sess.ttl)
            assert not sess.lost.is_set(), sess.error
            assert p.lookup("first", consistent=True) == first.id
    finally:
        sess.end()


def _pki(d: Path) -> dict:
    def run(*a: str) -> None:
        subprocess.run(["openssl", *a], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
        "-subj", "/CN=test CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        run("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
            str(d / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"),
            "-out", str(d / f"{name}.crt"))
    return {n: str(d / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def test_tokens_and_mutual_tls(start_serve, tmp_path: Path) -> None:
    k = _pki(tmp_path)
    token = "tok-" + secrets.token_hex(16)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"agent admin sha256:{hashlib.sha256(token.encode()).hexdigest()}\n")
    os.chmod(tokens, 0o600)
    s = start_serve(None, "--tls-cert", k["server.crt"], "--tls-key", k["server.key"],
                    "--client-ca", k["ca.crt"], "--auth-tokens", str(tokens))
    c = client(s.url("https"), token=token, cafile=k["ca.crt"], certfile=k["client.crt"],
               keyfile=k["client.key"])
    c.ensure_pool("sec", 1, 10)
    with c.session(ttl=10) as sess:
        sess.acquire("sec", "k")
    wrong = client(s.url("https"), token="wrong-token-0123456789abcdef", cafile=k["ca.crt"],
                   certfile=k["client.crt"], keyfile=k["client.key"])
    with pytest.raises(ia.Unauthenticated) as e:
        wrong.list_pools()
    assert "wrong-token" not in str(e.value) and token not in repr(c)
    no_cert = client(s.url("https"), token=token, cafile=k["ca.crt"], attempts=1)
    with pytest.raises(ia.TransportError):
        no_cert.list_pools()


def test_the_client_puts_no_token_or_session_id_in_errors_reprs_or_logs(start_serve, tmp_path: Path,
                                                                         caplog) -> None:
    """The token and a session id (a capability) appear in no exception text, ``repr`` or log
    line of the client: through a session's renewals and a service that goes away (its
    renewals fail and are logged; the session is lost only when a service says so)."""
    caplog.set_level(logging.DEBUG)
    token = "tok-" + secrets.token_hex(16)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"agent admin sha256:{hashlib.sha256(token.encode()).hexdigest()}\n")
    os.chmod(tokens, 0o600)
    s = start_serve(None, "--auth-tokens", str(tokens))
    c = client(s.url(), token=token, attempts=2)
    c.ensure_pool("sec", 1, 10)
    sess = c.session(ttl=2)
    sess.acquire("sec", "k")
    sid = sess._id  # the secret itself, read here only to look for it
    time.sleep(2)  # renewals
    texts = [repr(c), str(sess), repr(sess)]
    s.kill()
    for _ in range(3):
        with pytest.raises(ia.IdallocError) as e:
            sess.acquire("sec", "k2")
        texts += [str(e.value), repr(e.value)]
    time.sleep(3)  # failed renewals
    texts += [repr(sess), caplog.text]
    assert "renewing idalloc session" in caplog.text, "the client logged the failed renewals"
    for text in texts:
        assert token not in text, text
        assert sid not in text, text
