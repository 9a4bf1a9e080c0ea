// Package podindex keeps a live index of pods, fed by a list + watch of
// whole pods: per pod what a round of restarts decides on (Record: name,
// uid, revision, labels, controller, phase, terminating, Ready and since
// when, why not; of the spec only the ConfigMaps and Secrets it reads,
// Refs), its creation revision where its
// ADDED event was seen, and how far the watch has come. Every round decides
// from it where it watches; Parse reads a LIST's pods into the same Record
// where none does. Namespaces keeps one index per namespace that holds an
// annotated ConfigMap or Secret. See "The pod index" in docs/design.md, and
// docs/pod-index.md.
package podindex

import (
	"context"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/watch"
)

// Index is the pod index of one ListWatcher (one namespace, or all).
type Index struct {
	log *slog.Logger

	mu   sync.Mutex
	pods map[string]map[string]*pod // namespace → uid → pod
	// listed: a list has completed; until then the index answers nothing.
	listed  bool
	listing bool
	listGen uint64
	// at is the revision the watch has shown everything up to (an event's,
	// a bookmark's, a list's); 0 until one that is a number.
	at      uint64
	changed chan struct{} // made when someone waits, closed at the next change
	// ended is the revision at which each of the latest maxEnded deleted
	// pods began to terminate (0: unknown, a relist found it gone);
	// endedOrder is its FIFO of uids.
	ended      map[string]uint64
	endedOrder []string
	// onChange hears of pods whose readiness (or anything else a waiting
	// round decides on) changed; see OnChange.
	onChange func(namespace string, labels map[string]string)
}

// maxEnded bounds ended: a round asks about its pods milliseconds after
// deleting them.
const maxEnded = 4096

// pod is a Record as the index keeps it: the uid is its key, the owner
// interned (the pods of one owner share it), the time in seconds (what the
// API gives).
type pod struct {
	name, rv string
	labels   map[string]string
	owner    unique.Handle[Owner]  // zero: none
	node     unique.Handle[string] // zero: not scheduled; the pods of a node share it
	// refs are read once, when the pod is first seen: the volumes and env
	// of a pod's spec cannot change.
	refs   Refs
	reason string
	since  int64 // unix seconds; 0: unknown
	// created is the revision of the ADDED event, i.e. the creation; 0
	// (unknown: before any change) for a pod first seen otherwise.
	created uint64
	// terminatedAt is the revision of the first event with a
	// deletionTimestamp; 0 without one or if it was not a number.
	terminatedAt                         uint64
	listGen                              uint64
	terminating, finished, ready, broken bool
}

// record returns p as a Record.
func (p *pod) record(uid string) Record {
	r := Record{Name: p.name, UID: uid, ResourceVersion: p.rv, Labels: p.labels, Reason: p.reason,
		Terminating: p.terminating, Finished: p.finished, Ready: p.ready, Broken: p.broken, Refs: p.refs}
	if p.owner != (unique.Handle[Owner]{}) {
		r.Owner = p.owner.Value()
	}
	if p.node != (unique.Handle[string]{}) {
		r.Node = p.node.Value()
	}
	if p.since != 0 {
		r.Since = time.Unix(p.since, 0).UTC()
	}
	return r
}

// set makes p hold r (but the revisions the index keeps itself).
func (p *pod) set(r *Record) {
	p.name, p.rv, p.labels, p.reason, p.refs = r.Name, r.ResourceVersion, r.Labels, r.Reason, r.Refs
	switch {
	case r.Owner.UID == "":
		p.owner = unique.Handle[Owner]{}
	case p.owner == unique.Handle[Owner]{} || p.owner.Value() != r.Owner:
		p.owner = unique.Make(r.Owner)
	}
	switch {
	case r.Node == "":
		p.node = unique.Handle[string]{}
	case p.node == unique.Handle[string]{} || p.node.Value() != r.Node:
		p.node = unique.Make(r.Node)
	}
	p.since = 0
	if !r.Since.IsZero() {
		p.since = r.Since.Unix()
	}
	p.terminating, p.finished, p.ready, p.broken = r.Terminating, r.Finished, r.Ready, r.Broken
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
// Every pod may have changed while the watch was down: whoever hears of
// changes hears of every namespace.
func (x *Index) EndList() {
	x.mu.Lock()
	var namespaces []string
	for ns, pods := range x.pods {
		for uid, p := range pods {
			if p.listGen != x.listGen {
				// Gone while the watch was down: no event will tell when it
				// began to terminate, unless an earlier one did.
				x.noteEnded(uid, p.terminatedAt)
				delete(pods, uid)
			}
		}
		if len(pods) == 0 {
			delete(x.pods, ns)
		}
		namespaces = append(namespaces, ns)
	}
	x.listing = false
	x.listed = true
	x.notify()
	onChange := x.onChange
	x.mu.Unlock()
	if onChange != nil {
		for _, ns := range namespaces {
			onChange(ns, nil)
		}
	}
}

// Progress implements watch.Progresser: the watch has shown everything up
// to rv (a list's revision, a bookmark's).
func (x *Index) Progress(rv string) {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return // not a number: never caught up to a bound (policy then lists)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if n > x.at {
		x.at = n
		x.notify()
	}
}

