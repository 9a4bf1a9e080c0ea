package policy

import (
	"io"
	"log/slog"
	"testing"

	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/stretchr/testify/assert"
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
