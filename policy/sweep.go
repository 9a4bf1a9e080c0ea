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

// A round with a pod index.
//
// The index is fed by its own watch and may lag the API server by a few
// milliseconds, so the pods it selects when a change arrives may miss one
// created just before the change. The round therefore deletes what the
// index selects at once, each with uid and resourceVersion preconditions
// (a pod relabelled or otherwise changed since the index saw it is refused,
// never deleted on the index's word), then sweeps: a consistent LIST shows
// every selected pod that existed when it was served, and each one the
// round did not restart is either
//   - a pod the index showed when the round began whose deletion was
//     refused: it changed, but the LIST still selects it, so it restarts;
//   - a pod created before the round's first deletion that the index had
//     not seen yet (a straggler: restart it);
//   - or a pod created after it, with the new data (a replacement: leave it).
//
// The last two are told apart by resourceVersion, compared only between
// pods (comparable within one resource, KEP-5504). The round's first
// deletion took effect at the earliest revision at which one of the pods it
// deleted began to terminate, as the index's watch shows it: the
// preconditions make sure it was that deletion, not a third party's,
// that began it. A listed pod started before that revision if its own
// revision in the LIST is older, or else if the ADDED event that announced
// it, its creation, is. When the index cannot tell within sweepWait (it
// relisted meanwhile, or its watch stayed down), the pod is restarted: one
// restart too many is recoverable, a pod left with old configuration is
// the failure this controller exists to prevent.

// PodIndex is a live view of pods (package podindex).
type PodIndex interface {
	Select(namespace string, matches func(labels map[string]string) bool) (pods []podindex.Pod, lists uint64, ok bool)
	Created(ctx context.Context, namespace, uid string, wait time.Duration) (created, lists uint64, known bool)
	Terminated(ctx context.Context, namespace, uid string, wait time.Duration) (since uint64, known bool)
}

// defaultSweepWait bounds how long the sweep waits for the index to show a
// pod the LIST returned. It arrives within milliseconds while the index's
// watch is open; the bound covers a watch that reconnects through a few
// failed attempts (backoff from 0.8 s), so that a reconnect does not cost
// replacements a second restart.
const defaultSweepWait = 10 * time.Second

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

// fromIndex takes a new round's pods from the pod index, if there is one
// that can answer now; nil when the round must list first. Only deletions
// answer with the revision the sweep needs, so evictions list first, and
// so does a server whose resourceVersions are not numbers (the sweep could
// not compare them).
func (c *Controller) fromIndex(namespace string, sel *selector.Selector) ([]podRef, *indexed) {
	if c.cfg.Pods == nil || c.cfg.Strategy != StrategyDelete {
		return nil, nil
	}
	idx := c.cfg.Pods(namespace)
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
		if p.Name != c.cfg.OwnPod {
			pods = append(pods, podRef{name: p.Name, uid: p.UID, rv: p.ResourceVersion})
		}
	}
	return pods, newIndexed(idx, lists)
}

// finishSweep sweeps a round that began from the index and restarts the
// pods the index had missed, naming them in the intent first.
func (c *Controller) finishSweep(ctx context.Context, key string, cm configMap, sel *selector.Selector, r *round, log *slog.Logger) error {
	missed, err := c.sweep(ctx, cm.namespace, sel, r, log)
	if err != nil {
		return fmt.Errorf("sweep: list pods: %w", err)
	}
	if len(missed) > 0 {
		log.Info("restarting pods the index had not seen, or that changed since", "pods", len(missed))
		all := append(slices.Clone(r.pods), missed...)
		if err := c.writeIntent(ctx, key, cm, all); err != nil {
			return err
		}
		r.pods = all
		r.state = append(r.state, make([]podState, len(missed))...)
		if err := c.restartAll(ctx, key, cm.namespace, r, log); err != nil {
			return err
		}
	}
	r.indexed.swept = true
	return nil
}

// sweep lists the selected pods and returns those the round must restart
// too (see the top of this file).
func (c *Controller) sweep(ctx context.Context, namespace string, sel *selector.Selector, r *round, log *slog.Logger) ([]podRef, error) {
	listed, err := c.listPods(ctx, namespace, sel)
	if err != nil {
		return nil, err
	}
	state := make(map[string]podState, len(r.pods))
	for i, p := range r.pods {
		state[p.uid] = r.state[i]
	}
	// One wait for the whole sweep: if the index's watch is down, every pod
	// it lacks would otherwise cost the full wait in turn.
	deadline := time.Now().Add(c.cfg.sweepWait)
	first := r.indexed.firstDeletion(ctx, namespace, deadline)
	var missed []podRef
	for _, p := range listed {
		st, taken := state[p.uid]
		switch {
		case st == podRestarted || st == podGone:
		case taken:
			missed = append(missed, p) // refused: it changed, and is still selected
		case c.startedBefore(ctx, namespace, p, r.indexed, first, deadline):
			missed = append(missed, p)
		default:
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
