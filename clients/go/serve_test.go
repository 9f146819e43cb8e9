package idalloc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPoolsAreEnsuredShownListedAndDeleted(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	spec := PoolSpec{Name: "vni", Min: 10, Max: 19, Reserved: [][2]uint64{{10, 11}}, Strategy: "lowest"}
	got, err := c.EnsurePool(ctx, spec)
	if err != nil || got.Name != "vni" || got.Max != 19 || len(got.Reserved) != 1 {
		t.Fatal(got, err)
	}
	if _, err := c.EnsurePool(ctx, spec); err != nil {
		t.Fatalf("an equal spec is fine: %v", err)
	}
	other := spec
	other.Max = 29
	if _, err := c.EnsurePool(ctx, other); !errors.Is(err, ErrRangeMismatch) {
		t.Fatalf("a different spec: %v", err)
	}
	info, err := c.ShowPool(ctx, "vni")
	if err != nil || info.Capacity != 8 || info.Bound != 0 {
		t.Fatal(info, err)
	}
	if _, err := c.ShowPool(ctx, "nope"); !errors.Is(err, ErrPoolNotFound) {
		t.Fatal(err)
	}
	if _, err := c.ShowPool(ctx, "Bad Name"); !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "Bad Name") {
		t.Fatalf("refused locally, naming the value: %v", err)
	}
	pools, err := c.ListPools(ctx)
	if err != nil || len(pools) != 1 || pools[0].Name != "vni" {
		t.Fatal(pools, err)
	}
	p, _ := c.Pool("vni")
	if _, err := p.AcquireDurable(ctx, "cfg", "k"); err != nil {
		t.Fatal(err)
	}
	grown, err := c.ResizePool(ctx, "vni", 10, 29, nil)
	if err != nil || grown.Max != 29 || len(grown.Reserved) != 1 {
		t.Fatal(grown, err)
	}
	if _, err := c.ResizePool(ctx, "vni", 13, 29, nil); !errors.Is(err, ErrPoolInUse) || !strings.Contains(err.Error(), `ID 12 is bound to key "k"`) {
		t.Fatalf("a shrink over a bound ID: %v", err)
	}
	if _, err := c.DeletePool(ctx, "vni", false); !errors.Is(err, ErrPoolInUse) {
		t.Fatalf("a pool with records: %v", err)
	}
	if ok, err := c.DeletePool(ctx, "vni", true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := c.DeletePool(ctx, "vni", true); ok || err != nil {
		t.Fatalf("gone: %v %v", ok, err)
	}
}

