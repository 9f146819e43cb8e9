package idalloc

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// EventType is what happened to a binding.
type EventType int

const (
	// EventUpsert: Key is bound to ID (new, or moved).
	EventUpsert EventType = iota + 1
	// EventDelete: the binding of Key to ID ended (released, reclaimed, tombstoned).
	EventDelete
	// EventSynced: the view holds the whole pool as of a revision (after the first listing and
	// after every re-listing).
	EventSynced
	// EventSpec: the pool was resized; View.Spec is the spec now in force (ID and Key are empty).
	EventSpec
)

func (t EventType) String() string {
	switch t {
	case EventUpsert:
		return "upsert"
	case EventDelete:
		return "delete"
	case EventSynced:
		return "synced"
	case EventSpec:
		return "spec"
	}
	return "unknown"
}

// Event is a change of a pool's bindings as the view saw it (Cilium's AllocatorEvent).
type Event struct {
	Type EventType
	ID   uint64
	Key  string
}

// msgKind is the kind of one message of the watch stream.
type msgKind int

const (
	msgOther msgKind = iota
	msgUpsert
	msgDelete
	msgSynced
	msgLagged
	msgGone
	msgSpec
)

// msg is one parsed SSE event of the watch stream.
type msg struct {
	kind     msgKind
	id       uint64
	key      string
	revision int64
	spec     *PoolSpec
}

// parseEvent parses one SSE event (its name and data). The error names what is wrong.
func parseEvent(event, data string) (msg, error) {
	bad := func(err error) error { return fmt.Errorf("%s event with data %s: %v", event, data, err) }
	switch event {
	case "upsert", "delete":
		var c struct {
			ID  *uint64 `json:"id"`
			Key *string `json:"key"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return msg{}, bad(err)
		}
		if c.ID == nil || c.Key == nil {
			return msg{}, bad(fmt.Errorf("id and key are required"))
		}
		k := msgUpsert
		if event == "delete" {
			k = msgDelete
		}
		return msg{kind: k, id: *c.ID, key: *c.Key}, nil
	case "synced":
		var s struct {
			Revision *int64 `json:"revision"`
		}
		if err := json.Unmarshal([]byte(data), &s); err != nil || s.Revision == nil {
			return msg{}, bad(fmt.Errorf("a revision is required (%v)", err))
		}
		return msg{kind: msgSynced, revision: *s.Revision}, nil
	case "spec":
		var s struct {
			Revision *int64   `json:"revision"`
			Spec     *PoolSpec `json:"spec"`
		}
		if err := json.Unmarshal([]byte(data), &s); err != nil || s.Revision == nil || s.Spec == nil {
			return msg{}, bad(fmt.Errorf("a revision and a spec are required (%v)", err))
		}
		return msg{kind: msgSpec, revision: *s.Revision, spec: s.Spec}, nil
	case "error":
		var e struct {
			Kind     string `json:"kind"`
			Revision *int64 `json:"revision"`
		}
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			return msg{}, bad(err)
		}
		if e.Kind == "lagged" && e.Revision != nil {
			return msg{kind: msgLagged, revision: *e.Revision}, nil
		}
		return msg{kind: msgGone}, nil
	}
	return msg{kind: msgOther}, nil
}

// viewState is a pool's bindings both ways, fed by the watch stream. Pure: messages in, events
// out; the stream's I/O is in watch.go.
//
// A stream opened without a revision sends the pool's bindings as of one revision R, then
// synced with id R: the state collects that listing apart and swaps it in whole at synced, with
// an event for every difference only, so a re-listing (after 410 gone, a failover to a replica
// whose history does not reach back, a re-created pool) keeps answering from the old bindings
// until it is complete. A stream resumed from revision M sends the changes after M, applied as
// they come. Every SSE id is a revision the state has all of: what a resumed stream sends as
// Last-Event-ID.
type viewState struct {
	byKey    map[string]uint64
	byID     map[uint64]string
	revision int64
	synced   bool
	listing  map[uint64]string
	// spec is the last spec a spec event brought (nil before any resize was seen).
	spec *PoolSpec
}

func newViewState() *viewState {
	return &viewState{byKey: map[string]uint64{}, byID: map[uint64]string{}}
}

// resumeFrom is the revision to resume from, or 0 to list afresh.
func (v *viewState) resumeFrom() int64 {
	if v.synced && v.revision > 0 {
		return v.revision
	}
	return 0
}

// opening: a stream is about to open; without resume it lists the pool.
func (v *viewState) opening(resume bool) {
	if resume {
		v.listing = nil
	} else {
		v.listing = map[uint64]string{}
	}
}

// forget: the next stream lists afresh (410, or the pool was deleted or re-created).
func (v *viewState) forget() {
	v.revision = 0
	v.synced = false
}

// apply applies one message with its SSE id (empty if none) and returns the events to publish.
func (v *viewState) apply(m msg, sseID string) []Event {
	var out []Event
	switch m.kind {
	case msgUpsert:
		if v.listing != nil {
			v.listing[m.id] = m.key
		} else {
			out = v.upsert(m.id, m.key, out)
		}
	case msgDelete:
		if v.listing != nil {
			delete(v.listing, m.id)
		} else {
			out = v.del(m.id, m.key, out)
		}
	case msgSynced:
		if v.listing != nil {
			out = v.swapIn(v.listing, out)
			v.listing = nil
		}
		v.revision = m.revision
		v.synced = true
		out = append(out, Event{Type: EventSynced})
	case msgLagged:
		if v.listing == nil && m.revision > v.revision {
			v.revision = m.revision
		}
	case msgGone:
		v.forget()
	case msgSpec:
		v.spec = m.spec
		out = append(out, Event{Type: EventSpec})
	}
	if v.listing == nil && v.synced {
		if r, err := strconv.ParseInt(strings.TrimSpace(sseID), 10, 64); err == nil && r > v.revision {
			v.revision = r
		}
	}
	return out
}

func (v *viewState) upsert(id uint64, key string, out []Event) []Event {
	if k, ok := v.byID[id]; ok && k == key {
		return out
	}
	if old, ok := v.byKey[key]; ok {
		delete(v.byID, old)
	}
	if oldKey, ok := v.byID[id]; ok {
		delete(v.byKey, oldKey)
	}
	v.byID[id] = key
	v.byKey[key] = id
	return append(out, Event{Type: EventUpsert, ID: id, Key: key})
}

func (v *viewState) del(id uint64, key string, out []Event) []Event {
	if k, ok := v.byID[id]; !ok || k != key {
		return out // stale: the ID is bound to another key now
	}
	delete(v.byID, id)
	delete(v.byKey, key)
	return append(out, Event{Type: EventDelete, ID: id, Key: key})
}

func (v *viewState) swapIn(listing map[uint64]string, out []Event) []Event {
	var gone []Binding
	for id, key := range v.byID {
		if k, ok := listing[id]; !ok || k != key {
			gone = append(gone, Binding{ID: id, Key: key})
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].ID < gone[j].ID })
	for _, b := range gone {
		out = v.del(b.ID, b.Key, out)
	}
	ids := make([]uint64, 0, len(listing))
	for id := range listing {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		out = v.upsert(id, listing[id], out)
	}
	return out
}

// snapshot is every binding, sorted by ID (holders not included).
func (v *viewState) snapshot() []Binding {
	out := make([]Binding, 0, len(v.byID))
	for id, key := range v.byID {
		out = append(out, Binding{ID: id, Key: key})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
