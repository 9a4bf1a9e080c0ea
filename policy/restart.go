package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// Restart strategies (RESTART_STRATEGY).
const (
	// StrategyDelete deletes each pod, as the book does; it bypasses
	// PodDisruptionBudgets.
	StrategyDelete = "delete"
	// StrategyEvict asks the Eviction subresource, which honours them.
	StrategyEvict = "evict"
)

// restartAll restarts the round's pods at the indexes which, at most
// MaxConcurrentRestarts requests at a time (0: all at once), each after
// its token of MAX_RESTARTS_PER_SECOND (tokens[n] for which[n], reserved
// by choose or reserveTokens). A pod that fails stays pending, so a
// retried round restarts only those.
func (c *Controller) restartAll(ctx context.Context, key string, obj object, r *round, which []int, tokens []time.Time, log *slog.Logger) error {
	limit := c.cfg.MaxConcurrentRestarts
	if limit <= 0 {
		limit = len(which)
	}
	paced := limit < len(which)
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	for n, i := range which {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			fail(ctx.Err())
		}
		// A paced round stops at the first failure (it is retried later);
		// the restarts it chose and never sent are not in flight. Restarts
		// sent all at once all go, whatever the first to answer says: which
		// ones went must not hang on how fast a refusal came back.
		if firstErr.Load() != nil && (paced || ctx.Err() != nil) {
			b := c.budgetOf(obj.namespace)
			for _, j := range which[n:] {
				b.release(r.pods[j].uid)
			}
			if c.restartTokens != nil {
				c.restartTokens.giveBack(len(which) - n)
			}
			break
		}
		token := tokens[n]
		wg.Go(func() {
			defer func() { <-sem }()
			state, err := c.restartPod(ctx, key, obj, r, i, token, log)
			if err != nil {
				fail(err)
				return
			}
			r.state[i] = state
		})
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		return *err
	}
	return nil
}

// soonTokens reserves, in order, a token of MAX_RESTARTS_PER_SECOND for
// each of n restarts of round r that is due within wavePoll (one token's
// interval, where longer), and stops at the first that is not (zero times:
// no cap). Where it stops short, r.tokenAt is when the next may be
// reserved: the restarts beyond stay pending for a later wave (nextLook),
// and the worker is given back meanwhile. A wave that waited for every
// token it chose held its worker for seconds (100 %, more pods than the
// burst): with one worker, another object's round waited that long to
// begin, and a change that superseded the round was acted on only once
// its last token came (simulator seeds 2109, 911).
func (c *Controller) soonTokens(r *round, n int) []time.Time {
	if c.restartTokens == nil {
		return make([]time.Time, n)
	}
	tokens := make([]time.Time, 0, n)
	for range n {
		due, ok := c.restartTokens.reserveSoon(c.wavePoll)
		if !ok {
			r.tokenAt = due
			break
		}
		tokens = append(tokens, due)
	}
	return tokens
}

// reserveTokens reserves a token of MAX_RESTARTS_PER_SECOND for each of n
// restarts, in order (zero times: no cap).
func (c *Controller) reserveTokens(n int) []time.Time {
	tokens := make([]time.Time, n)
	if c.restartTokens != nil {
		for i := range tokens {
			tokens[i] = c.restartTokens.reserve()
		}
	}
	return tokens
}

// maxConflicts bounds the re-reads of one pod in one attempt: kubelet
// status writes change a running pod every few seconds, and each makes a
// precondition fail.
const maxConflicts = 5

