package idalloc

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"unicode/utf8"
)

// PoolSpec is a pool as the service stores it. Name, Min and Max are required.
type PoolSpec struct {
	Name string `json:"name"`
	Min  uint64 `json:"min"`
	Max  uint64 `json:"max"`
	// Reserved holds inclusive [lo, hi] ranges never handed out.
	Reserved [][2]uint64 `json:"reserved,omitempty"`
	// Prefix bits are ORed into every ID handed out.
	Prefix uint64 `json:"prefix,omitempty"`
	// Strategy is "random" (the default) or "lowest".
	Strategy     string `json:"strategy,omitempty"`
	IdleGraceMs  uint64 `json:"idle_grace_ms,omitempty"`
	ReuseDelayMs uint64 `json:"reuse_delay_ms,omitempty"`
}

// PoolInfo is a pool's spec and how full it is (two counts read at one revision).
type PoolInfo struct {
	Spec        PoolSpec `json:"spec"`
	Capacity    uint64   `json:"capacity"`
	Bound       uint64   `json:"bound"`
	Quarantined uint64   `json:"quarantined"`
	Used        uint64   `json:"used"`
	Free        uint64   `json:"free"`
}

// Acquired is the answer to an acquire: the key's ID, and whether this call bound it.
type Acquired struct {
	Key string `json:"key"`
	ID  uint64 `json:"id"`
	New bool   `json:"new"`
}

// Released is the answer to a release: whether the holder held the key, and whether its ID went
// back to the pool (nobody else referenced it).
type Released struct {
	Key       string `json:"key"`
	Held      bool   `json:"held"`
	Reclaimed bool   `json:"reclaimed"`
}

// Binding is a key with its ID and the holders referencing it.
type Binding struct {
	ID      uint64   `json:"id"`
	Key     string   `json:"key"`
	Holders []string `json:"holders"`
}

// Page is one page of a pool's bindings, in ID order. NextAfter is nil on the last page, else
// the value to pass as after for the next one.
type Page struct {
	Bindings  []Binding `json:"bindings"`
	NextAfter *uint64   `json:"next_after"`
}

// MaxKeysPerRequest is the most keys one acquire or release request carries; the client splits
// longer lists.
const MaxKeysPerRequest = 1000

var poolName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func checkPool(name string) error {
	if !poolName.MatchString(name) {
		return &InputError{What: "pool name", Value: name, Rule: "[a-z0-9][a-z0-9._-]{0,62}"}
	}
	return nil
}

func checkKey(key string) error {
	if key == "" || len(key) > 4096 || !utf8.ValidString(key) {
		return &InputError{What: "key", Value: key, Rule: "non-empty UTF-8 of at most 4096 bytes"}
	}
	return nil
}

func checkHolder(holder string) error {
	if holder == "" {
		return &InputError{What: "holder", Value: holder, Rule: "a non-empty name not starting with \"session:\""}
	}
	return nil
}

// EnsurePool creates the pool, or succeeds if an equal spec is stored (Contiv's InitPool); a
// different stored spec is ErrRangeMismatch. It returns the stored spec.
func (c *Client) EnsurePool(ctx context.Context, spec PoolSpec) (*PoolSpec, error) {
	if err := checkPool(spec.Name); err != nil {
		return nil, err
	}
	var out PoolSpec
	if err := c.call(ctx, "pool create", http.MethodPost, "/v1/pools", spec, &out, ""); err != nil {
		return nil, err
	}
	return &out, nil
}

