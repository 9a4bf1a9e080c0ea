package policy

// The acting half: workers take keys from the queue (queue.go) and take each
// object one step along the state model (reconcile, round.go). What they
// know of the objects comes from the observing half (observe.go), read
// under c.mu.

import (
	"context"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// syncWait bounds the wait for the initial lists: one that keeps failing
// (RBAC, say) must not hold rounds elsewhere.
const syncWait = 10 * time.Second

// Run works the queue until ctx is done, then gives rounds in flight
// ShutdownGrace to finish.
func (c *Controller) Run(ctx context.Context) {
	c.Lead(ctx, func() time.Duration { return c.cfg.ShutdownGrace })
}

// Lead works the queue until ctx is done, then stops taking work and gives
// rounds in flight grace() to finish before their requests are cancelled.
// It may be called again, one leadership term after another; meanwhile
// events still update the state, and each term begins by queueing every
// ConfigMap that needs action.
func (c *Controller) Lead(ctx context.Context, grace func() time.Duration) {
	actCtx, cancelAct := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelAct()
	// The queue takes keys and every key that needs action is queued
	// under one hold of c.mu: whoever sees the term begun (under c.mu)
	// sees its keys queued.
	c.mu.Lock()
	c.acting = actCtx
	c.queue.setPaused(false)
	c.enqueueAll()
	c.mu.Unlock()
	c.releaseAfterSync()
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() { c.work(actCtx) })
	}
	<-ctx.Done()
	c.queue.setPaused(true)
	stopAct := time.AfterFunc(grace(), cancelAct)
	defer stopAct.Stop()
	wg.Wait()
	c.endTerm()
}

// endTerm lets every round go once the term's workers have returned: a
// standby runs none and reports none halted, and the next term, here or
// on another replica, resumes each from its intent on the object.
func (c *Controller) endTerm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.acting = nil
	for _, e := range c.entries {
		// Another term, here or elsewhere, may restart under an intent
		// meanwhile: the next one to resume it owes its pods again.
		e.round, e.ended, e.ourIntent, e.tookIntent = nil, false, "", ""
		e.storm, e.stormRound = false, time.Time{} // the next term judges it anew
	}
	clear(c.storms)
	clear(c.begun)
	c.metrics.ObjectsInStorm.Set(0)
	c.pruneHalted()
	c.owners.forget(c.inProgress)
}

// inProgress: round r is its object's current round. c.mu must be held.
func (c *Controller) inProgress(r *round) bool {
	e := c.entries[r.key]
	return e != nil && e.round == r
}

// enqueueAll queues every known ConfigMap that needs action, for a new
// leader: it may have stood by while changes were made (the queue takes
// nothing while no term runs). c.mu must be held.
func (c *Controller) enqueueAll() {
	var keys []string
	for key, e := range c.entries {
		if e.exists && e.decide(c.recordsOnServer()) != stepNothing {
			keys = append(keys, key)
		}
	}
	c.queue.AddAll(keys) // lock order: c.mu, then the queue's
}

func (c *Controller) work(ctx context.Context) {
	if c.unsynced.Load() > 0 {
		select {
		case <-c.synced:
		case <-time.After(syncWait):
		case <-ctx.Done():
		}
	}
	for {
		key, ok := c.queue.Get()
		if !ok {
			return
		}
		result, after, err := c.reconcile(ctx, key)
		c.metrics.Reconciles.Inc(result)
		c.mu.Lock()
		c.pruneHalted()
		c.owners.forget(c.inProgress)
		if err != nil {
			b, ok := c.retries[key]
			if !ok {
				b = c.cfg.NewBackOff()
				c.retries[key] = b
			}
			delay := apiclient.RetryDelay(b, err)
			c.mu.Unlock()
			c.failures.Failed(key, "round failed; will retry", err, "key", key, "retry_in", delay.Round(time.Millisecond))
			c.queue.AddAfter(key, delay, true)
		} else {
			delete(c.retries, key)
			c.mu.Unlock()
			if result == resultGone {
				c.failures.Forget(key)
			} else {
				c.failures.Recovered(key, "round recovered", "key", key)
			}
			if after > 0 {
				c.queue.AddAfter(key, after, false) // replaces a retry due from an earlier failure
			} else {
				c.queue.Forget(key) // a retry due from an earlier failure would only look again
			}
		}
		c.queue.Done(key)
		c.releaseAfterSync()
	}
}
