package idalloc

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// View is a local copy of a pool's bindings, fed by the service's watch stream: Get and KeyOf
// answer from memory, without a request. It follows the stream until its context ends:
//   - a broken stream is resumed from the last revision the view has all of (Last-Event-ID), on
//     the next endpoint, after a random wait of up to BackoffBase (a replica that dies breaks every
//     agent's stream at once; the wait spreads their arrival at the next replica);
//   - 410 gone (that replica's history does not reach back, or the pool was re-created) re-lists:
//     the listing is swapped in whole when complete, with events for the differences only;
//   - a stream ended for lagging resumes from the revision it names;
//   - a stream silent for WatchIdleTimeout is taken as dead.
type View struct {
	pool *Pool

	mu     sync.Mutex
	state  *viewState
	subs   map[int]chan Event
	nextID int
	synced chan struct{}
	once   sync.Once
	done   chan struct{}
}

// Watch starts following the pool; the view is filled once WaitSynced returns. It stops when
// ctx ends.
func (p *Pool) Watch(ctx context.Context) *View {
	v := &View{pool: p, state: newViewState(), subs: map[int]chan Event{}, synced: make(chan struct{}), done: make(chan struct{})}
	go v.follow(ctx)
	return v
}

// Get is key's ID in the view.
func (v *View) Get(key string) (uint64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	id, ok := v.state.byKey[key]
	return id, ok
}

// KeyOf is the key bound to id in the view.
func (v *View) KeyOf(id uint64) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k, ok := v.state.byID[id]
	return k, ok
}

// Snapshot is every binding in the view, sorted by ID (without holders).
func (v *View) Snapshot() []Binding {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state.snapshot()
}

// Len is the number of bindings in the view.
func (v *View) Len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.state.byID)
}

// Spec is the pool's spec as the last spec event of the stream brought it (a resize seen while
// watching: an EventSpec); false if the view has seen none (the pool's spec is then
// Client.ShowPool's).
func (v *View) Spec() (PoolSpec, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state.spec == nil {
		return PoolSpec{}, false
	}
	s := *v.state.spec
	s.Reserved = append([][2]uint64(nil), s.Reserved...)
	return s, true
}

// Revision is the last store revision the view has all the changes of (0 before the first sync).
func (v *View) Revision() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state.revision
}

// WaitSynced returns once the view held the whole pool at least once.
func (v *View) WaitSynced(ctx context.Context) error {
	select {
	case <-v.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed when the view stopped following the pool (its context ended).
func (v *View) Done() <-chan struct{} { return v.done }

// Observe is a channel of the view's events from now on (buffer: capacity of the channel; 0 takes
// 1024), closed when ctx or the view ends. Delivery blocks the view's stream while the buffer is
// full (as Cilium's events channel does): read it, or cancel ctx.
func (v *View) Observe(ctx context.Context, buffer int) <-chan Event {
	if buffer <= 0 {
		buffer = 1024
	}
	ch := make(chan Event, buffer)
	v.mu.Lock()
	id := v.nextID
	v.nextID++
	v.subs[id] = ch
	v.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-v.done:
		}
		v.mu.Lock()
		if _, ok := v.subs[id]; ok {
			delete(v.subs, id)
			close(ch)
		}
		v.mu.Unlock()
	}()
	return ch
}

// publish delivers events to every subscriber (under v.mu, so that a subscriber leaving cannot
// close its channel mid-send; a full buffer waits, or gives up when ctx ends).
func (v *View) publish(ctx context.Context, events []Event) {
	for _, e := range events {
		if e.Type == EventSynced {
			v.once.Do(func() { close(v.synced) })
		}
		v.mu.Lock()
		subs := make([]chan Event, 0, len(v.subs))
		for _, ch := range v.subs {
			subs = append(subs, ch)
		}
		v.mu.Unlock()
		for _, ch := range subs {
			v.send(ctx, ch, e)
		}
	}
}

func (v *View) send(ctx context.Context, ch chan Event, e Event) {
	defer func() { _ = recover() }() // the subscriber left and its channel closed meanwhile
	select {
	case ch <- e:
	case <-ctx.Done():
	}
}

type streamEnd int

const (
	endFailed streamEnd = iota
	endRelist
	endResume
	endStop
)

func (v *View) follow(ctx context.Context) {
	defer close(v.done)
	c := v.pool.c
	path := "/v1/pools/" + seg(v.pool.name) + "/watch"
	failedOpens := 0
	for {
		if ctx.Err() != nil {
			return
		}
		v.mu.Lock()
		resume := v.state.resumeFrom()
		v.state.opening(resume > 0)
		v.mu.Unlock()
		i := c.currentIndex()
		end, streamed := v.stream(ctx, i, path, resume)
		var wait time.Duration
		switch end {
		case endStop:
			return
		case endRelist:
			v.mu.Lock()
			v.state.forget()
			v.mu.Unlock()
			failedOpens = 0
			wait = time.Duration(float64(c.opts.BackoffBase) * c.unit())
		case endResume:
			failedOpens = 0
		case endFailed:
			c.advance(i)
			if streamed {
				failedOpens = 0
				wait = time.Duration(float64(c.opts.BackoffBase) * c.unit())
			} else {
				failedOpens++
				wait = backoffDelay(c.opts.BackoffBase, c.opts.BackoffMax, failedOpens, len(c.endpoints), 0, c.unit())
			}
		}
		if sleepCtx(ctx, wait) != nil {
			return
		}
	}
}

// stream runs one watch stream on endpoint i until it ends; streamed says it had opened.
func (v *View) stream(ctx context.Context, i int, path string, resume int64) (streamEnd, bool) {
	c := v.pool.c
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, c.endpoints[i]+path, nil)
	if err != nil {
		return endStop, false
	}
	req.Header.Set("Accept", "text/event-stream")
	if resume > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(resume, 10))
	}
	c.authorize(req)
	// The answer's head must come within the request timeout; then the idle timer takes over.
	idle := time.AfterFunc(c.opts.RequestTimeout, cancel)
	defer idle.Stop()
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return endStop, false
		}
		return endFailed, false
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusGone:
		return endRelist, false
	default:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return endFailed, false
	}
	idle.Reset(c.opts.WatchIdleTimeout)
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	var event, id string
	var data strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if ctx.Err() != nil {
				return endStop, true
			}
			return endFailed, true
		}
		idle.Reset(c.opts.WatchIdleTimeout)
		line = strings.TrimRight(line, "\r\n")
		if line != "" {
			field, value := line, ""
			if k := strings.IndexByte(line, ':'); k >= 0 {
				field, value = line[:k], strings.TrimPrefix(line[k+1:], " ")
			}
			switch field {
			case "": // a comment (": keep-alive")
			case "event":
				event = value
			case "data":
				if data.Len() > 0 {
					data.WriteByte('\n')
				}
				data.WriteString(value)
			case "id":
				id = value
			}
			continue
		}
		// A blank line dispatches the event.
		if event == "" && data.Len() == 0 && id == "" {
			continue
		}
		name := event
		if name == "" {
			name = "message"
		}
		m, perr := parseEvent(name, data.String())
		id0 := id
		event, id = "", ""
		data.Reset()
		if perr != nil {
			return endFailed, true
		}
		v.mu.Lock()
		out := v.state.apply(m, id0)
		v.mu.Unlock()
		v.publish(ctx, out)
		switch m.kind {
		case msgGone:
			return endRelist, true
		case msgLagged:
			return endResume, true
		}
	}
}
