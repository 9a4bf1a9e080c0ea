package policy

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/podindex"
)

// Every wave decides from the pod index where one watches the namespace,
// in memory, and from a LIST of the namespace's pods only where none does
// (POD_INDEX=false, or while its watch is down). A round that began from
// the index takes the pods it shows then; the index may not have seen a
// pod created a few milliseconds before. So the round's membership is
// bound: once the index has caught up to a pod revision taken after the
// round began (its first DELETE's answer, or a consistent LIST with
// limit=1 where no answer carries one: evictions, a dry run, a round that
// has deleted nothing yet), the pods it shows selected that the round did
// not take are its own too, unless the index saw them created after the
// bound or the round's first deletion (replacements). Where the index does
// not catch up within catchUpWait (bookmarks are rare in a quiet
// namespace), one sweep LIST of the selected pods decides instead, and the round's
// later waves list while the index does not show the pods it found. The
// record waits for one of the two. Where the
// creation cannot be told, the pod is restarted: a restart too many is
// recoverable, old configuration is not. docs/design.md, "The pod index",
// has the reasoning.

// PodIndexes is the pod index as the controller uses it
// (podindex.Namespaces): told which namespaces hold annotated objects, it
// indexes their pods, and offers the index of one while it can answer.
type PodIndexes interface {
	// Annotated says a namespace gained its first existing annotated
	// object (true) or lost its last. It is called with the controller's
	// lock held: it must not block or call back.
	Annotated(namespace string, annotated bool)
	// Cover returns the index of namespace if it can answer now, else nil.
	Cover(namespace string) *podindex.Index
	// OnChange has f told of pods whose readiness (or anything else a
	// waiting round decides on) changed, by namespace and labels (nil:
	// any pod of the namespace).
	OnChange(f func(namespace string, labels map[string]string))
}

// defaultSweepWait bounds how long a round waits for the index to catch
// up to its bound (or to show a pod) before it lists instead: long enough
// for its watch to reconnect through a few failed tries.
const defaultSweepWait = 10 * time.Second

// defaultCatchUpWait bounds the wait for the index to reach a round's bound. A
// bound from a DELETE's answer is reached within milliseconds (the index
// sees that deletion's event); one from a LIST, in a quiet namespace, only
// at the next bookmark, minutes later: a worker is not held for it, and one
// sweep LIST decides instead.
const defaultCatchUpWait = 500 * time.Millisecond

// indexed is the state of a round that began from the index: what bounds
// its membership. The worker of the round owns it, but for mu's fields
// (restart goroutines) and the bound's (its LIST's goroutine, until done
// is closed).
type indexed struct {
	index *podindex.Index
	// swept: the membership is complete. listOnly: the index could not
	// catch up in time, and the round's later waves list while it does not
	// show every pending pod.
	swept, listOnly bool
	bound           *boundList // the limit=1 LIST, once sent

	mu       sync.Mutex
	answered uint64 // the lowest resourceVersion the round's DELETEs answered
	// deleted are the pods whose DELETE or eviction the server accepted:
	// their preconditions held, so their termination is the round's,
	// after its change was seen. A termination that no answer tells is
	// the round's (the answer lost; a precondition failed on a pod
	// terminating) may be someone else's from before the change, shown
	// late by a view behind: it bounds nothing, and its replacement is
	// restarted, a restart too many rather than a pod left on old data.
	deleted []string
}

// boundList is a consistent pod LIST of one item: its revision is the
// bound. rv and err are set before done is closed.
type boundList struct {
	done chan struct{}
	rv   string
	err  error
}

// noteDeleted notes a DELETE or an eviction accepted, and the
// resourceVersion it answered (0: none, an eviction).
func (x *indexed) noteDeleted(uid string, rv uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.deleted = append(x.deleted, uid)
	if rv != 0 {
		x.answered = min(x.answered, rv)
	}
}

// hasAnswer: a DELETE of the round answered a revision.
func (x *indexed) hasAnswer() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.answered != math.MaxUint64
}

