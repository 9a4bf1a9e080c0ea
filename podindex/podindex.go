// Package podindex keeps a lean live index of pods (name, uid, labels,
// revisions; nothing of spec or status), fed by a metadata-only list + watch,
// so that a round of restarts can begin the moment a ConfigMap changes. It is
// never the last word: the round confirms with a consistent LIST, the sweep.
// Namespaces keeps one index per namespace that holds an annotated ConfigMap or Secret.
// See "The pod index" in docs/design.md, and docs/pod-index.md.
package podindex

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/watch"
)

// Pod is a pod the index selected.
type Pod struct {
	Name, UID string
	// ResourceVersion as the index last saw it: a deletion decided from the
	// index carries it as a precondition, so a stale index makes the server
	// refuse instead of deleting the wrong pod.
	ResourceVersion string
}

// Index is the pod index of one ListWatcher (one namespace, or all).
type Index struct {
	log *slog.Logger

	mu   sync.Mutex
	pods map[string]map[string]*pod // namespace → uid → pod
	// lists counts completed lists: creation revisions read from different
	// lists are not comparable (a relist stamps a pod it first sees with its
	// current revision), so callers compare lists before and after.
	lists   uint64
	listing bool
	listGen uint64
	changed chan struct{} // made when someone waits, closed at the next change
	// ended is the revision at which each of the latest maxEnded deleted
	// pods began to terminate; endedOrder is its FIFO of uids.
	ended      map[string]uint64
	endedOrder []string
}

// maxEnded bounds ended: a round asks about its pods milliseconds after
// deleting them.
const maxEnded = 4096

type pod struct {
	name   string
	labels map[string]string
	// created is the revision of the ADDED event, i.e. the creation; from a
	// list, the pod's revision then, which is no earlier.
	created     uint64
	terminating bool
	// terminatedAt is the revision of the first event with a
	// deletionTimestamp; 0 without one or if it was not a number.
	terminatedAt uint64
	listGen      uint64
	rv           string
}

var _ watch.Handler = (*Index)(nil)

// New returns an empty index to feed to a watch.ListWatcher. log may be nil
// (slog's default).
func New(log *slog.Logger) *Index {
	if log == nil {
		log = slog.Default()
	}
	return &Index{log: log, pods: map[string]map[string]*pod{}, ended: map[string]uint64{}}
}

// BeginList implements watch.Handler.
func (x *Index) BeginList() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.listing = true
	x.listGen++
}

// EndList implements watch.Handler: pods the list did not show are gone.
func (x *Index) EndList() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for ns, pods := range x.pods {
		for uid, p := range pods {
			if p.listGen != x.listGen {
				delete(pods, uid)
			}
		}
		if len(pods) == 0 {
			delete(x.pods, ns)
		}
	}
	x.listing = false
	x.lists++
	x.notify()
}

// Handle implements watch.Handler.
func (x *Index) Handle(ev watch.Event) {
	// GetBytes copies the metadata out of the event's buffer, which is
	// reused after the call; the strings kept are cloned out of that copy.
	meta := gjson.GetBytes(ev.Object, "metadata")
	ns, name, uid := meta.Get("namespace").String(), meta.Get("name").String(), meta.Get("uid").String()
	if ns == "" || name == "" || uid == "" {
		x.log.Warn("pod index: skipping object without namespace, name or uid", "type", string(ev.Type), "rv", ev.ResourceVersion)
		return
	}
	rvText := meta.Get("resourceVersion").String()
	rv, err := strconv.ParseUint(rvText, 10, 64)
	if err != nil {
		rv = 0 // unknown: never taken as a revision
	}

	x.mu.Lock()
	defer x.mu.Unlock()
	defer x.notify()
	pods := x.pods[ns]
	if ev.Type == watch.Deleted {
		since := rv
		if p := pods[uid]; p != nil && p.terminatedAt != 0 {
			since = p.terminatedAt
		}
		if _, ok := x.ended[uid]; !ok && since != 0 {
			if len(x.endedOrder) == maxEnded {
				delete(x.ended, x.endedOrder[0])
				x.endedOrder = x.endedOrder[1:]
			}
			uid := strings.Clone(uid)
			x.ended[uid] = since
			x.endedOrder = append(x.endedOrder, uid)
		}
		delete(pods, uid)
		if len(pods) == 0 {
			delete(x.pods, ns)
		}
		return
	}
	if pods == nil {
		pods = map[string]*pod{}
		x.pods[strings.Clone(ns)] = pods
	}
	p := pods[uid]
	if p == nil {
		p = &pod{name: strings.Clone(name)}
		// A pod first seen modified keeps 0: "started before any change".
		if ev.Type == watch.Added || ev.Type == watch.Synced {
			p.created = rv
		}
		pods[strings.Clone(uid)] = p
	}
	p.listGen = x.listGen
	if rvText != p.rv {
		p.rv = strings.Clone(rvText)
	}
	if meta.Get("deletionTimestamp").Type == gjson.Null { // absent or null
		p.terminating, p.terminatedAt = false, 0
	} else if !p.terminating {
		p.terminating, p.terminatedAt = true, rv
	}
	p.labels = readLabels(meta.Get("labels"), p.labels)
}

