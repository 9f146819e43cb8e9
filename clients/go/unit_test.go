package idalloc

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestEveryEndpointOnceWithoutWaitingThenFullJitterBackoffToItsCap(t *testing.T) {
	ms := time.Millisecond
	d := func(attempt int, unit float64) time.Duration {
		return backoffDelay(100*ms, time.Second, attempt, 2, 0, unit)
	}
	if d(0, 0.9) != 0 || d(1, 0.99) != 0 {
		t.Fatalf("the other endpoint is tried at once: %v %v", d(0, 0.9), d(1, 0.99))
	}
	for _, c := range []struct {
		attempt int
		unit    float64
		want    time.Duration
	}{{2, 0, 0}, {2, 0.25, 25 * ms}, {2, 1, 100 * ms}, {4, 1, 200 * ms}, {40, 1, time.Second}, {1 << 30, 1, time.Second}} {
		if got := d(c.attempt, c.unit); got != c.want {
			t.Errorf("attempt %d unit %v: %v, want %v", c.attempt, c.unit, got, c.want)
		}
	}
	if got := backoffDelay(100*ms, time.Second, 1, 2, 2*time.Second, 0); got != 2*time.Second {
		t.Errorf("Retry-After is a floor: %v", got)
	}
}

func TestOnlyAnswersSaidToBeRetryableAreRetried(t *testing.T) {
	for _, k := range []Kind{"unavailable", "overloaded", "rate_limited", "pool_replaced"} {
		if !retryable(503, k) {
			t.Errorf("%s is retried", k)
		}
	}
	for _, k := range []Kind{"access_denied", "quota_exceeded", "exhausted", "invalid_input", "internal", "session_not_found"} {
		if retryable(409, k) {
			t.Errorf("%s is not retried", k)
		}
	}
	if !retryable(502, "") || retryable(404, "") {
		t.Error("a proxy's 502 is retried, its 404 is not")
	}
}

func TestErrorsMatchTheirKindsSentinels(t *testing.T) {
	e := fmt.Errorf("wrapped: %w", &Error{Op: "acquire", Status: 409, Kind: "exhausted", Message: "m"})
	if !errors.Is(e, ErrExhausted) || errors.Is(e, ErrConflict) {
		t.Fatalf("%v", e)
	}
	inUse := &Error{Status: 409, Kind: "invalid_input"}
	if !errors.Is(inUse, ErrPoolInUse) || !errors.Is(inUse, ErrInvalidInput) || errors.Is(&Error{Status: 400, Kind: "invalid_input"}, ErrPoolInUse) {
		t.Fatal("409 invalid_input is ErrPoolInUse, 400 is not")
	}
	if !errors.Is(&TransportError{Op: "x", Err: errors.New("refused")}, ErrUnavailable) || !IsRetryable(&TransportError{}) {
		t.Fatal("no answer is ErrUnavailable and retryable")
	}
	if !errors.Is(&Error{Status: 502}, ErrUnavailable) {
		t.Fatal("a proxy's 502 is ErrUnavailable")
	}
	if !errors.Is(&InputError{What: "key"}, ErrInvalidInput) {
		t.Fatal("a refused input is ErrInvalidInput")
	}
}

func TestRenewalsSpreadTheFirstOverAThirdAndRetryWithinANinth(t *testing.T) {
	ttl := 9 * time.Second
	if renewalWait(ttl, 0, false, 0.5) != 1500*time.Millisecond || renewalWait(ttl, 3, false, 0.1) != 3*time.Second ||
		renewalWait(ttl, 3, true, 1) != time.Second {
		t.Fatal(renewalWait(ttl, 0, false, 0.5), renewalWait(ttl, 3, false, 0.1), renewalWait(ttl, 3, true, 1))
	}
}

func TestPathSegmentsArePercentEncoded(t *testing.T) {
	if got := seg("a b/c?d#e%f"); got != "a%20b%2Fc%3Fd%23e%25f" {
		t.Fatal(got)
	}
	if got := seg("é"); got != "%C3%A9" {
		t.Fatal(got)
	}
}

func up(id uint64, key string) msg { return msg{kind: msgUpsert, id: id, key: key} }