// ShowPool is the pool's spec and usage; ErrPoolNotFound if there is none.
func (c *Client) ShowPool(ctx context.Context, name string) (*PoolInfo, error) {
	if err := checkPool(name); err != nil {
		return nil, err
	}
	var out PoolInfo
	if err := c.call(ctx, "pool show", http.MethodGet, "/v1/pools/"+seg(name), nil, &out, ""); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListPools is every pool's spec, sorted by name.
func (c *Client) ListPools(ctx context.Context) ([]PoolSpec, error) {
	var out struct {
		Pools []PoolSpec `json:"pools"`
	}
	if err := c.call(ctx, "pool list", http.MethodGet, "/v1/pools", nil, &out, ""); err != nil {
		return nil, err
	}
	return out.Pools, nil
}

// ResizePool gives the pool the range [min, max] and, if reserved is not nil, those reserved
// ranges (nil: its reserved IDs inside the new range stay). Growing always succeeds; narrowing
// while an ID it would exclude is bound or quarantined is ErrPoolInUse, naming the ID and its key.
// It returns the spec now in force.
func (c *Client) ResizePool(ctx context.Context, name string, min, max uint64, reserved [][2]uint64) (*PoolSpec, error) {
	if err := checkPool(name); err != nil {
		return nil, err
	}
	body := map[string]any{"min": min, "max": max}
	if reserved != nil {
		body["reserved"] = reserved
	}
	var out PoolSpec
	if err := c.call(ctx, "pool resize", http.MethodPatch, "/v1/pools/"+seg(name), body, &out, ""); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeletePool deletes the pool (with force, its bindings too); false if there was none. A pool
// with records, without force, is ErrPoolInUse.
func (c *Client) DeletePool(ctx context.Context, name string, force bool) (bool, error) {
	if err := checkPool(name); err != nil {
		return false, err
	}
	path := fmt.Sprintf("/v1/pools/%s?force=%t", seg(name), force)
	err := c.call(ctx, "pool delete", http.MethodDelete, path, nil, nil, "")
	if err == nil {
		return true, nil
	}
	if isKind(err, "pool_not_found") {
		return false, nil
	}
	return false, err
}

func isKind(err error, k Kind) bool {
	e, ok := err.(*Error)
	return ok && e.Kind == k
}

// Pool is a handle on one pool of the service. It makes no request by itself.
func (c *Client) Pool(name string) (*Pool, error) {
	if err := checkPool(name); err != nil {
		return nil, err
	}
	return &Pool{c: c, name: name}, nil
}

// Pool is a handle on one pool: durable acquires and releases, lookups, listings and watches.
// Leased (session) acquires go through a Session.
type Pool struct {
	c    *Client
	name string
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.name }

type keysBody struct {
	Key     string   `json:"key,omitempty"`
	Keys    []string `json:"keys,omitempty"`
	Holder  string   `json:"holder,omitempty"`
	Session string   `json:"session,omitempty"`
}

func (p *Pool) acquire(ctx context.Context, key, holder, session string) (Acquired, error) {
	if err := checkKey(key); err != nil {
		return Acquired{}, err
	}
	var out Acquired
	err := p.c.call(ctx, "acquire", http.MethodPost, "/v1/pools/"+seg(p.name)+"/acquire",
		keysBody{Key: key, Holder: holder, Session: session}, &out, session)
	return out, err
}

func (p *Pool) acquireMany(ctx context.Context, keys []string, holder, session string) ([]Acquired, error) {
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	all := make([]Acquired, 0, len(keys))
	for start := 0; start < len(keys); start += MaxKeysPerRequest {
		end := start + MaxKeysPerRequest
		if end > len(keys) {
			end = len(keys)
		}
		var out struct {
			Results []Acquired `json:"results"`
		}
		err := p.c.call(ctx, "acquire", http.MethodPost, "/v1/pools/"+seg(p.name)+"/acquire",
			keysBody{Keys: keys[start:end], Holder: holder, Session: session}, &out, session)
		if err != nil {
			return all, err
		}
		all = append(all, out.Results...)
	}
	return all, nil
}

func (p *Pool) release(ctx context.Context, key, holder, session string) (Released, error) {
	if err := checkKey(key); err != nil {
		return Released{}, err
	}
	var out Released
	err := p.c.call(ctx, "release", http.MethodPost, "/v1/pools/"+seg(p.name)+"/release",
		keysBody{Key: key, Holder: holder, Session: session}, &out, session)
	return out, err
}

func (p *Pool) releaseMany(ctx context.Context, keys []string, holder, session string) ([]Released, error) {
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	all := make([]Released, 0, len(keys))
	for start := 0; start < len(keys); start += MaxKeysPerRequest {
		end := start + MaxKeysPerRequest
		if end > len(keys) {
			end = len(keys)
		}
		var out struct {
			Results []Released `json:"results"`
		}
		err := p.c.call(ctx, "release", http.MethodPost, "/v1/pools/"+seg(p.name)+"/release",
			keysBody{Keys: keys[start:end], Holder: holder, Session: session}, &out, session)
		if err != nil {
			return all, err
		}
		all = append(all, out.Results...)
	}
	return all, nil
}

// AcquireDurable references key for the durable holder (it stays until that holder releases
// it) and returns its ID. Idempotent per holder.
func (p *Pool) AcquireDurable(ctx context.Context, holder, key string) (Acquired, error) {
	if err := checkHolder(holder); err != nil {
		return Acquired{}, err
	}
	return p.acquire(ctx, key, holder, "")
}

// AcquireManyDurable is AcquireDurable for many keys (in requests of at most
// MaxKeysPerRequest), answers in order.
func (p *Pool) AcquireManyDurable(ctx context.Context, holder string, keys []string) ([]Acquired, error) {
	if err := checkHolder(holder); err != nil {
		return nil, err
	}
	return p.acquireMany(ctx, keys, holder, "")
}

// ReleaseDurable drops the durable holder's reference to key. Releasing what is not held is
// Held: false, not an error.
func (p *Pool) ReleaseDurable(ctx context.Context, holder, key string) (Released, error) {
	if err := checkHolder(holder); err != nil {
		return Released{}, err
	}
	return p.release(ctx, key, holder, "")
}

// ReleaseManyDurable is ReleaseDurable for many keys, answers in order.
func (p *Pool) ReleaseManyDurable(ctx context.Context, holder string, keys []string) ([]Released, error) {
	if err := checkHolder(holder); err != nil {
		return nil, err
	}
	return p.releaseMany(ctx, keys, holder, "")
}

// Lookup is key's ID from the service, or ErrNotFound. With consistent the service reads its
// store (one round trip); else its cache, which may lag a write made through another replica.
func (p *Pool) Lookup(ctx context.Context, key string, consistent bool) (uint64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	var out struct {
		ID uint64 `json:"id"`
	}
	path := fmt.Sprintf("/v1/pools/%s/keys/%s?consistent=%t", seg(p.name), seg(key), consistent)
	if err := p.c.call(ctx, "lookup", http.MethodGet, path, nil, &out, ""); err != nil {
		return 0, err
	}
	return out.ID, nil
}

// LookupID is the key bound to id, from the service, or ErrNotFound.
func (p *Pool) LookupID(ctx context.Context, id uint64, consistent bool) (string, error) {
	var out struct {
		Key string `json:"key"`
	}
	path := fmt.Sprintf("/v1/pools/%s/ids/%d?consistent=%t", seg(p.name), id, consistent)
	if err := p.c.call(ctx, "lookup", http.MethodGet, path, nil, &out, ""); err != nil {
		return "", err
	}
	return out.Key, nil
}

// ListPage is one page of the pool's bindings: those with IDs above *after (nil: from the
// start), at most limit of them (0: the service's default, 1000; at most 10000).
func (p *Pool) ListPage(ctx context.Context, after *uint64, limit int) (*Page, error) {
	if limit < 0 || limit > 10000 {
		return nil, &InputError{What: "limit", Value: strconv.Itoa(limit), Rule: "0 (the default) to 10000"}
	}
	q := url.Values{}
	if after != nil {
		q.Set("after", strconv.FormatUint(*after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/pools/" + seg(p.name) + "/bindings"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out Page
	if err := p.c.call(ctx, "list", http.MethodGet, path, nil, &out, ""); err != nil {
		return nil, err
	}
	return &out, nil
}

// List is every binding of the pool, page after page (pages are not at one revision).
func (p *Pool) List(ctx context.Context) ([]Binding, error) {
	var all []Binding
	var after *uint64
	for {
		page, err := p.ListPage(ctx, after, 0)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Bindings...)
		if page.NextAfter == nil {
			return all, nil
		}
		after = page.NextAfter
	}
}

// Sweep asks the service to reclaim the pool's unreferenced bindings now (it also does so every
// --sweep-interval) and returns how many it reclaimed.
func (p *Pool) Sweep(ctx context.Context) (int, error) {
	var out struct {
		Reclaimed []struct{} `json:"reclaimed"`
	}
	if err := p.c.call(ctx, "sweep", http.MethodPost, "/v1/pools/"+seg(p.name)+"/sweep", nil, &out, ""); err != nil {
		return 0, err
	}
	return len(out.Reclaimed), nil
}