// restartPod restarts r.pods[i] with the preconditions of the view that
// last selected it. Each try, first and retried, asks current right before
// its request, after its wait for a token of the rate (if any): the first
// try's is token, reserved before restartAll; a retry reserves its own. A
// failed precondition re-reads the pod: retried with its new
// resourceVersion only if it is still selected, the same pod and not
// terminating (the same uid: created before the round, it may run old
// data); otherwise left. In a round in waves, a pod that may serve again
// when re-read waits for the next wave, which counts it again. An eviction
// a disruption budget refuses stays pending for the next wave: the round
// halts if that lasts ProgressDeadline (waves.go). An answer that proves
// the pod is still there takes the restart out of flight; one that does
// not tell (a 5xx, a timeout, a cut connection) leaves it to settleUnsure
// (budget.go); one that finds the pod gone (404) leaves it in flight too:
// an earlier try whose answer did not tell may have deleted it, and a view
// behind would count it available.
func (c *Controller) restartPod(ctx context.Context, key string, obj object, r *round, i int, token time.Time, log *slog.Logger) (state podState, err error) {
	pod := &r.pods[i]
	evict := c.cfg.Strategy == StrategyEvict
	verb, past, resource, permission, count := "delete", "deleted", "pods", "delete on pods", c.countRestart
	if evict {
		verb, past, resource, permission = "evict", "evicted", "pods/eviction", "create on pods/eviction"
	}
	log = log.With("pod", pod.name)
	maybeDeleted := false // or gone
	defer func() {
		if !maybeDeleted {
			c.budgetOf(obj.namespace).release(pod.uid)
		}
	}()
	for conflicts := 0; ; {
		if c.restartTokens != nil {
			// MAX_RESTARTS_PER_SECOND; the restart stays in flight meanwhile.
			if conflicts > 0 {
				token = c.restartTokens.reserve()
			}
			if err := c.restartTokens.waitFor(ctx, token); err != nil {
				return podPending, err
			}
		}
		// After the token's wait, which may last seconds: the round may
		// have ended meanwhile.
		if err := c.current(ctx, key, obj, r); err != nil {
			return podPending, err
		}
		r.sent.Store(true)
		sentAt := c.moment.Add(1) // before it is sent: see seenAfter
		evicting := evict || c.cfg.DryRun
		b := c.budgetOf(obj.namespace)
		if !c.cfg.DryRun {
			b.lastRestart.Store(time.Now().UnixNano()) // its replacement is due (replacementsDue)
		}
		if !evicting {
			b.noteSent(sentAt)
		}
		answer, err := c.sendRestart(ctx, obj.namespace, *pod)
		if !evicting {
			var rv uint64
			if classify(err) == answerOK {
				rv = gjson.GetBytes(answer, "metadata.resourceVersion").Uint()
			}
			c.budgetOf(obj.namespace).noteAnswer(sentAt, rv)
		}
		switch classify(err) {
		case answerOK:
			maybeDeleted = !c.cfg.DryRun
			if c.cfg.DryRun {
				count("dry_run")
				log.Info("would "+verb+" pod (dry run)", "outcome", "dry_run")
				return podRestarted, nil
			}
			count(past)
			log.Info(past+" pod", "outcome", past)
			if !r.seen.IsZero() && r.firstRestart.CompareAndSwap(false, true) {
				c.metrics.ChangeToFirstRestart.Observe(time.Since(r.seen).Seconds())
			}
			// A DELETE answers the pod at the revision of its deletion or
			// later; an eviction answers a Status: 0.
			if r.indexed != nil {
				r.indexed.noteDeleted(pod.uid, gjson.GetBytes(answer, "metadata.resourceVersion").Uint())
			}
			return podRestarted, nil
		case answerNotFound:
			maybeDeleted = true
			count("not_found")
			log.Info("pod already gone", "outcome", "not_found")
			return podGone, nil
		case answerBlocked:
			count("blocked")
			log.Info("eviction not allowed yet (disruption budget); trying again in the next wave", "outcome", "blocked", "err", err)
			r.blocked.Store(&pod.name)
			return podPending, nil
		case answerBusy:
			count("error")
			log.Warn("the API server is busy (priority and fairness); trying again after its hint", "outcome", "error", "retry_after", apiclient.RetryAfter(err), "err", err)
			return podPending, fmt.Errorf("%s pod %s/%s: throttled by the API server: %w", verb, obj.namespace, pod.name, err)
		case answerConflict:
			count("conflict")
			if r.indexedTermination(ctx, obj.namespace, pod.uid) {
				// Our DELETE took effect though its answer was lost, or
				// someone else's did before it (a view behind): which,
				// nothing tells, so its termination bounds nothing
				// (sweep.go).
				log.Info("pod terminating since our deletion or another", "outcome", "deleted")
				return podRestarted, nil
			}
			if conflicts++; conflicts > maxConflicts {
				return podPending, fmt.Errorf("%s pod %s/%s: it changed %d times in a row: %w", verb, obj.namespace, pod.name, conflicts, err)
			}
			if st, again, err := c.judgeAgain(ctx, obj.namespace, r, pod, log); !again {
				maybeDeleted = st == podGone
				return st, err
			}
		case answerRefused:
			count("error")
			return podPending, c.refused(obj, verb, resource, "verb "+permission, err)
		default:
			maybeDeleted = true // the request may have been carried out
			c.budgetOf(obj.namespace).noteUnsure(pod.uid, c.moment.Add(1))
			count("error")
			log.Warn("cannot "+verb+" pod", "outcome", "error", "err", err)
			return podPending, fmt.Errorf("%s pod %s/%s: %w", verb, obj.namespace, pod.name, err)
		}
	}
}