// firstDeletion returns the revision at which the round's first accepted
// deletion took effect: the earliest at which the index saw one of those
// pods terminate, or a DELETE's answer, a revision no earlier
// (math.MaxUint64 if nothing was deleted).
func (x *indexed) firstDeletion(ctx context.Context, namespace string, deadline time.Time) uint64 {
	x.mu.Lock()
	first, deleted := x.answered, slices.Clone(x.deleted)
	x.mu.Unlock()
	for _, uid := range deleted {
		if since, ok := x.index.Terminated(ctx, namespace, uid, max(time.Until(deadline), 0)); ok {
			first = min(first, since)
		}
	}
	return first
}

// startedBefore reports whether p was created before first, erring on
// "yes" when that cannot be known.
func (x *indexed) startedBefore(ctx context.Context, namespace string, p podRef, first uint64, deadline time.Time) bool {
	if p.version < first {
		return true // its latest revision is older still (or not a number)
	}
	created, known := x.index.Created(ctx, namespace, p.uid, max(time.Until(deadline), 0))
	return !known || created < first
}

// createdAbove reports whether the index saw p created above revision
// floor; false where it cannot tell (startedBefore then says "yes" anyway).
func (x *indexed) createdAbove(ctx context.Context, namespace string, p podRef, floor uint64, deadline time.Time) bool {
	if p.version <= floor {
		return false // its latest revision is no later
	}
	created, known := x.index.Created(ctx, namespace, p.uid, max(time.Until(deadline), 0))
	return known && created > floor
}

// indexFor returns the index of namespace if one can answer now.
func (c *Controller) indexFor(namespace string) *podindex.Index {
	if c.cfg.Pods == nil {
		return nil
	}
	return c.cfg.Pods.Cover(namespace)
}

// viewOf returns every pod of namespace: from the index (x) where one
// watches, has shown as far as every LIST of the namespace's pods (a view
// never goes back in time) and shows every pending pod of the round, else
// from a LIST (x nil), whose revision r keeps (listedAt). A pending pod the index does not show may be gone,
// or not shown yet (a round that took it from a LIST while the index
// relisted, or a sweep that found it): only the server says which, and
// refresh takes a pod missing from the view for gone. A view whose pods'
// resourceVersions are not numbers is not the index's: preconditions and
// bounds could not be compared.
func (c *Controller) viewOf(ctx context.Context, namespace string, r *round) (view []livePod, x *podindex.Index, err error) {
	if x = c.indexFor(namespace); x != nil {
		shown, opaque, ok := c.indexView(namespace, x)
		switch {
		case !ok:
		case opaque:
			c.sayOpaque(namespace)
		case showsPending(r, shown):
			return shown, x, nil
		}
	}
	var at uint64
	if view, at, err = c.listNamespace(ctx, namespace); err == nil {
		c.budgetOf(namespace).noteListed(view, at)
		r.listedAt = at
	}
	return view, nil, err
}

// indexView returns the pods of namespace as the index x shows them; not
// ok where x has not caught up with the LISTs rounds made there, or has no
// view of it. opaque: a pod's resourceVersion is no decimal number, and
// rounds list instead.
func (c *Controller) indexView(namespace string, x *podindex.Index) (view []livePod, opaque, ok bool) {
	if !c.budgetOf(namespace).indexCaughtUp(x.ShownUpTo()) {
		return nil, false, false
	}
	recs, ok := x.View(namespace)
	if !ok {
		return nil, false, false
	}
	view = make([]livePod, len(recs))
	for i, rec := range recs {
		view[i] = fromRecord(rec)
		opaque = opaque || view[i].version == 0
	}
	return view, opaque, true
}

// showsPending: every pending pod of r is in view.
func showsPending(r *round, view []livePod) bool {
	shown := make(map[string]bool, len(view))
	for i := range view {
		shown[view[i].uid] = true
	}
	for i, p := range r.pods {
		if r.state[i] == podPending && !shown[p.uid] {
			return false
		}
	}
	return true
}

