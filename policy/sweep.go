package policy

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/selector"
)

// A round that begins from the pod index deletes what the index selects at
// once, with uid and resourceVersion preconditions, then sweeps: a LIST
// shows every selected pod, and each one the round did not restart is
// restarted too if its deletion was refused (it changed, but is still
// selected) or it was created before the round's first deletion (the index
// had not seen it yet); a replacement created after it is left alone. Where
// that cannot be told within sweepWait, the pod is restarted: a restart too
// many is recoverable, old configuration is not. docs/design.md, "The pod
// index", has the reasoning.

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
}

// defaultSweepWait bounds how long the sweep waits for the index to show a
// pod: long enough for its watch to reconnect through a few failed tries.
const defaultSweepWait = 10 * time.Second

// indexed is the state of a round that began from the index.
type indexed struct {
	index *podindex.Index
	lists uint64 // the index's lists when the round began
	swept bool

	mu       sync.Mutex
	answered uint64   // the lowest resourceVersion the round's DELETEs answered
	deleted  []string // their pods
}

// noteDeleted notes a DELETE and the resourceVersion it answered (0: none,
// the pod was gone already).
func (x *indexed) noteDeleted(uid string, rv uint64) {
	if rv == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.deleted = append(x.deleted, uid)
	x.answered = min(x.answered, rv)
}

// firstDeletion returns the revision at which the round's first deletion
// took effect: the earliest at which the index saw one of its pods
// terminate, or a DELETE's answer, a revision no earlier (math.MaxUint64
// if nothing was deleted).
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

// fromIndex takes a new round's pods from the pod index, if one can answer
// now; nil when the round must list first: for evictions (only deletions
// answer the revision the sweep needs), and where resourceVersions are not
// numbers (the sweep could not compare them).
func (c *Controller) fromIndex(namespace string, sel *selector.Selector) ([]podRef, *indexed) {
	if c.cfg.Pods == nil || c.cfg.Strategy != StrategyDelete {
		return nil, nil
	}
	if own := c.cfg.OwnPod; own.OwnerUID != "" && own.Namespace == namespace {
		// The index keeps no owners (memory): in the controller's own
		// namespace a round lists first, so its siblings are known.
		return nil, nil
	}
	idx := c.cfg.Pods.Cover(namespace)
	if idx == nil {
		return nil, nil
	}
	selected, lists, ok := idx.Select(namespace, sel.Matches)
	if !ok {
		return nil, nil
	}
	pods := make([]podRef, 0, len(selected))
	for _, p := range selected {
		if _, err := strconv.ParseUint(p.ResourceVersion, 10, 64); err != nil {
			return nil, nil
		}
		if !c.cfg.OwnPod.Spares(namespace, p.Name, p.UID, "") {
			version, _ := strconv.ParseUint(p.ResourceVersion, 10, 64)
			pods = append(pods, podRef{name: p.Name, uid: p.UID, rv: p.ResourceVersion, version: version})
		}
	}
	return pods, &indexed{index: idx, lists: lists, answered: math.MaxUint64}
}

// restartIndexed restarts the pods a round took from the index at once,
// then sweeps.
func (c *Controller) restartIndexed(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	if c.needsIntent(key, r) {
		// I before the first restart: a round cut short leaves it behind.
		if err := c.writeIntent(ctx, key, obj, r, r.pods, log); err != nil {
			return err
		}
	}
	var pending []int
	for i, st := range r.state {
		if st == podPending {
			pending = append(pending, i)
		}
	}
	if err := c.restartAll(ctx, key, obj, r, pending, log); err != nil {
		return err
	}
	if r.indexed.swept {
		return nil
	}
	return c.finishSweep(ctx, key, obj, r, log)
}

// finishSweep lists the selected pods and restarts those the round must
// restart too, naming them in the intent first.
func (c *Controller) finishSweep(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	listed, err := c.listWhole(ctx, obj.namespace, r.sel)
	if err != nil {
		return fmt.Errorf("sweep: list pods: %w", err)
	}
	state := make(map[string]podState, len(r.pods))
	for i, p := range r.pods {
		state[p.uid] = r.state[i]
	}
	// One deadline for the whole sweep: with the index's watch down, every
	// pod it lacks would otherwise cost the full wait in turn.
	deadline := time.Now().Add(c.sweepWait)
	first := r.indexed.firstDeletion(ctx, obj.namespace, deadline)
	var missed []podRef
	for _, l := range listed {
		p := l.podRef
		st, taken := state[p.uid]
		switch {
		case l.terminating || st == podRestarted || st == podGone:
		case taken: // refused: it changed, and is still selected
			missed = append(missed, p)
		case r.indexed.startedBefore(ctx, obj.namespace, p, first, deadline):
			missed = append(missed, p)
		default:
			log.Info("leaving pod created after the round began", "pod", p.name)
		}
	}
	if len(missed) > 0 {
		log.Info("restarting pods the index had not seen, or that changed since", "pods", len(missed))
		all := append(slices.Clone(r.pods), missed...)
		if err := c.writeIntent(ctx, key, obj, r, all, log); err != nil {
			return err
		}
		first := len(r.pods)
		r.pods = all
		r.state = append(r.state, make([]podState, len(missed))...)
		var added []int
		for i := first; i < len(all); i++ {
			added = append(added, i)
		}
		if err := c.restartAll(ctx, key, obj, r, added, log); err != nil {
			return err
		}
	}
	r.indexed.swept = true
	return nil
}

// startedBefore reports whether p was created before the round's first
// deletion, erring on "yes" when that cannot be known.
func (x *indexed) startedBefore(ctx context.Context, namespace string, p podRef, first uint64, deadline time.Time) bool {
	if p.version < first {
		return true // its latest revision is older still
	}
	created, lists, known := x.index.Created(ctx, namespace, p.uid, max(time.Until(deadline), 0))
	return !known || lists != x.lists || created < first
}