func TestDurableAndSessionReferencesLookupsAndPaging(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "p", Min: 1, Max: 1000}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("p")
	a, err := p.AcquireDurable(ctx, "cfg", "tenant/blue?#%")
	if err != nil || !a.New || a.ID == 0 {
		t.Fatal(a, err)
	}
	again, err := p.AcquireDurable(ctx, "cfg", "tenant/blue?#%")
	if err != nil || again.New || again.ID != a.ID {
		t.Fatalf("idempotent per holder: %v %v", again, err)
	}
	if id, err := p.Lookup(ctx, "tenant/blue?#%", true); err != nil || id != a.ID {
		t.Fatal(id, err)
	}
	if k, err := p.LookupID(ctx, a.ID, true); err != nil || k != "tenant/blue?#%" {
		t.Fatal(k, err)
	}
	if _, err := p.Lookup(ctx, "missing", true); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := p.AcquireDurable(ctx, "session:x", "k"); !errors.Is(err, ErrHolderReserved) {
		t.Fatal(err)
	}
	if _, err := p.AcquireDurable(ctx, "cfg", ""); !errors.Is(err, ErrInvalidInput) {
		t.Fatal(err)
	}

	sess, err := c.OpenSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 25)
	for i := range keys {
		keys[i] = fmt.Sprintf("k-%02d", i)
	}
	got, err := sess.AcquireMany(ctx, p, keys)
	if err != nil || len(got) != 25 {
		t.Fatal(len(got), err)
	}
	ids := map[uint64]string{a.ID: "tenant/blue?#%"}
	for i, g := range got {
		if g.Key != keys[i] || ids[g.ID] != "" {
			t.Fatalf("in order and distinct: %v", g)
		}
		ids[g.ID] = g.Key
	}
	// Paging: 26 bindings in pages of 10.
	var all []Binding
	var after *uint64
	pages := 0
	for {
		page, err := p.ListPage(ctx, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		all = append(all, page.Bindings...)
		if page.NextAfter == nil {
			break
		}
		after = page.NextAfter
	}
	if pages != 3 || len(all) != 26 {
		t.Fatalf("%d pages, %d bindings", pages, len(all))
	}
	for _, b := range all {
		if ids[b.ID] != b.Key || len(b.Holders) != 1 {
			t.Fatalf("%+v", b)
		}
		if b.Key != "tenant/blue?#%" && b.Holders[0] != sess.Holder() {
			t.Fatalf("held by the session: %+v", b)
		}
	}
	listed, err := p.List(ctx)
	if err != nil || len(listed) != 26 {
		t.Fatal(len(listed), err)
	}
	r, err := sess.Release(ctx, p, "k-00")
	if err != nil || !r.Held || !r.Reclaimed {
		t.Fatal(r, err)
	}
	if r, _ := sess.Release(ctx, p, "k-00"); r.Held {
		t.Fatal("released twice is held: false")
	}
	if strings.Contains(fmt.Sprintf("%v %+v %#v %s", sess, sess, sess, sess), sess.id) {
		t.Fatal("the session id is printed")
	}
	// Ending the session releases its references at once.
	if err := sess.End(ctx); err != nil {
		t.Fatal(err)
	}
	// Its references are gone at once; the sweeper (every second here) reclaims the IDs.
	if !until(ctx, func() bool { _, err := p.Lookup(ctx, "k-01", true); return errors.Is(err, ErrNotFound) }) {
		t.Fatal("released with the session")
	}
	if _, err := sess.Acquire(ctx, p, "late"); !errors.Is(err, ErrSessionNotFound) || strings.Contains(err.Error(), sess.id) {
		t.Fatalf("an ended session, without its id: %v", err)
	}
	if r, err := p.ReleaseDurable(ctx, "cfg", "tenant/blue?#%"); err != nil || !r.Held {
		t.Fatal(r, err)
	}
}

func TestAFullPoolIsErrExhausted(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "tiny", Min: 1, Max: 2}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("tiny")
	if _, err := p.AcquireManyDurable(ctx, "h", []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	_, err := p.AcquireDurable(ctx, "h", "c")
	var e *Error
	if !errors.Is(err, ErrExhausted) || !errors.As(err, &e) || e.Status != 409 || IsRetryable(err) {
		t.Fatalf("%v", err)
	}
}

func TestAViewFollowsThePoolAndReportsEvents(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "w", Min: 1, Max: 1000}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("w")
	before, _ := p.AcquireDurable(ctx, "h", "before")
	v := p.Watch(ctx)
	events := v.Observe(ctx, 0)
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if id, ok := v.Get("before"); !ok || id != before.ID {
		t.Fatal(id, ok)
	}
	after, _ := p.AcquireDurable(ctx, "h", "after")
	if !until(ctx, func() bool { k, _ := v.KeyOf(after.ID); return k == "after" }) {
		t.Fatal("the view never saw the acquire")
	}
	if _, err := p.ReleaseDurable(ctx, "h", "after"); err != nil {
		t.Fatal(err)
	}
	if !until(ctx, func() bool { _, ok := v.Get("after"); return !ok }) {
		t.Fatal("the view never saw the release")
	}
	var seen []Event
	for len(seen) < 4 {
		select {
		case e := <-events:
			seen = append(seen, e)
		case <-ctx.Done():
			t.Fatalf("events: %v", seen)
		}
	}
	want := []Event{{EventUpsert, before.ID, "before"}, {Type: EventSynced}, {EventUpsert, after.ID, "after"}, {EventDelete, after.ID, "after"}}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("events %v, want %v", seen, want)
		}
	}
}

