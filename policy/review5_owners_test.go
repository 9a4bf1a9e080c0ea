package policy

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestReviewTurn5NoEstimateSaidWhereNoScaleWasRead ensures a round whose
// pending pods all serve nothing (the fix reaching crash-looping pods),
// which reads no owner's scale because none needs the budget, says no
// ExpectedPodsEstimated Warning and counts no failed read: nothing failed.
func TestReviewTurn5NoEstimateSaidWhereNoScaleWasRead(t *testing.T) {
	api := newFakeAPI(t, podsOf("NNNN")...)
	api.replaceDeleted(func() bool { return true })
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)

	require.Len(t, api.deletedPods(), 4)
	assert.Empty(t, api.seen(http.MethodGet, "scale"), "no pod needed the budget: no scale read")
	assert.Empty(t, eventText(rec, "ExpectedPodsEstimated"), "no read failed")
	assert.Zero(t, m.OwnerReadsFailed.Value("error"))
}