// indexedTermination: the round began from the index, which showed the pod
// running then and shows it terminating now.
func (r *round) indexedTermination(ctx context.Context, namespace, uid string) bool {
	if r.indexed == nil {
		return false
	}
	_, ok := r.indexed.index.Terminated(ctx, namespace, uid, 0)
	return ok
}

// judgeAgain re-reads a pod whose precondition failed: again is true, with
// pod.rv refreshed, if the restart is to be tried again; else st is the
// pod's state.
func (c *Controller) judgeAgain(ctx context.Context, namespace string, r *round, pod *podRef, log *slog.Logger) (st podState, again bool, err error) {
	now, found, err := c.podNow(ctx, namespace, *pod)
	switch {
	case err != nil:
		return podPending, false, fmt.Errorf("re-read pod %s/%s: %w", namespace, pod.name, err)
	case !found:
		log.Info("pod gone since it was selected", "outcome", "not_found")
		return podGone, false, nil
	case now.uid != pod.uid:
		// Another pod under the name (a StatefulSet's replacement),
		// created after the round began: it runs the new data.
		log.Info("pod replaced since it was selected; not restarting the replacement", "outcome", "conflict")
		return podReplaced, false, nil
	case now.terminating:
		log.Info("pod terminating since it was selected", "outcome", "not_found")
		return podGone, false, nil
	case !r.sel.selects(&now):
		c.countRestart("left")
		log.Info("pod no longer selected since it was selected; leaving it", "outcome", "left")
		return podLeft, false, nil
	case (r.indexed == nil || !c.cfg.MaxUnavailable.all()) && needsBudget(&now, c.cfg.MinReadySeconds, time.Now()):
		log.Info("pod changed and may serve again; the next wave counts it again", "outcome", "conflict")
		return podPending, false, nil
	}
	pod.rv, pod.version = now.rv, now.version
	return podPending, true, nil
}

// sendRestart sends one DELETE or eviction of pod. A deletion answers the
// pod, whose resourceVersion is no earlier than the deletion's.
func (c *Controller) sendRestart(ctx context.Context, namespace string, pod podRef) ([]byte, error) {
	path := apiclient.CorePath(namespace, "pods", pod.name)
	opts := c.deleteOptions(pod)
	if c.cfg.Strategy == StrategyEvict {
		body, err := json.Marshal(eviction{APIVersion: "policy/v1", Kind: "Eviction", Metadata: objectMeta{Name: pod.name, Namespace: namespace}, DeleteOptions: opts})
		if err != nil {
			return nil, fmt.Errorf("build eviction: %w", err)
		}
		return c.api.Create(ctx, path+"/eviction", body)
	}
	body, err := json.Marshal(opts)
	if err != nil {
		return nil, fmt.Errorf("build delete options: %w", err)
	}
	return c.api.Delete(ctx, path, body)
}

// deleteOptions guards a restart with the pod's uid (StatefulSet pods keep
// their names) and resourceVersion as last seen: a pod changed since is
// refused, not deleted.
func (c *Controller) deleteOptions(pod podRef) deleteOptions {
	opts := deleteOptions{Kind: "DeleteOptions", APIVersion: "v1", Preconditions: preconditions{UID: pod.uid, ResourceVersion: pod.rv}}
	if c.cfg.DryRun {
		opts.DryRun = []string{"All"}
	}
	return opts
}

// deleteOptions, eviction: the request bodies of a restart (meta/v1
// DeleteOptions, policy/v1 Eviction), as much of them as we send.
type (
	deleteOptions struct {
		Kind          string        `json:"kind"`
		APIVersion    string        `json:"apiVersion"`
		Preconditions preconditions `json:"preconditions"`
		DryRun        []string      `json:"dryRun,omitempty"`
	}
	preconditions struct {
		UID             string `json:"uid"`
		ResourceVersion string `json:"resourceVersion,omitempty"`
	}
	eviction struct {
		APIVersion    string        `json:"apiVersion"`
		Kind          string        `json:"kind"`
		Metadata      objectMeta    `json:"metadata"`
		DeleteOptions deleteOptions `json:"deleteOptions"`
	}
	objectMeta struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
)

// countRestart counts an outcome of a restart in the strategy's metric.
func (c *Controller) countRestart(result string) {
	if c.cfg.Strategy == StrategyEvict {
		c.metrics.PodEvictions.Inc(result)
	} else {
		c.metrics.PodDeletions.Inc(result)
	}
}
