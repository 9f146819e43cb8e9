package idalloc

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Allocator has the shape of Cilium's allocator (pkg/allocator, v1.6) over `idalloc serve`:
// Allocate(ctx, key) (id, isNew, err), Release(ctx, key) (lastUse, err), Get, GetByID,
// WaitForInitialSync, ForeachCache, Observe. Keys are strings (a Cilium AllocatorKey's GetKey()).
//
// References are counted locally, as in Cilium: every Allocate of a key needs one Release, and
// only the last Release tells the service. They are held on the allocator's own client session,
// so an agent that dies leaks nothing: its IDs go back to the pool after the session TTL. If the
// session is lost (the agent was cut off for longer than the TTL), the allocator opens a new one
// and references every key it holds again; a key whose ID changed meanwhile is reported as an
// upsert by the view like any other change.
//
// Unlike Cilium's there is no lock, no master key and no GC to run: the service decides each
// allocation in one store transaction and reclaims unreferenced IDs itself.
type Allocator struct {
	c    *Client
	pool *Pool
	view *View
	ttl  time.Duration

	ctx    context.Context
	cancel context.CancelFunc

	mu             sync.Mutex
	session        *Session
	restorePending bool
	refs           map[string]int
	ids            map[string]uint64
	wg             sync.WaitGroup
}

// AllocatorOption configures NewAllocator (Cilium's WithMin, WithMax, ...).
type AllocatorOption func(*allocatorConfig)

type allocatorConfig struct {
	spec *PoolSpec
	ttl  time.Duration
}

// WithPool makes NewAllocator create the pool with spec if it does not exist (an equal stored
// spec is fine; a different one fails with ErrRangeMismatch). Without it the pool must exist.
func WithPool(spec PoolSpec) AllocatorOption {
	return func(c *allocatorConfig) { c.spec = &spec }
}

// WithSessionTTL sets the TTL of the allocator's session (default 15s): how long after the agent
// dies its IDs go back to the pool.
func WithSessionTTL(ttl time.Duration) AllocatorOption {
	return func(c *allocatorConfig) { c.ttl = ttl }
}