// readLabels returns the labels in r, reusing old when they are unchanged
// (the common case: a status update), so an update allocates nothing.
func readLabels(r gjson.Result, old map[string]string) map[string]string {
	same, n := true, 0
	r.ForEach(func(k, v gjson.Result) bool {
		n++
		ov, ok := old[k.String()]
		same = ok && ov == v.String()
		return same
	})
	if same && n == len(old) {
		return old
	}
	labels := make(map[string]string, n)
	r.ForEach(func(k, v gjson.Result) bool {
		labels[strings.Clone(k.String())] = strings.Clone(v.String())
		return true
	})
	return labels
}

// notify wakes everyone waiting for a change. x.mu must be held.
func (x *Index) notify() {
	if x.changed != nil {
		close(x.changed)
		x.changed = nil
	}
}

// Select returns the pods of namespace whose labels match and that are not
// terminating, and the number of lists behind the answer. ok is false until
// the first list has ended and during a relist: pods would be missing.
func (x *Index) Select(namespace string, matches func(labels map[string]string) bool) (pods []Pod, lists uint64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.lists == 0 || x.listing {
		return nil, x.lists, false
	}
	for uid, p := range x.pods[namespace] {
		if !p.terminating && matches(p.labels) {
			pods = append(pods, Pod{Name: p.name, UID: uid, ResourceVersion: p.rv})
		}
	}
	return pods, x.lists, true
}

// Created returns the revision a pod was created at (see pod.created) and
// the number of lists behind the answer, waiting up to wait for the pod to
// appear: a pod a LIST just returned may not have reached the watch yet.
// known is false if it did not appear in time.
func (x *Index) Created(ctx context.Context, namespace, uid string, wait time.Duration) (created, lists uint64, known bool) {
	known = x.waitFor(ctx, wait, func() bool {
		p := x.pods[namespace][uid]
		if p != nil {
			created = p.created
		}
		lists = x.lists
		if x.listing {
			// This relist stamps a pod it first sees with its current
			// revision: count it already, so no caller takes one for the other.
			lists++
		}
		return p != nil
	})
	return created, lists, known
}

// Terminated returns the revision at which a pod began to terminate (its
// first event with a deletionTimestamp, or its deletion), waiting up to wait
// for the watch to show it; known is false if it did not.
func (x *Index) Terminated(ctx context.Context, namespace, uid string, wait time.Duration) (since uint64, known bool) {
	known = x.waitFor(ctx, wait, func() bool {
		if p := x.pods[namespace][uid]; p != nil {
			since = p.terminatedAt
		} else {
			since = x.ended[uid]
		}
		return since != 0
	})
	return since, known
}

// waitFor evaluates found under x.mu, again after each change, until it is
// true, wait has passed, or ctx is done.
func (x *Index) waitFor(ctx context.Context, wait time.Duration, found func() bool) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		x.mu.Lock()
		ok := found()
		if !ok && x.changed == nil {
			x.changed = make(chan struct{})
		}
		changed := x.changed
		x.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