// A resize while a view watches the pool is an EventSpec, in order with the bindings' events,
// and View.Spec is the new spec.
func TestAResizeDuringAWatchIsAnEventSpec(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "rs", Min: 1, Max: 10}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("rs")
	v := p.Watch(ctx)
	events := v.Observe(ctx, 0)
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.Spec(); ok {
		t.Fatal("a spec before any resize")
	}
	if _, err := c.ResizePool(ctx, "rs", 1, 20, [][2]uint64{{13, 14}}); err != nil {
		t.Fatal(err)
	}
	a, _ := p.AcquireDurable(ctx, "h", "after")
	// The service re-lists the pool after a resize: a second synced may come, and is skipped.
	var seen []Event
	for len(seen) < 3 {
		select {
		case e := <-events:
			if len(seen) > 0 && e.Type == EventSynced {
				continue
			}
			seen = append(seen, e)
		case <-ctx.Done():
			t.Fatalf("events: %v", seen)
		}
	}
	want := []Event{{Type: EventSynced}, {Type: EventSpec}, {EventUpsert, a.ID, "after"}}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("events %v, want %v", seen, want)
		}
	}
	spec, ok := v.Spec()
	if !ok || spec.Max != 20 || len(spec.Reserved) != 1 || spec.Reserved[0] != [2]uint64{13, 14} {
		t.Fatal(spec, ok)
	}
}

// The view re-lists after a restart of the service (its history is gone: 410 on resume) and
// ends equal to the pool, with events for the differences only.
func TestAViewReListsWhenTheServiceForgotItsHistory(t *testing.T) {
	prefix := uniquePrefix(t)
	s1 := startServe(t, prefix)
	s2 := startServe(t, prefix)
	c := newClient(t, Options{Endpoints: []string{s1.url("http"), s2.url("http")}})
	ctx := testCtx(t)
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "r", Min: 1, Max: 1000}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("r")
	kept, _ := p.AcquireDurable(ctx, "h", "kept")
	gone, _ := p.AcquireDurable(ctx, "h", "gone")
	v := p.Watch(ctx)
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	rev := v.Revision()
	events := v.Observe(ctx, 0)
	s1.kill() // the stream moves to s2, which never watched the pool: 410, re-list
	if _, err := p.ReleaseDurable(ctx, "h", "gone"); err != nil {
		t.Fatal(err)
	}
	added, _ := p.AcquireDurable(ctx, "h", "added")
	if !until(ctx, func() bool { _, g := v.Get("gone"); id, a := v.Get("added"); return !g && a && id == added.ID }) {
		t.Fatal(v.Snapshot())
	}
	if id, _ := v.Get("kept"); id != kept.ID || v.Revision() <= rev {
		t.Fatal(v.Snapshot(), v.Revision(), rev)
	}
	for e := range events {
		if e.Key == "kept" {
			t.Fatalf("an unchanged binding is no event: %v", e)
		}
		if e.Type == EventUpsert && e.Key == "added" {
			break
		}
	}
	_ = gone
}

func TestALostSessionIsReportedOnItsChannel(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	sess, err := c.OpenSession(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	// An admin ends it by its holder name, as an operator would; the next renewal learns it.
	if err := c.call(ctx, "session end", "DELETE", "/v1/sessions/"+seg(sess.Holder()), nil, nil, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sess.Lost():
	case <-ctx.Done():
		t.Fatal("the loss was never reported")
	}
	if !errors.Is(sess.Err(), ErrSessionLost) || strings.Contains(sess.Err().Error(), sess.id) {
		t.Fatal(sess.Err())
	}
}

// Two replicas on one etcd; the one the client talks to is killed: calls, the session's
// renewals and the view go on through the other, with the same IDs.
func TestFailoverWhenOneOfTwoReplicasIsKilled(t *testing.T) {
	prefix := uniquePrefix(t)
	s1 := startServe(t, prefix)
	s2 := startServe(t, prefix)
	c := newClient(t, Options{Endpoints: []string{s1.url("http"), s2.url("http")}})
	ctx := testCtx(t)
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "f", Min: 1, Max: 100000}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("f")
	sess, err := c.OpenSession(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	v := p.Watch(ctx)
	first, err := sess.Acquire(ctx, p, "first")
	if err != nil || c.currentIndex() != 0 {
		t.Fatal(err, c.currentIndex())
	}
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	s1.kill()
	again, err := sess.Acquire(ctx, p, "first")
	if err != nil || again.ID != first.ID || again.New {
		t.Fatalf("the same ID through the other replica: %v %v", again, err)
	}
	if c.currentIndex() != 1 {
		t.Fatal("failed over")
	}
	second, err := sess.Acquire(ctx, p, "second")
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.KeepAlive(ctx); err != nil {
		t.Fatalf("the other replica adopted the session: %v", err)
	}
	if !until(ctx, func() bool { id, ok := v.Get("second"); return ok && id == second.ID }) {
		t.Fatal("the view goes on through the other replica", v.Snapshot())
	}
	// Past two TTLs the session lives on (renewed through s2) and holds both keys.
	time.Sleep(2 * sess.TTL())
	select {
	case <-sess.Lost():
		t.Fatal(sess.Err())
	default:
	}
	if id, err := p.Lookup(ctx, "first", true); err != nil || id != first.ID {
		t.Fatal(id, err)
	}
}

func TestTokensAndMutualTLS(t *testing.T) {
	dir := t.TempDir()
	k := makePKI(t, dir)
	token := "tok-" + sha256Hex(t.Name() + time.Now().String())[:32]
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("agent admin sha256:"+sha256Hex(token)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, uniquePrefix(t), "--tls-cert", k.serverCert, "--tls-key", k.serverKey,
		"--client-ca", k.ca, "--auth-tokens", tokens)
	ctx := testCtx(t)
	c := newClient(t, Options{Endpoints: []string{s.url("https")}, Token: token, CAFile: k.ca,
		CertFile: k.clientCert, KeyFile: k.clientKey})
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "sec", Min: 1, Max: 10}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("sec")
	sess, err := c.OpenSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Acquire(ctx, p, "k"); err != nil {
		t.Fatal(err)
	}
	if err := sess.End(ctx); err != nil {
		t.Fatal(err)
	}
	wrong := newClient(t, Options{Endpoints: []string{s.url("https")}, Token: "wrong-token-0123456789abcdef", CAFile: k.ca,
		CertFile: k.clientCert, KeyFile: k.clientKey})
	if _, err := wrong.ListPools(ctx); !errors.Is(err, ErrUnauthenticated) || strings.Contains(err.Error(), "wrong-token") {
		t.Fatalf("a bad token: %v", err)
	}
	noCert := newClient(t, Options{Endpoints: []string{s.url("https")}, Token: token, CAFile: k.ca, Attempts: 1})
	if _, err := noCert.ListPools(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no client certificate: no answer: %v", err)
	}
}