// sayOpaque logs, once per process, that pod resourceVersions are not
// decimal numbers: rounds then list, and count every pod as older than
// the round.
func (c *Controller) sayOpaque(namespace string) {
	if c.opaqueSaid.CompareAndSwap(false, true) {
		c.log.Warn("pod resourceVersions are not decimal numbers: rounds list pods, and count every pod as created before them", "namespace", namespace)
	}
}

// selectedNow returns the pods sel selects now, but the controller's own
// and its siblings (OwnPod): from the index where one watches, else a
// LIST.
func (c *Controller) selectedNow(ctx context.Context, namespace string, sel *selection) ([]livePod, error) {
	if x := c.indexFor(namespace); x != nil {
		if recs, ok := x.View(namespace); ok {
			var pods []livePod
			for _, rec := range recs {
				if p := fromRecord(rec); sel.selects(&p) && !c.cfg.OwnPod.Spares(namespace, p.name, p.uid, p.owner.uid) {
					pods = append(pods, p)
				}
			}
			return pods, nil
		}
	}
	return c.listWhole(ctx, namespace, sel)
}

// podNow returns pod as it is now, once a view shows it at another
// resourceVersion than the one a restart was refused for: the index where
// one watches (and shows it in time), else a LIST by name. found is false
// if it is gone.
func (c *Controller) podNow(ctx context.Context, namespace string, pod podRef) (p livePod, found bool, err error) {
	if x := c.indexFor(namespace); x != nil {
		if rec, exists, known := x.Get(ctx, namespace, pod.uid, pod.rv, c.sweepWait); known {
			if !exists {
				return livePod{}, false, nil
			}
			return fromRecord(rec), true, nil
		}
	}
	return c.reread(ctx, namespace, pod.name)
}

// startBound sends round r's bound LIST, once, without waiting for it:
// no restart waits for a consistent LIST (it may take ~100 ms on a busy
// server).
func (c *Controller) startBound(ctx context.Context, namespace string, r *round) {
	x := r.indexed
	if x == nil || x.swept || x.bound != nil {
		return
	}
	b := &boundList{done: make(chan struct{})}
	x.bound = b
	go func() {
		defer close(b.done)
		b.rv, b.err = c.listRevision(ctx, namespace)
	}()
}

// listRevision returns the revision of a consistent LIST of one pod of
// namespace (no resourceVersion: served once the server's cache is
// current).
func (c *Controller) listRevision(ctx context.Context, namespace string) (string, error) {
	body, err := c.api.GetBody(ctx, apiclient.CorePath(namespace, "pods", ""), url.Values{"limit": {"1"}}, "application/json")
	if err != nil {
		return "", err
	}
	defer body.Close()
	meta, err := apiclient.ReadPage(body, func([]byte) {})
	if err != nil {
		return "", fmt.Errorf("pod list of %s: %w", namespace, err)
	}
	return meta.ResourceVersion, nil
}

