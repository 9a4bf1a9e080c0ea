package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestPodCreatedAfterChangeSeenIsNotRestartedForIt ensures a pod created
// after a change was seen is not restarted for it, whichever object's round
// created it: two ConfigMaps over the same pods change together; the round
// that goes first replaces the pods both select, and the other round
// restarts only the pods it alone selects, not those replacements (they
// run both new data). Each original pod is restarted once.
func TestPodCreatedAfterChangeSeenIsNotRestartedForIt(t *testing.T) {
	front := map[string]string{"app": "web", "tier": "front"}
	api := newFakeAPI(t,
		&fakePod{name: "web-1", uid: "uid-1", labels: front},
		&fakePod{name: "web-2", uid: "uid-2", labels: front},
		&fakePod{name: "web-3", uid: "uid-3", labels: map[string]string{"app": "web"}})
	x := mirror(t, api, api.replacement)
	cfg := withIndex(Config{RecordHash: true, Workers: 1}, x)
	c, m := newTestController(t, api.client(), cfg)

	// Both changes are seen before either round begins.
	handle(t, c, watch.Modified, cmSpec{name: "front", uid: "uid-cm-front", selector: ptr("app=web,tier=front"), recorded: hashOf(t, v1), data: v2})
	handle(t, c, watch.Modified, cmSpec{name: "web", uid: "uid-cm-web", selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
	start(t, c)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, 1e6)
	settle(t, c)

	assert.Equal(t, []string{"web-1", "web-2", "web-3"}, api.removedPods(), "each pod once; no replacement")
	assert.Len(t, api.recordedHashes(), 2, "each object records its own R")
}