func TestTheAllocatorReadsLikeCiliums(t *testing.T) {
	s := startServe(t, uniquePrefix(t))
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	ctx := testCtx(t)
	a, err := NewAllocator(ctx, c, "identities", WithPool(PoolSpec{Min: 256, Max: 65535}), WithSessionTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	events := a.Observe(ctx)
	if err := a.WaitForInitialSync(ctx); err != nil {
		t.Fatal(err)
	}
	key := "k8s:app=web;k8s:io.kubernetes.pod.namespace=default;"
	id, isNew, err := a.Allocate(ctx, key)
	if err != nil || !isNew || id < 256 {
		t.Fatal(id, isNew, err)
	}
	id2, isNew2, err := a.Allocate(ctx, key)
	if err != nil || isNew2 || id2 != id {
		t.Fatal(id2, isNew2, err)
	}
	if !until(ctx, func() bool { k, _ := a.GetByID(id); return k == key }) {
		t.Fatal("GetByID from the view")
	}
	if got, _ := a.Get(ctx, key); got != id {
		t.Fatal(got)
	}
	if got, _ := a.GetNoCache(ctx, key); got != id {
		t.Fatal(got)
	}
	n := 0
	a.ForeachCache(func(uint64, string) { n++ })
	if n != 1 {
		t.Fatal(n)
	}
	if e := <-events; e.Type != EventSynced {
		t.Fatal(e)
	}
	if e := <-events; e != (Event{EventUpsert, id, key}) {
		t.Fatal(e)
	}
	// The session is lost (ended by an operator): the allocator re-references its keys.
	lostOne := a.Session()
	if err := c.call(ctx, "session end", "DELETE", "/v1/sessions/"+seg(lostOne.Holder()), nil, nil, ""); err != nil {
		t.Fatal(err)
	}
	<-lostOne.Lost()
	if !until(ctx, func() bool {
		cur := a.Session()
		if cur == lostOne {
			return false
		}
		got, err := a.pool.List(ctx)
		return err == nil && len(got) == 1 && len(got[0].Holders) == 1 && got[0].Holders[0] == cur.Holder()
	}) {
		t.Fatal("the key was not referenced again on a new session")
	}
	if last, err := a.Release(ctx, key); last || err != nil {
		t.Fatal(last, err)
	}
	if last, err := a.Release(ctx, key); !last || err != nil {
		t.Fatal(last, err)
	}
	if !until(ctx, func() bool { k, _ := a.GetByID(id); return k == "" }) {
		t.Fatal("released in the service")
	}
	if err := a.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}