// NewAllocator opens an allocator on pool (Cilium's NewAllocator): it starts the pool's view.
// The session is opened on the first Allocate. Close it with Delete (Cilium's name) or Close.
func NewAllocator(ctx context.Context, c *Client, pool string, opts ...AllocatorOption) (*Allocator, error) {
	cfg := allocatorConfig{ttl: 15 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.ttl < time.Second || cfg.ttl > MaxSessionTTL {
		return nil, &InputError{What: "session TTL", Value: cfg.ttl.String(), Rule: "between 1s and 24h"}
	}
	if cfg.spec != nil {
		cfg.spec.Name = pool
		if _, err := c.EnsurePool(ctx, *cfg.spec); err != nil {
			return nil, err
		}
	} else if _, err := c.ShowPool(ctx, pool); err != nil {
		return nil, err
	}
	p, err := c.Pool(pool)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(context.Background())
	a := &Allocator{c: c, pool: p, ttl: cfg.ttl, ctx: actx, cancel: cancel, refs: map[string]int{}, ids: map[string]uint64{}}
	a.view = p.Watch(actx)
	return a, nil
}

// Pool is the allocator's pool handle.
func (a *Allocator) Pool() *Pool { return a.pool }

// View is the allocator's view of the pool.
func (a *Allocator) View() *View { return a.view }

func lost(s *Session) bool {
	select {
	case <-s.Lost():
		return true
	default:
		return false
	}
}

// sessionLocked is the allocator's session, opened on demand; a lost one is replaced and every
// key held on it referenced again on the new one. Called with a.mu held.
func (a *Allocator) sessionLocked(ctx context.Context) (*Session, error) {
	if a.session == nil || lost(a.session) {
		s, err := a.c.OpenSession(ctx, a.ttl)
		if err != nil {
			return nil, err
		}
		replacing := a.session != nil
		a.session = s
		a.restorePending = replacing && len(a.refs) > 0
		a.wg.Add(1)
		go a.guard(s)
	}
	if a.restorePending {
		keys := make([]string, 0, len(a.refs))
		for k := range a.refs {
			keys = append(keys, k)
		}
		got, err := a.session.AcquireMany(ctx, a.pool, keys)
		for _, g := range got {
			a.ids[g.Key] = g.ID
		}
		if err != nil {
			return nil, err
		}
		a.restorePending = false
	}
	return a.session, nil
}

// guard waits for s to be lost, then replaces it (unless an Allocate did) with backoff until
// every held key is referenced again.
func (a *Allocator) guard(s *Session) {
	defer a.wg.Done()
	select {
	case <-a.ctx.Done():
		return
	case <-s.Lost():
	}
	n := len(a.c.endpoints)
	for attempt := 0; ; attempt++ {
		a.mu.Lock()
		if a.ctx.Err() != nil || (a.session != s && !a.restorePending) {
			a.mu.Unlock()
			return
		}
		_, err := a.sessionLocked(a.ctx)
		a.mu.Unlock()
		if err == nil {
			return
		}
		if sleepCtx(a.ctx, backoffDelay(a.c.opts.BackoffBase, a.c.opts.BackoffMax, attempt+n, n, 0, a.c.unit())) != nil {
			return
		}
	}
}

// Allocate returns key's ID, binding one if the key has none (isNew: this call bound it, in the
// service or, for a key this allocator already holds, never). Every Allocate needs a Release.
func (a *Allocator) Allocate(ctx context.Context, key string) (id uint64, isNew bool, err error) {
	if err := checkKey(key); err != nil {
		return 0, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.refs[key]; n > 0 {
		if id, ok := a.ids[key]; ok {
			a.refs[key] = n + 1
			return id, false, nil
		}
	}
	s, err := a.sessionLocked(ctx)
	if err != nil {
		return 0, false, err
	}
	got, err := s.Acquire(ctx, a.pool, key)
	if errors.Is(err, ErrSessionNotFound) {
		// Lost between the check and the acquire: once more on a new session.
		if s, err = a.sessionLocked(ctx); err != nil {
			return 0, false, err
		}
		got, err = s.Acquire(ctx, a.pool, key)
	}
	if err != nil {
		return 0, false, err
	}
	a.refs[key]++
	a.ids[key] = got.ID
	return got.ID, got.New, nil
}

// Release drops one local reference to key; the last one releases it in the service (lastUse).
// Releasing a key this allocator does not hold is (false, nil).
func (a *Allocator) Release(ctx context.Context, key string) (lastUse bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.refs[key]
	if n == 0 {
		return false, nil
	}
	if n > 1 {
		a.refs[key] = n - 1
		return false, nil
	}
	if a.session != nil {
		if _, err := a.session.Release(ctx, a.pool, key); err != nil && !errors.Is(err, ErrSessionNotFound) {
			return false, err
		}
	}
	delete(a.refs, key)
	delete(a.ids, key)
	return true, nil
}

// Get is key's ID from the local view (0 if none; Cilium's Get), without a request. Call
// WaitForInitialSync first.
func (a *Allocator) Get(ctx context.Context, key string) (uint64, error) {
	if id, ok := a.view.Get(key); ok {
		return id, nil
	}
	return 0, nil
}

// GetNoCache is key's ID read from the service's store (0 if none).
func (a *Allocator) GetNoCache(ctx context.Context, key string) (uint64, error) {
	id, err := a.pool.Lookup(ctx, key, true)
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	return id, err
}

// GetByID is the key bound to id in the local view ("" if none).
func (a *Allocator) GetByID(id uint64) (string, error) {
	k, _ := a.view.KeyOf(id)
	return k, nil
}

// WaitForInitialSync returns once the local view holds the whole pool.
func (a *Allocator) WaitForInitialSync(ctx context.Context) error { return a.view.WaitSynced(ctx) }

// ForeachCache calls cb for every binding of the local view, in ID order.
func (a *Allocator) ForeachCache(cb func(id uint64, key string)) {
	for _, b := range a.view.Snapshot() {
		cb(b.ID, b.Key)
	}
}

// Observe is a channel of the pool's changes as the view sees them (Cilium's events channel):
// see View.Observe.
func (a *Allocator) Observe(ctx context.Context) <-chan Event { return a.view.Observe(ctx, 0) }

// Session is the allocator's current session (nil before the first Allocate).
func (a *Allocator) Session() *Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.session
}

// Delete ends the allocator: its session is ended (every key it holds is released at once) and
// its view stops (Cilium's Delete).
func (a *Allocator) Delete(ctx context.Context) error {
	a.cancel()
	a.mu.Lock()
	s := a.session
	a.session = nil
	a.refs = map[string]int{}
	a.ids = map[string]uint64{}
	a.mu.Unlock()
	var err error
	if s != nil {
		err = s.End(ctx)
	}
	a.wg.Wait()
	<-a.view.Done()
	return err
}
