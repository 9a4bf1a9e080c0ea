package policy

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// queue is a work queue of ConfigMap keys: a key waits at most once however
// many events arrive, is never handed to two workers at once, and, added
// while a worker has it, is handed out again after Done, so that the latest
// state is always looked at. It holds keys only while a replica leads:
// paused (a standby, or stopped), it drops what it holds and what is added,
// and the next leader queues every ConfigMap that needs action (Lead); so a
// standby's queue stays empty however many ConfigMaps come and go, and a
// leader's holds at most one key per known ConfigMap, timers included.
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []string
	dirty      map[string]bool // waiting, or added while processing
	processing map[string]bool
	timers     map[string]*time.Timer // one pending retry or look per key
	due        map[string]time.Time   // when each timer's key is due
	retrying   map[string]bool        // the keys whose timer is a retry (the depth counts them)
	paused     bool
	onDepth    func(int)
}

func newQueue(onDepth func(int)) *queue {
	q := &queue{dirty: map[string]bool{}, processing: map[string]bool{}, timers: map[string]*time.Timer{}, due: map[string]time.Time{}, retrying: map[string]bool{}, paused: true, onDepth: onDepth}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add queues key unless it is already waiting or the queue is paused.
func (q *queue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.add(key)
}

// AddAll queues keys in their sorted order: the keys one event wakes
// (often ranged from a map) are handed out, and send their requests, in an
// order that does not change from run to run.
func (q *queue) AddAll(keys []string) {
	slices.Sort(keys)
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, key := range keys {
		q.add(key)
	}
}

// add is Add with q.mu held.
func (q *queue) add(key string) {
	if q.dirty[key] || q.paused {
		return
	}
	q.dirty[key] = true
	if !q.processing[key] {
		q.push(key)
	}
}

// AddAfter queues key after d; retry tells a retry of a failure (counted
// in the depth) from a look due later (a round waiting in waves, a last
// look). A later call for the same key replaces an earlier one.
func (q *queue) AddAfter(key string, d time.Duration, retry bool) {
	if d <= 0 {
		q.Add(key)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.paused {
		return
	}
	q.stopTimer(key)
	var t *time.Timer
	q.due[key] = time.Now().Add(d)
	t = time.AfterFunc(d, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.addDue(key, t)
	})
	q.timers[key] = t
	if retry {
		q.retrying[key] = true
	}
	q.report()
}

// addDue queues, as key's timer t fires, every key due by now, earliest
// first, then by name: timers due at one instant fire each in a goroutine
// of its own, and the order those happen to run in must not decide which
// key a worker takes first. A timer replaced or stopped meanwhile, or
// whose key another's firing queued, queues nothing. q.mu must be held.
func (q *queue) addDue(key string, t *time.Timer) {
	if q.timers[key] != t {
		return
	}
	now := time.Now()
	var due []string
	for k, at := range q.due {
		if k == key || !at.After(now) {
			due = append(due, k)
		}
	}
	slices.SortFunc(due, func(a, b string) int { return cmp.Or(q.due[a].Compare(q.due[b]), strings.Compare(a, b)) })
	for _, k := range due {
		q.stopTimer(k)
	}
	q.report()
	for _, k := range due {
		q.add(k)
	}
}

// Forget drops key's pending retry or look: it succeeded, and needs none.
func (q *queue) Forget(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopTimer(key)
	q.report()
}

// stopTimer stops key's pending retry or look. q.mu must be held.
func (q *queue) stopTimer(key string) {
	if t, ok := q.timers[key]; ok {
		t.Stop()
		q.dropTimer(key)
	}
}

// dropTimer forgets key's timer. q.mu must be held.
func (q *queue) dropTimer(key string) {
	delete(q.timers, key)
	delete(q.due, key)
	delete(q.retrying, key)
}

// Get blocks until a key is available; false when paused.
func (q *queue) Get() (key string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.paused {
		q.cond.Wait()
	}
	if q.paused {
		return "", false
	}
	key = q.items[0]
	q.items[0] = ""
	q.items = q.items[1:]
	q.processing[key] = true
	delete(q.dirty, key)
	q.report()
	return key, true
}

// Done marks key processed and queues it again if it was added meanwhile.
func (q *queue) Done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if q.dirty[key] && !q.paused {
		q.push(key)
	}
}

func (q *queue) push(key string) {
	q.items = append(q.items, key)
	q.report()
	q.cond.Signal()
}

// report tells the depth: keys waiting and retries pending (not looks due
// later: a round waiting for Ready pods is not behind). q.mu must be held.
func (q *queue) report() { q.onDepth(len(q.items) + len(q.retrying)) }

// setPaused pauses (every Get returns at once, and what waits is dropped)
// or resumes.
func (q *queue) setPaused(paused bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.paused = paused
	if paused {
		for key := range q.timers {
			q.stopTimer(key)
		}
		clear(q.items)
		q.items = q.items[:0]
		clear(q.dirty)
		q.report()
	}
	q.cond.Broadcast()
}

// active reports that the queue takes keys: a term of Lead runs.
func (q *queue) active() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.paused
}

// busy returns how many keys are waiting or being processed: a key added
// now is taken at once only while they are fewer than the workers.
func (q *queue) busy() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) + len(q.processing)
}

// idle reports that no key is waiting or being processed.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && len(q.processing) == 0
}
