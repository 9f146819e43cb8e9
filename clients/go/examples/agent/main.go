// The example agent, written the same way in Rust (crates/idalloc-client/examples/agent.rs) and
// Python (clients/python/examples/agent.py): open a session, acquire 100 keys on it, wait until
// the pool's watch-fed view shows every one of them with the ID the service gave, print the IDs
// as one JSON line, release the keys and end the session.
//
//	idalloc --store memory: serve --listen 127.0.0.1:7379 &
//	go run ./examples/agent http://127.0.0.1:7379 agents
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	idalloc "github.com/idalloc/idalloc/clients/go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run() error {
	endpoints, pool := "http://127.0.0.1:7379", "agents"
	if len(os.Args) > 1 {
		endpoints = os.Args[1]
	}
	if len(os.Args) > 2 {
		pool = os.Args[2]
	}
	// A bound for a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := idalloc.New(idalloc.Options{Endpoints: strings.Split(endpoints, ","), Token: os.Getenv("IDALLOC_TOKEN")})
	if err != nil {
		return err
	}
	if _, err := c.EnsurePool(ctx, idalloc.PoolSpec{Name: pool, Min: 1, Max: 65535}); err != nil {
		return err
	}
	p, err := c.Pool(pool)
	if err != nil {
		return err
	}
	view := p.Watch(ctx)
	s, err := c.OpenSession(ctx, 15*time.Second)
	if err != nil {
		return err
	}
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("agent-key-%03d", i)
	}
	acquired, err := s.AcquireMany(ctx, p, keys)
	if err != nil {
		return err
	}
	ids := map[string]uint64{}
	for _, a := range acquired {
		ids[a.Key] = a.ID
	}

	// Watch: the view shows every key with its ID.
	if err := view.WaitSynced(ctx); err != nil {
		return err
	}
	for !allShown(view, ids) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the view did not show every acquired key: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	watched := 0
	for k, id := range ids {
		if key, ok := view.KeyOf(id); ok && key == k {
			watched++
		}
	}

	released := 0
	for _, k := range keys {
		r, err := s.Release(ctx, p, k)
		if err != nil {
			return err
		}
		if r.Held {
			released++
		}
	}
	if err := s.End(ctx); err != nil {
		return err
	}
	line, err := json.Marshal(map[string]interface{}{"agent": "go", "pool": pool, "ids": ids, "watched": watched, "released": released})
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}

func allShown(v *idalloc.View, ids map[string]uint64) bool {
	for k, id := range ids {
		if got, ok := v.Get(k); !ok || got != id {
			return false
		}
	}
	return true
}
