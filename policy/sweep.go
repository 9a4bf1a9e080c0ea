package policy

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/selector"
)

// A round with a pod index.
//
// The index is fed by its own watch and may lag the API server by a few
// milliseconds, so the pods it selects when a change arrives may miss one
// created just before the change. The round therefore deletes what the
// index selects at once, then sweeps: a consistent LIST shows every pod
// that existed when it was served, and each one the round did not take is
// either such a straggler (restart it) or a pod created after the round's
// first deletion, with the new data (a replacement: leave it).
//
// The two are told apart by resourceVersion, compared only between pods
// (comparable within one resource since Kubernetes 1.35, KEP-5504). The
// round's first deletion took effect at the earliest revision at which one
// of its pods began to terminate: the index's watch shows it (a DELETE's
// answer can carry a later revision: for a pod that was never scheduled,
// that of its final removal, and a ReplicaSet may have replaced the pod in
// between). A listed pod started before that revision if its own revision in
// the LIST is older, or else if the ADDED event that announced it, its
// creation, is. When the answer cannot be known (the index relisted
// meanwhile, or the pod never reached it), the pod is restarted: one
// restart too many is recoverable, a pod left with old configuration is the
// failure this controller exists to prevent.

// PodIndex is a live view of pods (package podindex).
type PodIndex interface {
	Select(namespace string, matches func(labels map[string]string) bool) (pods []podindex.Pod, lists uint64, ok bool)
	Created(ctx context.Context, namespace, uid string, wait time.Duration) (created, lists uint64, known bool)
	Terminated(ctx context.Context, namespace, uid string, wait time.Duration) (since uint64, known bool)
}

// defaultSweepWait bounds how long the sweep waits for the index to show a pod the
// LIST returned. It arrives within milliseconds unless the watch is down.
const defaultSweepWait = 2 * time.Second

// indexed is the state of a round that began from the index.
type indexed struct {
	index PodIndex
	lists uint64 // the index's lists when the round began
	swept bool

	mu sync.Mutex
	// answered is the lowest resourceVersion among the round's successful
	// DELETE answers (math.MaxUint64 while none), and deleted their pods.
	answered uint64
	deleted  []string
}

func newIndexed(index PodIndex, lists uint64) *indexed {
	return &indexed{index: index, lists: lists, answered: math.MaxUint64}
}

// noteDeleted notes a DELETE that needed nothing more, and the
// resourceVersion answered (0: none, the pod was gone already).
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
// took effect (math.MaxUint64 if nothing was deleted). A pod the index does
// not show terminating by the deadline counts with its DELETE's answer, a
// revision no earlier: the error, if any, is on the side of restarting.
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

// fromIndex begins a round from the pod index, if there is one that can
// answer now. Only deletions carry the resourceVersion the sweep needs, so
// evictions list first as before.
func (c *Controller) fromIndex(namespace string, sel *selector.Selector) ([]podRef, *indexed, bool) {
	if c.cfg.Pods == nil || c.cfg.Strategy != StrategyDelete {
		return nil, nil, false
	}
	idx := c.cfg.Pods(namespace)
	if idx == nil {
		return nil, nil, false
	}
	selected, lists, ok := idx.Select(namespace, sel.Matches)
	if !ok {
		return nil, nil, false
	}
	pods := make([]podRef, 0, len(selected))
	for _, p := range selected {
		if p.Name == c.cfg.OwnPod {
			continue
		}
		pods = append(pods, podRef{name: p.Name, uid: p.UID})
	}
	return pods, newIndexed(idx, lists), true
}

// sweep lists the selected pods and returns those the round must restart
// too: pods it did not take that started before its first deletion.
func (c *Controller) sweep(ctx context.Context, namespace string, sel *selector.Selector, r *round, log *slog.Logger) ([]podRef, error) {
	listed, err := c.listPods(ctx, namespace, sel)
	if err != nil {
		return nil, err
	}
	taken := make(map[string]bool, len(r.pods))
	for _, p := range r.pods {
		taken[p.uid] = true
	}
	// One wait for the whole sweep: if the index's watch is down, every pod
	// it lacks would otherwise cost the full wait in turn.
	deadline := time.Now().Add(c.cfg.sweepWait)
	first := r.indexed.firstDeletion(ctx, namespace, deadline)
	var missed []podRef
	for _, p := range listed {
		if taken[p.uid] {
			continue
		}
		if c.startedBefore(ctx, namespace, p, r.indexed, first, deadline) {
			missed = append(missed, p)
		} else {
			log.Info("leaving pod created after the round began", "pod", p.name)
		}
	}
	return missed, nil
}

// startedBefore reports whether p was created before the round's first
// deletion, erring on "yes" when that cannot be known.
func (c *Controller) startedBefore(ctx context.Context, namespace string, p podRef, x *indexed, first uint64, deadline time.Time) bool {
	if p.version < first {
		return true // its latest revision is older still
	}
	created, lists, known := x.index.Created(ctx, namespace, p.uid, max(time.Until(deadline), 0))
	if !known || lists != x.lists {
		return true
	}
	return created < first
}
