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
