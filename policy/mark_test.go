package policy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestRoundInAnswersFromTheRoundsInProgress ensures roundIn, which the
// marks ask for every object a list shows, says a namespace has a round
// exactly while one of its objects' current round is in progress, however
// the round ended (its entry let go of it, the entry was deleted, the term
// ended), and keeps no round that is over.
func TestRoundInAnswersFromTheRoundsInProgress(t *testing.T) {
	c := New(Config{SelectorAnnotation: DefaultSelectorAnnotation}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(metrics.NewRegistry()))
	inRound := func(key, namespace string) *round {
		r := &round{key: key}
		c.entries[key] = &entry{obj: object{namespace: namespace}, round: r}
		c.begin(namespace, r)
		return r
	}
	c.mu.Lock()
	defer c.mu.Unlock()

	inRound("a/one", "a")
	inRound("a/two", "a")
	inRound("b/one", "b")
	assert.True(t, c.roundIn("a"), "two rounds in a")
	assert.False(t, c.roundIn("c"), "no round in c")

	c.entries["a/one"].round = nil // its entry let go of it
	assert.True(t, c.roundIn("a"), "a/two still runs")
	delete(c.entries, "a/two") // the object deleted mid-round
	assert.False(t, c.roundIn("a"), "no round left in a")
	assert.NotContains(t, c.begun, "a", "the rounds over are not kept")

	c.entries["b/one"].round = &round{key: "b/one"} // a newer round, begun elsewhere
	assert.False(t, c.roundIn("b"), "the round b began is no longer its entry's")

	inRound("b/one", "b")
	c.mu.Unlock()
	c.endTerm()
	c.mu.Lock()
	assert.False(t, c.roundIn("b"), "a term's end ends its rounds")
	assert.Empty(t, c.begun)
}

// TestMarkIsNotHeldBehindALISTInFlight ensures a change seen while an
// earlier mark's LIST is in flight (its answer slow) is marked by a LIST
// sent right then, not once that answer is back: pods created meanwhile
// (replacements) run the change, and a later LIST would count them as
// older and restart them (the simulator's seed 5553). Marks noted before a
// LIST is sent still share it.
func TestMarkIsNotHeldBehindALISTInFlight(t *testing.T) {
	api := newFakeAPI(t, &fakePod{name: "web-1", uid: "uid-1", labels: map[string]string{"app": "web"}})
	api.listsAtRevision = true
	x := mirror(t, api, nil)
	release, free := heldUntilFreed(t)
	var marks atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") && slices.Equal(r.query["limit"], []string{"1"}) {
			if marks.Add(1) == 1 {
				<-release // the first mark's answer is slow
			}
		}
		return 0, "", false
	}
	c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)

	c.mu.Lock()
	first := c.sendMark("default")
	c.mu.Unlock()
	require.NotNil(t, first)
	require.Eventually(t, func() bool { return marks.Load() == 1 }, waitFor, time.Millisecond, "the first mark's LIST in flight")
	c.mu.Lock()
	second := c.sendMark("default")
	c.mu.Unlock()
	_, ok := second.wait(context.Background(), waitFor)
	assert.True(t, ok, "the second mark answered while the first's LIST is held")
	_, ok = first.resolved()
	assert.False(t, ok)
	free()
	_, ok = first.wait(context.Background(), waitFor)
	assert.True(t, ok)
	assert.Equal(t, int32(2), marks.Load(), "one LIST per mark here: none noted together")
}

// TestChangeSeenWhileReplacementsAreDueIsMarked ensures a change seen while
// no round of the namespace is in progress, but less than leftAfter after
// one restarted pods (all at once: it ended before their replacements
// existed), is marked, so that a replacement created after the change was
// seen, while the new round's intent write is slow, runs its data and is
// not restarted: without a mark, the new round's bound (its first DELETE's
// answer, after the write) came after that replacement, and took it
// (simulator seed 2029).
func TestChangeSeenWhileReplacementsAreDueIsMarked(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	api := newFakeAPI(t, &fakePod{name: "web-1", uid: "uid-1", labels: web}, &fakePod{name: "web-2", uid: "uid-2", labels: web})
	api.listsAtRevision = true
	x := mirror(t, api, nil) // the ReplicaSet replaces pods when the test says
	c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 1 }, waitFor, time.Millisecond, "the first round restarted both, and ended")
	settle(t, c)

	// web-1's replacement comes before the next change, web-2's after it
	// was seen, while the new round's intent write is held.
	api.mu.Lock()
	early := api.replacement(fakePod{name: "web-1", labels: web})
	api.mu.Unlock()
	x.Handle(podEvent(t, watch.Added, *early))
	release, free := heldUntilFreed(t)
	var held atomic.Bool
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPatch && strings.Contains(r.body, RestartingAnnotation) && held.CompareAndSwap(false, true) {
			<-release
		}
		return 0, "", false
	}
	v3 := map[string]string{"message": "Hello once more"}
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v3})
	require.Eventually(t, held.Load, waitFor, time.Millisecond, "the intent's write held")
	require.Eventually(t, func() bool { return markResolved(c) }, waitFor, time.Millisecond, "the change marked")
	api.mu.Lock()
	late := api.replacement(fakePod{name: "web-2", labels: web})
	api.mu.Unlock()
	x.Handle(podEvent(t, watch.Added, *late))
	free()

	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 2 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.ElementsMatch(t, []string{"web-1", "web-2", "web-1r"}, api.removedPods(), "web-2r runs the new data")
}
