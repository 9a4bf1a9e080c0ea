package policy

import (
	"sync"
	"time"
)

// queue is a work queue of ConfigMap keys with the guarantees the
// controller's exactly-once reasoning relies on: a key is queued at most once
// however many events arrive (bursts coalesce), a key is never handed to two
// workers at once, and a key added while it is being processed is handed out
// again after Done, so the latest state is always looked at.
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []string
	dirty      map[string]bool
	processing map[string]bool
	shutdown   bool
	// paused: workers get nothing (a standby, or between leadership
	// terms); keys still accumulate, once each.
	paused  bool
	onDepth func(int)
}

func newQueue(onDepth func(int)) *queue {
	q := &queue{dirty: map[string]bool{}, processing: map[string]bool{}, onDepth: onDepth}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add queues key unless it is already waiting.
func (q *queue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown || q.dirty[key] {
		return
	}
	q.dirty[key] = true
	if q.processing[key] {
		return // Done re-queues it
	}
	q.items = append(q.items, key)
	q.depthChanged()
	q.cond.Signal()
}

// AddAfter queues key after d, for retries.
func (q *queue) AddAfter(key string, d time.Duration) {
	if d <= 0 {
		q.Add(key)
		return
	}
	time.AfterFunc(d, func() { q.Add(key) })
}

// Get blocks until a key is available or the queue is shut down.
func (q *queue) Get() (key string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for (len(q.items) == 0 || q.paused) && !q.shutdown {
		if q.paused {
			return "", false
		}
		q.cond.Wait()
	}
	if q.shutdown {
		return "", false
	}
	key = q.items[0]
	q.items[0] = ""
	q.items = q.items[1:]
	q.processing[key] = true
	delete(q.dirty, key)
	q.depthChanged()
	return key, true
}

// Done marks key processed; if it was added meanwhile it is queued again.
func (q *queue) Done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if q.dirty[key] && !q.shutdown {
		q.items = append(q.items, key)
		q.depthChanged()
		q.cond.Signal()
	}
}

// pause makes every Get return at once without a key; keys stay queued.
func (q *queue) pause() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.paused = true
	q.cond.Broadcast()
}

// resume lets Get hand out keys again.
func (q *queue) resume() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.paused = false
	q.cond.Broadcast()
}

// ShutDown makes every Get return at once; queued keys are dropped (they are
// derived again from the API's state at the next start).
func (q *queue) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
	q.cond.Broadcast()
}

// idle reports that no key is waiting or being processed.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && len(q.processing) == 0
}

// Len is the number of keys waiting.
func (q *queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (q *queue) depthChanged() {
	if q.onDepth != nil {
		q.onDepth(len(q.items))
	}
}
