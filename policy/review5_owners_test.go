package policy

import (
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
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

// TestReviewTurn5OwnersForgottenWithTheirRounds ensures the desired
// replicas read for a round are not kept once no round needs them: the
// cache is bounded by the owners of the rounds in progress (owners.forget
// says so), not by every ReplicaSet any round ever read (one more at each
// rollout of each Deployment).
func TestReviewTurn5OwnersForgottenWithTheirRounds(t *testing.T) {
	var pods []*fakePod
	for i := range 3 {
		for _, p := range owned("app"+strconv.Itoa(i), 2) {
			pods = append(pods, p)
		}
	}
	api := newFakeAPI(t, pods...)
	api.replaceDeleted(func() bool { return true })
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	for i := range 3 {
		handle(t, c, watch.Modified, cmSpec{name: "cm-" + strconv.Itoa(i), uid: "cm-uid-" + strconv.Itoa(i), selector: ptr("app=app" + strconv.Itoa(i)), recorded: hashOf(t, v1), data: v2})
	}
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 3 }, waitFor, time.Millisecond)
	settle(t, c)
	require.GreaterOrEqual(t, len(api.seen(http.MethodGet, "scale")), 3, "each round read its owner's scale")

	c.owners.mu.Lock()
	defer c.owners.mu.Unlock()
	assert.Empty(t, c.owners.scales, "no round in progress, yet the scales of every owner ever read are kept")
}

// TestReviewTurn5EstimatedOwnerThatShrinksStallsTheRound ensures a round
// over a DaemonSet's pods (no scale subresource: expected is the most of
// its pods seen) still completes when a node goes away mid-round: the
// DaemonSet then wants one pod fewer, and with 3 pods all Ready a budget
// of 1 allows the next restart once the pod gone with its node has
// counted for leftAfter (its replacement, had the node stayed, would
// have shown by then). Counting the 4 seen once forever leaves the other
// pods on the old data: the round halts and never goes on.
func TestReviewTurn5EstimatedOwnerThatShrinksStallsTheRound(t *testing.T) {
	pods := podsOf("RRRR")
	for _, p := range pods {
		p.owner, p.ownerKind = "web-ds", "DaemonSet"
	}
	api := newFakeAPI(t, pods...) // its server, a socket, outside the bubble
	api.replaceNotReady()
	api.readyOnceListed()
	replace := api.afterDelete
	api.afterDelete = func(p fakePod) {
		replace(p)
		if p.name == "web-1" {
			delete(api.pods, "web-4") // its node is removed: the DaemonSet has 3 pods from now on
		}
	}
	synctest.Test(t, func(t *testing.T) {
		rec := &fakeRecorder{}
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, Events: rec, ProgressDeadline: 300 * time.Millisecond})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait()
		time.Sleep(leftAfter + time.Second)
		synctest.Wait()
		assert.Len(t, api.deletedPods(), 3, "web-2 and web-3 left on the old data: deleted %v; %s", api.deletedPods(), eventText(rec, "RolloutHalted"))
	})
}

// TestDaemonSetPodDeletedByOthersKeepsCountingUntilReplaced ensures a pod
// of an estimated owner (a DaemonSet: no scale) deleted by someone else
// while its node stays keeps counting expected: the DaemonSet replaces it
// only once it is gone, and an estimate lowered at once widens the budget
// until the replacement shows. With 4 expected and a budget of 1, web-1
// restarted and replaced and web-4 deleted by kubectl (its replacement
// not shown yet), nothing more may go down.
func TestDaemonSetPodDeletedByOthersKeepsCountingUntilReplaced(t *testing.T) {
	pods := podsOf("RRRR")
	for _, p := range pods {
		p.owner, p.ownerKind = "web-ds", "DaemonSet"
	}
	api := newFakeAPI(t, pods...)
	api.replaceNotReady()
	api.readyOnceListed() // web-1's replacement is Ready at once
	replace := api.afterDelete
	api.afterDelete = func(p fakePod) {
		replace(p)
		if p.name == "web-1" {
			delete(api.pods, "web-4") // kubectl delete pod: the DaemonSet replaces it later
		}
	}
	synctest.Test(t, func(t *testing.T) {
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait()
		time.Sleep(leftAfter / 2)
		synctest.Wait()
		assert.Equal(t, []string{"web-1"}, api.deletedPods(), "4 expected, web-4 gone, 3 Ready: no room for another")
	})
}

// TestDaemonSetPodDeletedBeforeTheFirstWaveKeepsCounting ensures a pod of
// a DaemonSet that the round saw when it took its pods, deleted by other
// hands before its first wave counted (while it settles), keeps counting
// expected: the round saw it since it began, and the DaemonSet replaces it
// only once it is gone. With 4 expected, web-4 gone and its replacement
// not shown yet, and a budget of 1, no pod may go down.
func TestDaemonSetPodDeletedBeforeTheFirstWaveKeepsCounting(t *testing.T) {
	pods := podsOf("RRRR")
	for _, p := range pods {
		p.owner, p.ownerKind = "web-ds", "DaemonSet"
	}
	api := newFakeAPI(t, pods...)
	x := mirror(t, api, nil)
	cfg := withIndex(Config{RecordHash: true, Settle: time.Second, ProgressDeadline: time.Hour}, x)
	cfg.MaxUnavailable = Budget{Pods: 1}
	synctest.Test(t, func(t *testing.T) {
		c, _ := newTestController(t, memAPI{api}, cfg)
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait() // the round took its 4 pods and settles
		api.mu.Lock()
		gone := *api.pods["web-4"] // kubectl delete pod: the DaemonSet replaces it later
		delete(api.pods, "web-4")
		api.revision++
		gone.version = api.revision
		api.mu.Unlock()
		x.Handle(podEvent(t, watch.Deleted, gone))
		time.Sleep(leftAfter / 2)
		synctest.Wait()
		assert.Empty(t, api.deletedPods(), "4 expected, web-4 gone, 3 Ready: no room for one")
	})
}
