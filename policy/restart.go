package policy

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
)

// Restart strategies (RESTART_STRATEGY).
const (
	// StrategyDelete deletes each pod, as the book does; it bypasses
	// PodDisruptionBudgets.
	StrategyDelete = "delete"
	// StrategyEvict asks the Eviction subresource, which honours them.
	StrategyEvict = "evict"
)

// restartAll restarts the round's pending pods, at most
// MaxConcurrentRestarts at a time (0: all at once). A pod that fails stays
// pending, so a retried round restarts only those.
func (c *Controller) restartAll(ctx context.Context, key, namespace string, r *round, log *slog.Logger) error {
	limit := c.cfg.MaxConcurrentRestarts
	if limit <= 0 {
		limit = len(r.pods)
	}
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	for i := range r.pods {
		if r.state[i] != podPending {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		// A paced round stops at the first failure (it is retried later).
		if err := c.mayRestart(ctx, key, r); err != nil {
			fail(err)
		}
		if firstErr.Load() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			state, answer, err := c.restartPod(ctx, namespace, r.pods[i], log)
			if err != nil {
				fail(err)
				return
			}
			r.state[i] = state
			if r.indexed != nil && state == podRestarted && !c.cfg.DryRun {
				r.indexed.noteDeleted(r.pods[i].uid, gjson.GetBytes(answer, "metadata.resourceVersion").Uint())
			}
		})
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		return *err
	}
	return nil
}

// mayRestart checks, before each restart, that this replica may still act
// and that no event has superseded the round (state.go, apply).
func (c *Controller) mayRestart(ctx context.Context, key string, r *round) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !c.mayAct() {
		return errNotLeader
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e == nil || !e.exists || e.round != r {
		return errSuperseded
	}
	return nil
}

// restartPod restarts one pod. A deletion also returns the server's answer,
// the pod, whose resourceVersion is no earlier than the deletion's.
func (c *Controller) restartPod(ctx context.Context, namespace string, pod podRef, log *slog.Logger) (podState, []byte, error) {
	if c.cfg.Strategy == StrategyEvict {
		state, err := c.evictPod(ctx, namespace, pod, log)
		return state, nil, err
	}
	answer, err := c.api.Delete(ctx, apiclient.CorePath(namespace, "pods", pod.name), []byte(c.deleteOptions(pod)))
	state, err := c.outcome(false, namespace, pod, log, err)
	return state, answer, err
}

// deleteOptions guards a restart with the pod's uid (StatefulSet pods keep
// their names) and, for a pod taken from the index, its resourceVersion: a
// pod changed since the index saw it is refused, not deleted.
func (c *Controller) deleteOptions(pod podRef) string {
	pre := `"uid":` + strconv.Quote(pod.uid)
	if pod.rv != "" {
		pre += `,"resourceVersion":` + strconv.Quote(pod.rv)
	}
	dry := ""
	if c.cfg.DryRun {
		dry = `,"dryRun":["All"]`
	}
	return `{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{` + pre + `}` + dry + `}`
}

// outcome counts, logs and classifies the answer to a deletion or an
// eviction. An error means "retry later".
func (c *Controller) outcome(evict bool, namespace string, pod podRef, log *slog.Logger, err error) (podState, error) {
	verb, past, permission, count := "delete", "deleted", "verb delete on pods", c.metrics.PodDeletions.Inc
	if evict {
		verb, past, permission, count = "evict", "evicted", "verb create on pods/eviction", c.metrics.PodEvictions.Inc
	}
	switch {
	case err == nil && c.cfg.DryRun:
		count("dry_run")
		log.Info("would "+verb+" pod (dry run)", "pod", pod.name, "outcome", "dry_run")
		return podRestarted, nil
	case err == nil:
		count(past)
		log.Info(past+" pod", "pod", pod.name, "outcome", past)
		return podRestarted, nil
	case apiclient.IsNotFound(err):
		count("not_found")
		log.Info("pod already gone", "pod", pod.name, "outcome", "not_found")
		return podGone, nil
	case apiclient.IsConflict(err):
		count("conflict")
		log.Info("pod changed or replaced since it was selected; not restarting it", "pod", pod.name, "outcome", "conflict")
		return podRefused, nil
	case apiclient.IsForbidden(err):
		count("error")
		log.Error("cannot "+verb+" pod", "pod", pod.name, "outcome", "forbidden", "err", err)
		return podPending, fmt.Errorf("RBAC: the controller may not %s pods in %s (needs %s): %w", verb, namespace, permission, err)
	default:
		count("error")
		log.Warn("cannot "+verb+" pod", "pod", pod.name, "outcome", "error", "err", err)
		return podPending, fmt.Errorf("%s pod %s/%s: %w", verb, namespace, pod.name, err)
	}
}

// evictPod evicts one pod. While a disruption budget refuses it (429), it
// is retried until EvictTimeout, then reported stuck and left alone: one
// blocked pod must not hold the rollout of the others.
func (c *Controller) evictPod(ctx context.Context, namespace string, pod podRef, log *slog.Logger) (podState, error) {
	body := `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":` + strconv.Quote(pod.name) +
		`,"namespace":` + strconv.Quote(namespace) + `},"deleteOptions":` + c.deleteOptions(pod) + `}`
	path := apiclient.CorePath(namespace, "pods", pod.name) + "/eviction"
	deadline := time.Now().Add(c.cfg.EvictTimeout)
	bo := c.cfg.NewBackOff()
	for {
		_, err := c.api.Create(ctx, path, []byte(body))
		if !apiclient.IsTooManyRequests(err) {
			return c.outcome(true, namespace, pod, log, err)
		}
		delay := max(bo.NextBackOff(), min(apiclient.RetryAfter(err), time.Minute))
		if time.Now().Add(delay).After(deadline) {
			c.metrics.PodEvictions.Inc("stuck")
			log.Error("pod still not evictable; leaving it", "pod", pod.name, "outcome", "stuck", "evict_timeout", c.cfg.EvictTimeout, "err", err)
			if c.cfg.Events != nil {
				c.cfg.Events.Event(events.Object{APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: pod.name, UID: pod.uid}, events.Warning, "EvictionStuck",
					fmt.Sprintf("Not evictable within %s (a disruption budget refused it); left running with the previous configuration.", c.cfg.EvictTimeout))
			}
			return podStuck, nil
		}
		log.Info("eviction not allowed yet (disruption budget); retrying", "pod", pod.name, "retry_in", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return podPending, ctx.Err()
		case <-time.After(delay): // collected once unreferenced (Go 1.23)
		}
	}
}
