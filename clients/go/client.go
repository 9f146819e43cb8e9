// Package idalloc is a Go client of `idalloc serve`, the HTTP service of the idalloc distributed
// ID allocator (docs/guide/api.md). It gives a Go agent what a process linking the Rust library gets:
// the same ID for a key on every node, IDs that return to their pool when the agent dies (client
// sessions, renewed in the background), a local view of a pool fed by the service's watch, and
// failover between the service's replicas.
//
// Standard library only. For agents written against Cilium's allocator, [Allocator] has its
// shape: Allocate(ctx, key) (id, isNew, err), Release, Get, GetByID, Observe.
package idalloc

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options of a Client. Zero values take the defaults named on each field.
type Options struct {
	// Endpoints are the base URLs of the service's replicas (http:// or https://), tried in order
	// and failed over between. At least one.
	Endpoints []string
	// Token is sent as "Authorization: Bearer TOKEN" (services run with --auth-tokens).
	Token string
	// CAFile is a PEM file of the CA that signed the service's certificate (default: the
	// system's roots). CertFile and KeyFile are this client's certificate and key, for a service
	// that asks for them (--client-ca).
	CAFile, CertFile, KeyFile string
	// TLSConfig, if set, is used as it is (CAFile, CertFile and KeyFile are then ignored).
	TLSConfig *tls.Config
	// RequestTimeout bounds one HTTP request (default 10s); not the watch stream.
	RequestTimeout time.Duration
	// Attempts of one call over all endpoints (default 8).
	Attempts int
	// BackoffBase is the first backoff step once every endpoint was tried (default 100ms),
	// doubling up to BackoffMax (default 2s), with full jitter.
	BackoffBase, BackoffMax time.Duration
	// WatchIdleTimeout: a watch stream that brings nothing for this long (the service sends a
	// comment every 15s) is taken as dead and re-opened on the next endpoint (default 45s).
	WatchIdleTimeout time.Duration
	// HTTPClient, if set, sends every request (its Timeout should be 0: the client sets
	// deadlines per request, and the watch stream never ends). TLS options are then ignored.
	HTTPClient *http.Client
}

// Client is a client of one `idalloc serve` deployment: one or more replicas sharing a store.
// Safe for concurrent use.
type Client struct {
	opts      Options
	endpoints []string
	http      *http.Client
	current   atomic.Uint64
	rngMu     sync.Mutex
	rng       *rand.Rand
}

// New checks the options and makes a Client. It makes no request.
func New(opts Options) (*Client, error) {
	if len(opts.Endpoints) == 0 {
		return nil, &InputError{What: "endpoints", Value: "", Rule: "at least one endpoint"}
	}
	eps := make([]string, 0, len(opts.Endpoints))
	for _, e := range opts.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return nil, &InputError{What: "endpoint", Value: e,
				Rule: "an http:// or https:// URL of an idalloc serve (e.g. http://127.0.0.1:7379), without query or fragment"}
		}
		eps = append(eps, strings.TrimRight(e, "/"))
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 10 * time.Second
	}
	if opts.Attempts == 0 {
		opts.Attempts = 8
	}
	if opts.BackoffBase == 0 {
		opts.BackoffBase = 100 * time.Millisecond
	}
	if opts.BackoffMax == 0 {
		opts.BackoffMax = 2 * time.Second
	}
	if opts.WatchIdleTimeout == 0 {
		opts.WatchIdleTimeout = 45 * time.Second
	}
	if opts.Attempts < 0 || opts.RequestTimeout < 0 || opts.BackoffBase < 0 || opts.BackoffMax < opts.BackoffBase || opts.WatchIdleTimeout < 0 {
		return nil, &InputError{What: "options", Value: fmt.Sprintf("attempts=%d timeouts=%v/%v backoff=%v..%v",
			opts.Attempts, opts.RequestTimeout, opts.WatchIdleTimeout, opts.BackoffBase, opts.BackoffMax),
			Rule: "attempts ≥ 1, positive durations, BackoffMax ≥ BackoffBase"}
	}
	hc := opts.HTTPClient
	if hc == nil {
		tlsConf, err := tlsConfig(opts)
		if err != nil {
			return nil, err
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsConf
		tr.MaxIdleConnsPerHost = 64
		hc = &http.Client{Transport: tr}
	}
	return &Client{opts: opts, endpoints: eps, http: hc, rng: rand.New(rand.NewSource(time.Now().UnixNano()))}, nil
}

