package policy

import (
	"sync"
	"time"
)

// queue is a work queue of ConfigMap keys: a key waits at most once however
// many events arrive, is never handed to two workers at once, and, added
// while a worker has it, is handed out again after Done, so that the latest
// state is always looked at.
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []string
	dirty      map[string]bool // waiting, or added while processing
	processing map[string]bool
	paused     bool // Get hands out nothing (a standby, or stopped); keys still wait
	onDepth    func(int)
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
	if q.dirty[key] {
		return
	}
	q.dirty[key] = true
	if !q.processing[key] {
		q.push(key)
	}
}

// AddAfter queues key after d, for retries.
func (q *queue) AddAfter(key string, d time.Duration) {
	if d <= 0 {
		q.Add(key)
		return
	}
	time.AfterFunc(d, func() { q.Add(key) })
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
	q.onDepth(len(q.items))
	return key, true
}

// Done marks key processed and queues it again if it was added meanwhile.
func (q *queue) Done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if q.dirty[key] {
		q.push(key)
	}
}

func (q *queue) push(key string) {
	q.items = append(q.items, key)
	q.onDepth(len(q.items))
	q.cond.Signal()
}

// setPaused pauses (every Get returns at once, keys stay queued) or resumes.
func (q *queue) setPaused(paused bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.paused = paused
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