// boundOf returns round r's bound: the lowest of its DELETEs' answers and
// its bound LIST's revision, sending that LIST if no answer carries one;
// opaque if it is not a number.
func (c *Controller) boundOf(ctx context.Context, namespace string, r *round) (rv uint64, opaque bool, err error) {
	x := r.indexed
	x.mu.Lock()
	rv = x.answered
	x.mu.Unlock()
	if rv == math.MaxUint64 {
		c.startBound(ctx, namespace, r)
	}
	if x.bound == nil {
		return rv, false, nil
	}
	select {
	case <-x.bound.done:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	if err := x.bound.err; err != nil {
		x.bound = nil // sent again at the next try
		if rv != math.MaxUint64 {
			return rv, false, nil
		}
		return 0, false, fmt.Errorf("membership bound: list pods: %w", err)
	}
	listed, err := strconv.ParseUint(x.bound.rv, 10, 64)
	if err != nil {
		c.sayOpaque(namespace)
		return rv, rv == math.MaxUint64, nil
	}
	return min(rv, listed), false, nil
}

// complete completes the membership of round r, which began from the
// index, once its pending pods are done with: the pods the index shows
// once caught up to the bound, or a sweep LIST shows where it cannot catch
// up in time, that were created before the round began, and that r did not
// take, are named in the intent and added (added is true: the round goes
// on). r's record waits for it.
func (c *Controller) complete(ctx context.Context, key string, obj object, r *round, log *slog.Logger) (added bool, err error) {
	x := r.indexed
	if x == nil || x.swept {
		return false, nil
	}
	// One deadline for the whole completion: with the index's watch down,
	// every pod it lacks would otherwise cost the full wait in turn.
	deadline := time.Now().Add(c.sweepWait)
	bound, opaque, err := c.boundOf(ctx, obj.namespace, r)
	if err != nil {
		return false, err
	}
	var seen []livePod
	caught := false
	if !x.listOnly && !opaque && c.indexFor(obj.namespace) == x.index && x.index.CaughtUp(ctx, bound, min(time.Until(deadline), c.catchUpWait)) {
		if recs, ok := x.index.View(obj.namespace); ok {
			caught = true
			for _, rec := range recs {
				if p := fromRecord(rec); r.sel.selects(&p) && !c.cfg.OwnPod.Spares(obj.namespace, p.name, p.uid, p.owner.uid) {
					seen = append(seen, p)
				}
			}
		}
	}
	if !caught {
		if seen, err = c.listWhole(ctx, obj.namespace, r.sel); err != nil {
			return false, fmt.Errorf("sweep: list pods: %w", err)
		}
		x.listOnly = true
	}
	// What follows the moment the change was seen, as known now; waited for
	// below only where a pod's membership depends on it.
	first := min(bound, x.firstDeletion(ctx, obj.namespace, deadline), c.seenCutoff(ctx, obj.namespace, r, 0))
	waited := false
	state := make(map[string]podState, len(r.pods))
	for i, p := range r.pods {
		state[p.uid] = r.state[i]
	}
	var missed []podRef
	for _, l := range seen {
		p := l.podRef
		st, taken := state[p.uid]
		switch {
		case l.terminating || !l.live() || st == podRestarted || st == podGone:
		case r.only != nil && !r.only[p.uid]: // a resumed round's pods are those its intent names
		case taken: // refused or left, and selected again
			missed = append(missed, p)
		case opaque:
			missed = append(missed, p)
		default:
			before := x.startedBefore(ctx, obj.namespace, p, first, deadline)
			if before && !waited && x.createdAbove(ctx, obj.namespace, p, r.seenFloor, deadline) {
				// Created after what the index had shown when the change
				// was seen: perhaps after it, by a DELETE in flight then.
				// What places that moment (the DELETEs sent after it, the
				// mark) is waited for here, once, and only for such a pod:
				// rounds over pods that were there before (a burst of
				// changes) never wait for one another's requests.
				waited = true
				first = min(first, c.seenCutoff(ctx, obj.namespace, r, min(time.Until(deadline), c.catchUpWait)))
				before = x.startedBefore(ctx, obj.namespace, p, first, deadline)
			}
			if before {
				missed = append(missed, p)
			} else {
				log.Info("leaving pod created after the round began", "pod", p.name)
			}
		}
	}
	if len(missed) > 0 {
		slices.SortFunc(missed, func(a, b podRef) int { return strings.Compare(a.name, b.name) }) // as take orders its pods
		log.Info("restarting pods the index had not seen when the round began, or that changed since", "pods", len(missed), "swept", !caught)
		all := append(slices.Clone(r.pods), missed...)
		if err := c.writeIntent(ctx, key, obj, r, all, log); err != nil {
			return false, err
		}
		r.pods = all
		r.state = append(r.state, make([]podState, len(missed))...)
	}
	x.swept = true
	return len(missed) > 0, nil
}