// OnChange has f told, outside the index's lock and never during a list,
// of every pod whose readiness, phase, termination, brokenness or labels
// changed, or that was deleted, by its namespace and labels (the old and
// the new, when they changed); labels nil: any pod of the namespace may
// have (after a relist). f must not block: it runs on the watch's
// goroutine.
func (x *Index) OnChange(f func(namespace string, labels map[string]string)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.onChange = f
}

// Handle implements watch.Handler.
func (x *Index) Handle(ev watch.Event) {
	// A view of the event's buffer, valid during this call only: whatever
	// is kept is cloned out of it (Record's parse, readLabels), so an
	// update that changes nothing kept allocates nothing.
	var obj gjson.Result
	if len(ev.Object) > 0 {
		obj = gjson.Parse(unsafe.String(unsafe.SliceData(ev.Object), len(ev.Object)))
	}
	meta := obj.Get("metadata")
	ns, name, uid := meta.Get("namespace").String(), meta.Get("name").String(), meta.Get("uid").String()
	if ns == "" || name == "" || uid == "" {
		x.log.Warn("pod index: skipping object without namespace, name or uid", "type", string(ev.Type), "rv", ev.ResourceVersion)
		return
	}
	rv, err := strconv.ParseUint(meta.Get("resourceVersion").String(), 10, 64)
	if err != nil {
		rv = 0 // unknown: never taken as a revision
	}

	x.mu.Lock()
	if ev.Type != watch.Synced && rv > x.at {
		x.at = rv // a watch event: everything up to it has been shown
	}
	var wake []map[string]string
	if ev.Type == watch.Deleted {
		wake = x.deleted(ns, uid, rv)
	} else {
		wake = x.update(ev.Type, ns, uid, obj, rv)
	}
	x.notify()
	onChange, listing := x.onChange, x.listing
	x.mu.Unlock()
	if onChange != nil && !listing && len(wake) > 0 {
		ns := strings.Clone(ns)
		for _, labels := range wake {
			onChange(ns, labels)
		}
	}
}

// deleted forgets pod uid of namespace ns, deleted at revision rv, and
// returns its labels if it was known. x.mu must be held.
func (x *Index) deleted(ns, uid string, rv uint64) (wake []map[string]string) {
	pods := x.pods[ns]
	since := rv
	p := pods[uid]
	if p != nil {
		wake = append(wake, p.labels)
		if p.terminatedAt != 0 {
			since = p.terminatedAt
		}
	}
	if since != 0 {
		x.noteEnded(strings.Clone(uid), since)
	}
	delete(pods, uid)
	if len(pods) == 0 {
		delete(x.pods, ns)
	}
	return wake
}

// noteEnded notes pod uid gone, having begun to terminate at revision
// since (0: unknown), unless it was noted already. x.mu must be held.
func (x *Index) noteEnded(uid string, since uint64) {
	if _, ok := x.ended[uid]; ok {
		return
	}
	if len(x.endedOrder) == maxEnded {
		delete(x.ended, x.endedOrder[0])
		x.endedOrder = x.endedOrder[1:]
	}
	x.ended[uid] = since
	x.endedOrder = append(x.endedOrder, uid)
}

