package idalloc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// MaxSessionTTL is the longest session TTL the service takes.
const MaxSessionTTL = 24 * time.Hour

// Session is a client session: references on a lease that the service's store expires when the
// session is not renewed for its TTL (the agent crashed, lost the network), so that the IDs go
// back to their pools as they would for a process linking the library. It renews itself in the
// background every TTL/3 (the first time at a random point of the first third, so sessions
// opened together renew spread out; after a renewal that failed on every endpoint, at a random
// point of the next TTL/9), through any replica: one that never saw the session adopts it.
//
// Once the service says the session is gone, Lost is closed and Err says why; its references are
// gone: open a new session and acquire again. Its id is a secret: it is in no error text, and
// String shows only the holder name.
type Session struct {
	c      *Client
	id     string
	holder string
	ttl    time.Duration

	stop     chan struct{}
	stopOnce sync.Once
	lost     chan struct{}
	lostOnce sync.Once
	mu       sync.Mutex
	err      error
	done     chan struct{}
}

// OpenSession opens a session of ttl (whole seconds, 1s to MaxSessionTTL) and starts its renewals.
// Stop them with End (which also revokes the lease) or Close (which leaves the lease to expire).
func (c *Client) OpenSession(ctx context.Context, ttl time.Duration) (*Session, error) {
	if ttl < time.Second || ttl > MaxSessionTTL {
		return nil, &InputError{What: "session TTL", Value: ttl.String(), Rule: "between 1s and 24h"}
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	var out struct {
		Session string `json:"session"`
		Holder  string `json:"holder"`
		TTL     int64  `json:"ttl"`
	}
	if err := c.call(ctx, "session open", http.MethodPost, "/v1/sessions", map[string]int64{"ttl": secs}, &out, ""); err != nil {
		return nil, err
	}
	if out.TTL < 1 {
		out.TTL = secs
	}
	s := &Session{c: c, id: out.Session, holder: out.Holder, ttl: time.Duration(out.TTL) * time.Second,
		stop: make(chan struct{}), lost: make(chan struct{}), done: make(chan struct{})}
	go s.renew()
	return s, nil
}

// Holder is the holder name of the session's references (what a listing's Holders shows).
func (s *Session) Holder() string { return s.holder }

// TTL is the session's lease TTL.
func (s *Session) TTL() time.Duration { return s.ttl }

// String shows the holder, never the id.
func (s *Session) String() string {
	return fmt.Sprintf("Session{holder: %s, ttl: %v}", s.holder, s.ttl)
}

// GoString is String, so that %#v does not print the id either.
func (s *Session) GoString() string { return s.String() }

// Lost is closed once the session is gone (its lease expired or was ended elsewhere).
func (s *Session) Lost() <-chan struct{} { return s.lost }

// Err is nil while the session lives, then why it was lost (matching ErrSessionLost).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Session) markLost(cause error) {
	s.lostOnce.Do(func() {
		s.mu.Lock()
		s.err = fmt.Errorf("%w: %v", ErrSessionLost, cause)
		s.mu.Unlock()
		close(s.lost)
	})
}

// check marks the session lost if err says the service no longer knows it, and passes err on.
func (s *Session) check(err error) error {
	if errors.Is(err, ErrSessionNotFound) {
		s.markLost(err)
	}
	return err
}

// renewalWait is the wait before renewal n (0 is the first) of a session of ttl, after a
// renewal that failed (failed) or not; unit in [0,1]. Pure, so it is tested alone.
func renewalWait(ttl time.Duration, n int, failed bool, unit float64) time.Duration {
	switch {
	case failed:
		return time.Duration(float64(ttl/9) * unit)
	case n == 0:
		return time.Duration(float64(ttl/3) * unit)
	default:
		return ttl / 3
	}
}

func (s *Session) renew() {
	defer close(s.done)
	failed := false
	for n := 0; ; n++ {
		t := time.NewTimer(renewalWait(s.ttl, n, failed, s.c.unit()))
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-s.lost:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.ttl/3+s.c.opts.RequestTimeout)
		err := s.KeepAlive(ctx)
		cancel()
		if errors.Is(err, ErrSessionNotFound) {
			return
		}
		failed = err != nil
	}
}

// KeepAlive renews the session now (the background renewal does this every TTL/3).
func (s *Session) KeepAlive(ctx context.Context) error {
	return s.check(s.c.call(ctx, "session keepalive", http.MethodPut, "/v1/sessions/"+s.id+"/keepalive", nil, nil, s.id))
}

// End stops the renewals and revokes the lease: the session's references vanish at once.
func (s *Session) End(ctx context.Context) error {
	s.Close()
	err := s.c.call(ctx, "session end", http.MethodDelete, "/v1/sessions/"+s.id, nil, nil, s.id)
	if errors.Is(err, ErrSessionNotFound) {
		err = nil // ended already (a retry of an end whose answer was lost)
	}
	s.markLost(errors.New("ended by this client"))
	return err
}

// Close stops the renewals without ending the lease: the references vanish after the TTL, as
// if this process had died (use End to release them at once).
func (s *Session) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

// Acquire references key in pool on this session and returns its ID. Idempotent per session.
func (s *Session) Acquire(ctx context.Context, pool *Pool, key string) (Acquired, error) {
	a, err := pool.acquire(ctx, key, "", s.id)
	return a, s.check(err)
}

// AcquireMany is Acquire for many keys (in requests of at most MaxKeysPerRequest), answers in order.
func (s *Session) AcquireMany(ctx context.Context, pool *Pool, keys []string) ([]Acquired, error) {
	a, err := pool.acquireMany(ctx, keys, "", s.id)
	return a, s.check(err)
}

// Release removes this session's reference to key.
func (s *Session) Release(ctx context.Context, pool *Pool, key string) (Released, error) {
	r, err := pool.release(ctx, key, "", s.id)
	return r, s.check(err)
}

// ReleaseMany is Release for many keys, answers in order.
func (s *Session) ReleaseMany(ctx context.Context, pool *Pool, keys []string) ([]Released, error) {
	r, err := pool.releaseMany(ctx, keys, "", s.id)
	return r, s.check(err)
}
