package policy

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/metrics"
)

// Restart strategies (RESTART_STRATEGY).
const (
	// StrategyDelete deletes each pod: the pattern as the book has it. It
	// bypasses PodDisruptionBudgets.
	StrategyDelete = "delete"
	// StrategyEvict asks the Eviction subresource, which honours
	// PodDisruptionBudgets: with a PDB, a rollout of new configuration never
	// takes more pods down than the budget allows.
	StrategyEvict = "evict"
)

// restartAll restarts the round's pods that are still pending, at most
// MaxConcurrentRestarts at a time (all at once when it is 0). A pod that
// fails stays pending, so a retried round restarts only those. Before each
// restart it checks that this replica may act and that the round is still
// the current one.
func (c *Controller) restartAll(ctx context.Context, key, namespace string, r *round, log *slog.Logger) error {
	limit := c.cfg.MaxConcurrentRestarts
	if limit <= 0 {
		limit = len(r.pods)
	}
	sem := make(chan struct{}, max(limit, 1))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstErr != nil
	}
	for i := range r.pods {
		if r.state[i] != podPending {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			fail(ctx.Err())
		}
		if ctx.Err() != nil {
			break
		}
		stop := errNotLeader
		if c.mayAct() {
			stop = nil
			if !c.current(key, r) {
				stop = errSuperseded
			}
		}
		if failed() || stop != nil {
			// A paced round stops at the first failure (it is retried
			// later); a replica that may no longer act, or a round that
			// a newer change replaced, stops at once.
			<-sem
			fail(stop)
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
	return firstErr
}

// restartPod restarts one pod. A deletion also returns the server's answer:
// the pod, whose resourceVersion is no earlier than the deletion's.
func (c *Controller) restartPod(ctx context.Context, namespace string, pod podRef, log *slog.Logger) (podState, []byte, error) {
	if c.cfg.Strategy == StrategyEvict {
		state, err := c.evictPod(ctx, namespace, pod, log)
		return state, nil, err
	}
	answer, err := c.api.Delete(ctx, apiclient.CorePath(namespace, "pods", pod.name), []byte(c.deleteOptions(pod)))
	state, err := c.outcome(deleteVerb, namespace, pod, log, err)
	return state, answer, err
}

// deleteOptions guards a deletion with the pod's uid, so a same-named
// replacement (StatefulSet pods keep their names) is never hit, and for a
// pod taken from the index with its resourceVersion, so a pod relabelled
// (or changed otherwise) since the index saw it is refused, not deleted. In
// dry-run mode the server validates the request and changes nothing.
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

// restartVerb is one way of restarting a pod, for the shared handling of
// the server's answer.
type restartVerb struct {
	verb, past string // "delete", "deleted"
	permission string // what RBAC must grant
	counter    func(c *Controller) *metrics.CounterVec
}

var (
	deleteVerb = restartVerb{"delete", "deleted", "verb delete on pods", func(c *Controller) *metrics.CounterVec { return c.metrics.PodDeletions }}
	evictVerb  = restartVerb{"evict", "evicted", "verb create on pods/eviction", func(c *Controller) *metrics.CounterVec { return c.metrics.PodEvictions }}
)

// outcome counts, logs and classifies the answer to a restart request. An
// error means "retry later"; otherwise the state says what became of it.
func (c *Controller) outcome(v restartVerb, namespace string, pod podRef, log *slog.Logger, err error) (podState, error) {
	count := v.counter(c).Inc
	switch {
	case err == nil && c.cfg.DryRun:
		count("dry_run")
		log.Info("would "+v.verb+" pod (dry run)", "pod", pod.name, "outcome", "dry_run")
		return podRestarted, nil
	case err == nil:
		count(v.past)
		log.Info(v.past+" pod", "pod", pod.name, "outcome", v.past)
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
		log.Error("cannot "+v.verb+" pod", "pod", pod.name, "outcome", "forbidden", "err", err)
		return podPending, fmt.Errorf("RBAC: the controller may not %s pods in %s (needs %s): %w", v.verb, namespace, v.permission, err)
	default:
		count("error")
		log.Warn("cannot "+v.verb+" pod", "pod", pod.name, "outcome", "error", "err", err)
		return podPending, fmt.Errorf("%s pod %s/%s: %w", v.verb, namespace, pod.name, err)
	}
}

// evictPod evicts one pod. 429 means a PodDisruptionBudget does not allow
// it now: it is retried with backoff until EvictTimeout, after which the
// pod is reported stuck and left alone, so one blocked pod does not hold
// the configuration rollout of the others forever.
func (c *Controller) evictPod(ctx context.Context, namespace string, pod podRef, log *slog.Logger) (podState, error) {
	body := `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":` + strconv.Quote(pod.name) +
		`,"namespace":` + strconv.Quote(namespace) + `},"deleteOptions":` + c.deleteOptions(pod) + `}`
	path := apiclient.CorePath(namespace, "pods", pod.name) + "/eviction"
	deadline := time.Now().Add(c.cfg.EvictTimeout)
	bo := c.cfg.NewBackOff()
	for {
		_, err := c.api.Create(ctx, path, []byte(body))
		if !apiclient.IsTooManyRequests(err) {
			return c.outcome(evictVerb, namespace, pod, log, err)
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
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return podPending, ctx.Err()
		case <-t.C:
		}
	}
}