func tlsConfig(opts Options) (*tls.Config, error) {
	if opts.TLSConfig != nil {
		return opts.TLSConfig, nil
	}
	if opts.CAFile == "" && opts.CertFile == "" && opts.KeyFile == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("idalloc: CA file %s: %w", opts.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &InputError{What: "CA file", Value: opts.CAFile, Rule: "a PEM file with at least one certificate"}
		}
		conf.RootCAs = pool
	}
	if (opts.CertFile == "") != (opts.KeyFile == "") {
		return nil, &InputError{What: "client certificate", Value: opts.CertFile + "," + opts.KeyFile,
			Rule: "CertFile and KeyFile are given together"}
	}
	if opts.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("idalloc: client certificate %s and key %s: %w", opts.CertFile, opts.KeyFile, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// Endpoints are the service's base URLs as the client uses them.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

func (c *Client) currentIndex() int { return int(c.current.Load() % uint64(len(c.endpoints))) }

// advance moves on from endpoint i (unless another call moved already).
func (c *Client) advance(i int) {
	next := uint64((i + 1) % len(c.endpoints))
	c.current.CompareAndSwap(uint64(i), next)
}

func (c *Client) unit() float64 {
	c.rngMu.Lock()
	defer c.rngMu.Unlock()
	return c.rng.Float64()
}

// backoffDelay is the wait before attempt (0-based; 0 never waits) over n endpoints: every
// endpoint once without waiting, then exponential steps from base to max with full jitter
// (unit in [0,1]), never shorter than the service's Retry-After. Pure, so it is tested alone.
func backoffDelay(base, max time.Duration, attempt, n int, retryAfter time.Duration, unit float64) time.Duration {
	if n < 1 {
		n = 1
	}
	var d time.Duration
	if attempt >= n {
		round := attempt/n - 1
		step := base
		for i := 0; i < round && step < max; i++ {
			step *= 2
		}
		if step > max {
			step = max
		}
		d = time.Duration(float64(step) * unit)
	}
	if d < retryAfter {
		d = retryAfter
	}
	return d
}

// retryable reports whether an error answer is retried on the next endpoint (docs/guide/clients.md):
// unavailable, overloaded, rate_limited (after Retry-After), pool_replaced, a proxy's 502–504.
func retryable(status int, kind Kind) bool {
	return (&Error{Status: status, Kind: kind}).Retryable()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// call sends method path with body (JSON, or none if nil) and decodes a 2xx answer into out (if
// not nil), with failover and retries. An error answer is an *Error; no answer after every
// attempt is a *TransportError. secret, if not empty, is redacted from any error text.
func (c *Client) call(ctx context.Context, op, method, path string, body, out interface{}, secret string) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return fmt.Errorf("idalloc: %s: encoding the body: %w", op, err)
		}
	}
	var lastErr error
	lastEp := ""
	for attempt := 0; attempt < c.opts.Attempts; attempt++ {
		i := c.currentIndex()
		status, data, retryAfter, err := c.once(ctx, i, method, path, payload)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			lastErr, lastEp = errors.New(redact(describe(err), secret)), c.endpoints[i]
			c.advance(i)
			if attempt+1 == c.opts.Attempts {
				break
			}
			if err := sleepCtx(ctx, backoffDelay(c.opts.BackoffBase, c.opts.BackoffMax, attempt+1, len(c.endpoints), 0, c.unit())); err != nil {
				return err
			}
			continue
		}
		if status >= 200 && status < 300 {
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(data, out); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrBadAnswer, op, err)
			}
			return nil
		}
		apiErr := &Error{Op: op, Status: status, RetryAfter: retryAfter}
		var eb struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		}
		if json.Unmarshal(data, &eb) == nil && eb.Kind != "" {
			apiErr.Kind, apiErr.Message = Kind(eb.Kind), redact(eb.Message, secret)
		}
		if !apiErr.Retryable() || attempt+1 == c.opts.Attempts {
			return apiErr
		}
		c.advance(i)
		if err := sleepCtx(ctx, backoffDelay(c.opts.BackoffBase, c.opts.BackoffMax, attempt+1, len(c.endpoints), retryAfter, c.unit())); err != nil {
			return err
		}
	}
	return &TransportError{Op: op, Last: lastEp, Err: lastErr}
}

// once is one request to endpoint i.
func (c *Client) once(ctx context.Context, i int, method, path string, payload []byte) (int, []byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.endpoints[i]+path, rd)
	if err != nil {
		return 0, nil, 0, err
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	c.authorize(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, 0, err
	}
	return resp.StatusCode, data, parseRetryAfter(resp.Header.Get("Retry-After")), nil
}

func (c *Client) authorize(req *http.Request) {
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
}

func parseRetryAfter(v string) time.Duration {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
	if err != nil {
		return 0
	}
	return time.Duration(n) * time.Second
}

// describe is a transport error without the request's URL (it may hold a session id).
func describe(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}

// seg percent-encodes one path segment (everything but RFC 3986's unreserved characters).
func seg(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ('a' <= ch && ch <= 'z') || ('A' <= ch && ch <= 'Z') || ('0' <= ch && ch <= '9') || ch == '-' || ch == '.' || ch == '_' || ch == '~' {
			b.WriteByte(ch)
		} else {
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}
