package policy

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestReviewTurn5PacedRestartAsksCurrentAfterItsToken ensures a restart
// that waited for a token of MAX_RESTARTS_PER_SECOND asks whether its round
// is still current before it is sent: the selector changed meanwhile (or
// the replica stopped leading), and the pods the round took are no longer
// selected.
func TestReviewTurn5PacedRestartAsksCurrentAfterItsToken(t *testing.T) {
	for _, how := range []string{"selector changed", "lease lost"} {
		t.Run(how, func(t *testing.T) {
			var pods []*fakePod
			for i := range 11 { // the burst is 10: the eleventh waits a second
				pods = append(pods, &fakePod{name: "web-" + strconv.Itoa(i), uid: "uid-web-" + strconv.Itoa(i), labels: map[string]string{"app": "web"}})
			}
			api := newFakeAPI(t, pods...)
			var leading atomic.Bool
			leading.Store(true)
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100},
				MaxRestartsPerSecond: 1, MayAct: leading.Load})
			start(t, c)

			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return len(api.deletedPods()) == 10 }, waitFor, time.Millisecond)
			if how == "selector changed" {
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web,tier=none"), recorded: hashOf(t, v1), data: v2})
			} else {
				leading.Store(false)
			}
			time.Sleep(1500 * time.Millisecond) // the eleventh's token comes
			assert.Len(t, api.deletedPods(), 10, "a DELETE sent after its round ended (%s)", how)
		})
	}
}