func TestAListingIsSwappedInWholeAtSyncedWithOnlyTheDifferences(t *testing.T) {
	v := newViewState()
	v.opening(false)
	if ev := v.apply(up(1, "a"), ""); len(ev) != 0 {
		t.Fatalf("collected apart: %v", ev)
	}
	v.apply(up(2, "b"), "")
	if ev := v.apply(msg{kind: msgSynced, revision: 7}, "7"); len(ev) != 3 || v.resumeFrom() != 7 {
		t.Fatalf("%v %d", ev, v.resumeFrom())
	}
	// Resumed: changes apply as they come; ids move the revision.
	v.opening(true)
	v.apply(msg{kind: msgDelete, id: 1, key: "a"}, "")
	v.apply(up(3, "c"), "9")
	if _, ok := v.byKey["a"]; ok || v.byKey["c"] != 3 || v.resumeFrom() != 9 {
		t.Fatalf("%v %d", v.byKey, v.resumeFrom())
	}
	// A re-list: the old bindings answer until the listing is complete.
	v.forget()
	if v.resumeFrom() != 0 {
		t.Fatal("forgotten")
	}
	v.opening(false)
	v.apply(up(2, "b"), "")
	v.apply(up(4, "d"), "")
	if v.byKey["c"] != 3 {
		t.Fatal("still answering")
	}
	ev := v.apply(msg{kind: msgSynced, revision: 12}, "12")
	want := []Event{{Type: EventDelete, ID: 3, Key: "c"}, {Type: EventUpsert, ID: 4, Key: "d"}, {Type: EventSynced}}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("%v, want %v", ev, want)
	}
	if !reflect.DeepEqual(v.snapshot(), []Binding{{ID: 2, Key: "b"}, {ID: 4, Key: "d"}}) {
		t.Fatal(v.snapshot())
	}
}

func TestAKeyThatMovesLeavesNoStaleHalf(t *testing.T) {
	v := newViewState()
	v.opening(false)
	v.apply(msg{kind: msgSynced, revision: 1}, "1")
	v.apply(up(1, "a"), "2")
	v.apply(up(5, "a"), "3")
	if _, ok := v.byID[1]; ok || v.byKey["a"] != 5 || len(v.byID) != 1 {
		t.Fatal(v.byID, v.byKey)
	}
	v.apply(msg{kind: msgDelete, id: 5, key: "b"}, "4")
	if v.byKey["a"] != 5 {
		t.Fatal("a stale delete is ignored")
	}
}

func TestStreamMessagesParseAndBadOnesAreNamed(t *testing.T) {
	m, err := parseEvent("upsert", `{"id":4,"key":"k","revision":3}`)
	if err != nil || m != up(4, "k") {
		t.Fatal(m, err)
	}
	if m, _ := parseEvent("error", `{"kind":"lagged","message":"m","revision":5,"from_revision":6}`); m.kind != msgLagged || m.revision != 5 {
		t.Fatal(m)
	}
	if m, _ := parseEvent("error", `{"kind":"gone","message":"m"}`); m.kind != msgGone {
		t.Fatal(m)
	}
	if m, _ := parseEvent("ping", "x"); m.kind != msgOther {
		t.Fatal(m)
	}
	m, err = parseEvent("spec", `{"revision":9,"spec":{"name":"p","min":1,"max":20,"reserved":[[3,4]]}}`)
	if err != nil || m.kind != msgSpec || m.revision != 9 || m.spec.Max != 20 || len(m.spec.Reserved) != 1 {
		t.Fatal(m, err)
	}
	if _, err := parseEvent("spec", `{"revision":9}`); err == nil || !contains(err.Error(), "spec", `{"revision":9}`) {
		t.Fatal(err)
	}
	if _, err := parseEvent("upsert", `{"id":"x"}`); err == nil || !contains(err.Error(), "upsert", `{"id":"x"}`) {
		t.Fatal(err)
	}
}

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func TestOptionsAreChecked(t *testing.T) {
	for _, o := range []Options{{}, {Endpoints: []string{"ftp://x"}}, {Endpoints: []string{"http://h?x=1"}},
		{Endpoints: []string{"http://h"}, CertFile: "c"}} {
		if _, err := New(o); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

func TestATransportErrorNeverQuotesTheRequestURL(t *testing.T) {
	secret := "00000000000000ab" + strings.Repeat("f", 64)
	err := &url.Error{Op: "Put", URL: "http://127.0.0.1:9/v1/sessions/" + secret + "/keepalive", Err: errors.New("connection refused")}
	if got := describe(err); strings.Contains(got, secret) || !strings.Contains(got, "connection refused") {
		t.Fatal(got)
	}
	if got := redact("session "+secret+" is gone", secret); strings.Contains(got, secret) {
		t.Fatal(got)
	}
}
