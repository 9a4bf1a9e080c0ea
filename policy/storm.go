package policy

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/events"
)

// The storm guard. An object whose data changes more than StormChanges
// times within StormWindow (a Certificate re-issued in a loop, two
// operators fighting over one ConfigMap) would have its pods restarted as
// fast as they become Ready, for as long as it flaps. In a storm it gets at
// most one round per StormWindow, for the data of the moment that round
// begins; while the storm lasts, a round begun in it is not superseded by
// the next data change (its wave in flight and the rest of its pods
// finish, so that they reach the data of each window), and it records the
// data it restarted for. The replacements it caused after the data changed
// may run any data seen meanwhile, even where the data ends on the round's
// own (R = D): such a round (entry.sawOther) writes mixedIntent before its
// next restart (entry.mixedDue), leaves it beside R, and the next window's
// round restarts every pod. It holds on to its data
// only while it can bring the pods there: once it halts (its replacements
// may crash on that data, and the fix be in the next), or once the data
// has been quiet for StormWindow and the storm ends, other data supersedes
// it as any round (endStormHold), and a round brings every pod to the last
// data. The observers note when data changed (entry.changes); the worker
// of the key judges the storm (judgeStorm), so a standby reports none.
//
// Apart from that, restartTokens caps the restart requests of every round
// together (MAX_RESTARTS_PER_SECOND).

// noteChange notes a data change seen at now, keeping the latest
// StormChanges+1: more than StormChanges within StormWindow is a storm.
// c.mu must be held.
func (c *Controller) noteChange(e *entry, now time.Time) {
	if c.cfg.StormChanges <= 0 {
		return
	}
	if len(e.changes) > c.cfg.StormChanges {
		e.changes = append(e.changes[:0], e.changes[1:]...)
	}
	e.changes = append(e.changes, now)
}

// stormNews is what judgeStorm found changed, said outside c.mu.
type stormNews uint8

const (
	stormSame stormNews = iota
	stormBegan
	stormEnded
)

// judgeStorm updates whether the entry of key is in a storm, and keeps
// the gauge. It returns the news and, while the storm lasts, how long until
// it may end (the worker looks again then). c.mu must be held.
func (c *Controller) judgeStorm(key string, e *entry, now time.Time) (stormNews, time.Duration) {
	if c.cfg.StormChanges <= 0 || len(e.changes) == 0 {
		return stormSame, 0
	}
	window := c.cfg.StormWindow
	last := e.changes[len(e.changes)-1]
	news := stormSame
	switch {
	case !e.storm && len(e.changes) > c.cfg.StormChanges && last.Sub(e.changes[0]) < window && now.Sub(last) < window:
		// The changes' own times: a worker that looks late still sees the storm.
		e.storm, e.stormRound = true, time.Time{}
		c.storms[key] = true
		news = stormBegan
	case e.storm && (now.Sub(last) >= window || quietBetween(e.changes, window)):
		e.storm = false
		delete(c.storms, key)
		news = stormEnded
		e.endStormHold()
	}
	c.metrics.ObjectsInStorm.Set(float64(len(c.storms)))
	if !e.storm {
		return news, 0
	}
	return news, last.Add(window).Sub(now)
}

// quietBetween: two changes in a row are window apart or more, so the data
// was quiet for the window before the later one, though no worker looked
// then (none does while the object is deleted). A storm begins only over
// changes closer than that: one in progress began before, and is over.
func quietBetween(changes []time.Time, window time.Duration) bool {
	for i := 1; i < len(changes); i++ {
		if changes[i].Sub(changes[i-1]) >= window {
			return true
		}
	}
	return false
}

// sayStorm logs and records an Event for news of obj's storm.
func (c *Controller) sayStorm(obj object, news stormNews) {
	log := c.log.With("namespace", obj.namespace, obj.kind.logKey(), obj.name)
	switch news {
	case stormBegan:
		log.Warn("data change storm: restarting pods at most once per window", "changes", c.cfg.StormChanges, "window", c.cfg.StormWindow)
		c.event(obj, events.Warning, "ChangeStorm", fmt.Sprintf("The data changed more than %d times within %s: its pods are restarted at most once per %s, for the data of that moment, until the data has been quiet for %s. Check what keeps changing it.",
			c.cfg.StormChanges, c.cfg.StormWindow, c.cfg.StormWindow, c.cfg.StormWindow))
	case stormEnded:
		log.Info("data change storm ended", "window", c.cfg.StormWindow)
		c.event(obj, events.Normal, "ChangeStormEnded", fmt.Sprintf("The data has been quiet for %s: the storm is over, and its pods are brought to the last data.", c.cfg.StormWindow))
	}
}