// update records pod uid of namespace ns as an event or a list showed it
// at revision rv, and returns the labels to wake rounds for: none if
// nothing a round decides on changed. x.mu must be held.
func (x *Index) update(typ watch.EventType, ns, uid string, obj gjson.Result, rv uint64) (wake []map[string]string) {
	pods := x.pods[ns]
	if pods == nil {
		pods = map[string]*pod{}
		x.pods[strings.Clone(ns)] = pods
	}
	p := pods[uid]
	var old Record
	if p != nil {
		old = p.record(uid)
	}
	var r Record
	parse(obj.Get("metadata"), obj.Get("spec"), obj.Get("status"), &r, &old)
	r.Refs = old.Refs
	switch {
	case p == nil:
		p = &pod{}
		r.Refs = ParseRefs(obj.Get("spec"))
		// Only an ADDED event tells a creation. A pod first seen in a
		// list (or modified) keeps 0, "created before any change": its
		// revision there is that of its last update, which may follow a
		// change its creation preceded, and a pod left on old data is
		// worse than a restart too many.
		if typ == watch.Added {
			p.created = rv
		}
		pods[strings.Clone(uid)] = p
		if r.Ready && !r.Terminating {
			wake = append(wake, r.Labels) // one more available pod
		}
	case old.Ready != r.Ready || old.Terminating != r.Terminating || old.Finished != r.Finished || old.Broken != r.Broken:
		wake = append(wake, r.Labels)
	}
	if old.UID != "" && !sameMap(old.Labels, r.Labels) {
		wake = append(wake, old.Labels, r.Labels)
	}
	p.listGen = x.listGen
	if !r.Terminating {
		p.terminatedAt = 0
	} else if !p.terminating {
		p.terminatedAt = rv
	}
	p.set(&r)
	return wake
}

// sameMap reports whether a and b are the same map (readLabels keeps an
// unchanged one).
func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
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

// View returns every pod of namespace the index holds, terminating and
// finished ones included; ok is false until the first list has ended and
// during a relist: pods would be missing. The Records share the index's
// labels: read only.
func (x *Index) View(namespace string) (pods []Record, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.listed || x.listing {
		return nil, false
	}
	pods = make([]Record, 0, len(x.pods[namespace]))
	for uid, p := range x.pods[namespace] {
		pods = append(pods, p.record(uid))
	}
	return pods, true
}

// ShownUpTo returns the revision the index has shown every pod event up to
// (0: none yet). Everything at or below it happened before this call.
func (x *Index) ShownUpTo() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.at
}

// CaughtUp reports whether the index has shown everything up to revision
// rv (of pods: revisions of one resource compare), waiting up to wait for
// its watch to get there; never during a relist.
func (x *Index) CaughtUp(ctx context.Context, rv uint64, wait time.Duration) bool {
	return x.waitFor(ctx, wait, func() bool { return x.listed && !x.listing && x.at >= rv })
}

// Created returns the revision a pod was created at (see pod.created: 0,
// before any change, where its ADDED event was not seen), waiting up to
// wait for the pod to appear: a pod a LIST just returned may not have
// reached the watch yet. known is false if it did not appear in time.
func (x *Index) Created(ctx context.Context, namespace, uid string, wait time.Duration) (created uint64, known bool) {
	known = x.waitFor(ctx, wait, func() bool {
		p := x.pods[namespace][uid]
		if p != nil {
			created = p.created
		}
		return p != nil
	})
	return created, known
}

// Get returns pod uid of namespace once the index shows it at a
// resourceVersion other than notRV (exists), or gone, waiting up to wait:
// a deletion refused for a stale resourceVersion is judged again on the
// pod as it is now. known is false if the index did not show either in
// time.
func (x *Index) Get(ctx context.Context, namespace, uid, notRV string, wait time.Duration) (r Record, exists, known bool) {
	known = x.waitFor(ctx, wait, func() bool {
		if !x.listed || x.listing {
			return false
		}
		p := x.pods[namespace][uid]
		if p == nil {
			exists = false
			return true
		}
		r, exists = p.record(uid), true
		return p.rv != notRV
	})
	return r, exists, known
}

// Terminated returns the revision at which a pod began to terminate (its
// first event with a deletionTimestamp, or its deletion), waiting up to wait
// for the watch to show it; known is false if it did not. A pod a relist
// found gone, no event having told its termination, is not waited for:
// none will.
func (x *Index) Terminated(ctx context.Context, namespace, uid string, wait time.Duration) (since uint64, known bool) {
	x.waitFor(ctx, wait, func() bool {
		if p := x.pods[namespace][uid]; p != nil {
			since = p.terminatedAt
			return since != 0
		}
		var gone bool
		since, gone = x.ended[uid]
		return gone
	})
	return since, since != 0
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
