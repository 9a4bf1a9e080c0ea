package policy

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// drain takes every key the queue holds, in the order workers get them.
func drain(q *queue) []string {
	var keys []string
	for !q.idle() {
		key, _ := q.Get()
		q.Done(key)
		keys = append(keys, key)
	}
	return keys
}

// TestLooksDueTogetherAreHandedOutByKey ensures keys whose looks fall due
// at one instant are handed out in the order of their keys, whatever the
// order their timers were set or their goroutines run in.
func TestLooksDueTogetherAreHandedOutByKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(func(int) {})
		q.setPaused(false)
		q.AddAfter("ns/late", 2*time.Second, false)
		for _, key := range []string{"ns/e", "ns/c", "ns/a", "ns/d", "ns/b"} {
			q.AddAfter(key, time.Second, false)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"ns/a", "ns/b", "ns/c", "ns/d", "ns/e"}, drain(q))
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"ns/late"}, drain(q))
	})
}

// TestPodChangeQueuesRoundsByKey ensures the rounds one pod change wakes
// are queued in the order of their keys, not of a map's iteration.
func TestPodChangeQueuesRoundsByKey(t *testing.T) {
	c, _ := newTestController(t, newFakeAPI(t).client(), Config{RecordHash: true})
	c.queue.setPaused(false)
	var want []string
	for i := range 12 {
		key := fmt.Sprintf("ns/cm%02d", i)
		want = append(want, key)
		c.entries[key] = &entry{obj: object{namespace: "ns"}, round: &round{key: key}}
	}
	c.podChanged("ns", nil)
	assert.Equal(t, want, drain(c.queue))
}