// stormGate returns how long a new round of the entry must wait: in a
// storm, until StormWindow after the last round begun in it. A round that
// may begin now is marked begun. c.mu must be held.
func (c *Controller) stormGate(e *entry, now time.Time) time.Duration {
	if !e.storm {
		return 0
	}
	if !e.stormRound.IsZero() {
		if wait := e.stormRound.Add(c.cfg.StormWindow).Sub(now); wait > 0 {
			return wait
		}
	}
	e.stormRound = now
	return 0
}

// endStormHold: the round of e, if begun in a storm, no longer goes on for
// its own data (its storm ended, or it halted). Other data, shown already,
// ends it now, as an event showing it would end any round; it reports
// whether it did. c.mu must be held, by the key's worker.
func (e *entry) endStormHold() bool {
	r := e.round
	if r == nil || !r.storm {
		return false
	}
	r.storm = false
	if r.hash == e.obj.hash {
		return false
	}
	e.ended = true
	return true
}

// tokenBucket allows rate events a second on average and burst at once:
// MAX_RESTARTS_PER_SECOND over every round's restart requests. (The
// product depends on the standard library, gjson and backoff only: a few
// lines here instead of golang.org/x/time/rate.)
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64 // tokens a second
	burst  float64
	tokens float64
	last   time.Time
}

func newTokenBucket(rate, burst int) *tokenBucket {
	return &tokenBucket{rate: float64(rate), burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// reserve takes the next token and returns when it is due: now, or, the
// bucket empty, when the rate has refilled it. Tokens go in the order they
// are reserved, not to whichever waiter runs first when one comes back
// (restartAll reserves its restarts' in the order of its pods).
func (b *tokenBucket) reserve() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.take(b.refill())
}

// refill adds the tokens the rate has brought since the last call and
// returns now. b.mu must be held.
func (b *tokenBucket) refill() time.Time {
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	return now
}

// take takes the next token and returns when it is due (now, or when the
// rate has refilled the bucket). b.mu must be held, right after refill.
func (b *tokenBucket) take(now time.Time) time.Time {
	b.tokens--
	if b.tokens >= 0 {
		return now
	}
	return now.Add(untilToken(b.tokens+1, b.rate))
}

// reserveNow takes a token only if one is due now, and reports whether it
// did (tokenFor: a restart that needs the budget goes on the count that
// chose it, not seconds later).
func (b *tokenBucket) reserveNow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refill(); b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// reserveSoon reserves the next token, as reserve, where it is due within
// the duration within (one token's interval at least); else it reserves none and
// returns when one may be (soonTokens).
func (b *tokenBucket) reserveSoon(within time.Duration) (due time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.refill()
	within = max(within, untilToken(0, b.rate))
	if b.tokens < 1 {
		if wait := untilToken(b.tokens, b.rate); wait > within {
			return now.Add(wait - within), false
		}
	}
	return b.take(now), true
}

// giveBack returns n reserved tokens that were not used.
func (b *tokenBucket) giveBack(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+float64(n))
}

// waitFor waits until due, a reserved token's time, or gives the token
// back when ctx is done first. The caller holds its restart's in-flight
// reservation, never a lock.
func (b *tokenBucket) waitFor(ctx context.Context, due time.Time) error {
	d := time.Until(due)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		b.giveBack(1)
		return ctx.Err()
	}
}

// untilToken is how long a bucket holding tokens (< 1) takes to hold one,
// rounded up: a shortfall of a hair rounded down to no wait would spin
// without letting time pass (a clock that moves only while everything
// waits, as the simulator's, never leaves the loop).
func untilToken(tokens, rate float64) time.Duration {
	return time.Duration(math.Ceil((1 - tokens) / rate * float64(time.Second)))
}
