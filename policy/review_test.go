package policy

// Sequences a review of policy/ proved wrong (../shared/reviews), kept under
// the review's names: each failed before its fix. Their setups use this
// package's fakes; what they assert is the review's.

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/testlog"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestReviewSecretDigestPrefixLeaksThroughATruncatedRefusal: hideDigest
// hides runs of 16 or more hex digits in the text of a refused state
// write, but it runs on the StatusError whose message apiclient has already
// cut at 1024 bytes (StatusFromJSON; plain-text bodies at 256). An
// admission webhook that quotes the annotations it refuses after a long
// enough preamble (a Gatekeeper constraint listing violations) has the cut
// fall inside the keyed digest: the 8-15 hex digits before the cut are not a
// run of 16, are not hidden, and reach the "write refused; will retry" and
// "round failed; will retry" log lines (the WriteRefused Event is cut at
// 1024 bytes after hiding, with a longer prefix, and escapes).
// TestSecretDataNeverLeaves forbids any 8 characters of the keyed digest in
// the logs.
func TestReviewSecretDigestPrefixLeaksThroughATruncatedRefusal(t *testing.T) {
	const shown = 12 // hex digits of the digest before the cut
	api := newFakeAPI(t, webPods()...)
	api.fault = func(r request) (int, string, bool) {
		if r.method != http.MethodPatch {
			return 0, "", false
		}
		head := `admission webhook "validation.gatekeeper.sh" denied the request: [cw-annotations-allowlist] `
		at := strings.Index(r.body, keyedDigestPrefix) + len(keyedDigestPrefix)
		msg := head + strings.Repeat("annotation not in the allowed list; ", 40)
		msg = msg[:1024-shown-at] + r.body // the violations listed before the quoted metadata
		status, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden", "message": msg})
		return 403, string(status), true
	}
	logs, rec := &testlog.Buffer{}, &fakeRecorder{}
	cfg := Config{RecordHash: true, SelectorAnnotation: DefaultSelectorAnnotation, DigestKey: testKey, Events: rec, NewBackOff: fastBackOff}
	c := New(cfg, api.client(), slog.New(slog.NewJSONHandler(logs, nil)), NewMetrics(metrics.NewRegistry()))
	listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s1})
	listConfigMaps(t, c)
	start(t, c)
	require.Eventually(t, func() bool { return len(rec.all()) > 0 }, waitFor, time.Millisecond)

	keyed := strings.TrimPrefix(secretHashOf(t, s1), keyedDigestPrefix)
	var events strings.Builder
	for _, e := range rec.all() {
		events.WriteString(e.kind + " " + e.reason + " " + e.message + "\n")
	}
	require.Contains(t, events.String(), "Secret WriteRefused")
	for where, text := range map[string]string{"logs": logs.String(), "events": events.String()} {
		for i := 0; i+8 <= len(keyed); i++ {
			if strings.Contains(text, keyed[i:i+8]) {
				t.Errorf("%s contain %q, 8 hex digits of the Secret's keyed digest", where, keyed[i:i+8])
				break
			}
		}
	}
	if i := strings.Index(logs.String(), keyed[:8]); i >= 40 {
		t.Logf("log: …%s", logs.String()[i-40:i+40])
	}
}

// lowestReadyAtDeletion wraps api.afterDelete to record the fewest selected,
// owned, non-terminating Ready pods right after each of our deletions.
func lowestReadyAtDeletion(api *fakeAPI, start int) *int {
	lowest := start
	inner := api.afterDelete
	api.afterDelete = func(p fakePod) {
		if inner != nil {
			inner(p)
		}
		lowest = min(lowest, api.readyCountLocked(webapp))
	}
	return &lowest
}

// TestReviewLostDeleteAnswerWidensTheBudget: 4 Ready pods, MAX_UNAVAILABLE
// 25% (1 pod, so 3 must stay Ready). The first wave's DELETE of web-1 takes
// effect but its answer is lost (504 from the ambassador). The retried wave
// finds web-1 gone and marks it podGone, which floor() counts as "left the
// round by other hands" and takes out of N: the floor drops to 2, and the
// round restarts web-2 while web-1's replacement is still not Ready. Two of
// four pods are down with a budget of one.
func TestReviewLostDeleteAnswerWidensTheBudget(t *testing.T) {
	for _, graceful := range []bool{false, true} {
		name := "PodRemovedAtOnce"
		if graceful {
			name = "PodTerminatingGracefully"
		}
		t.Run(name, func(t *testing.T) {
			api := newFakeAPI(t, podsOf("RRRR")...)
			api.graceful = graceful
			api.replaceDeleted(func() bool { return false }) // replacements slow to become Ready
			lowest := lowestReadyAtDeletion(api, 4)
			var lost atomic.Bool
			api.lose = func(r request) bool { return r.method == http.MethodDelete && lost.CompareAndSwap(false, true) }
			rec := &fakeRecorder{}
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 100 * time.Millisecond, Events: rec})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, hasReason(rec, "RolloutHalted"), waitFor, time.Millisecond)
			api.mu.Lock()
			defer api.mu.Unlock()
			assert.Equal(t, []string{"web-1"}, api.removed, "only one pod may be down at a time (25 percent of 4)")
			assert.GreaterOrEqual(t, *lowest, 3, "Ready pods fell below N - MAX_UNAVAILABLE")
		})
	}
}

// TestReviewPodsDeletedByOthersWidenTheBudget: 8 Ready pods, MAX_UNAVAILABLE
// 25% (2, so 6 must stay Ready). The first wave restarts web-1 and web-2.
// Then a node drain (or kubectl delete) removes web-3 and web-4, whose
// ReplicaSet replaces them at once with Ready pods: nothing is unavailable
// because of it. The next wave marks web-3 and web-4 podGone and takes them
// out of N (floor 8-2-2 = 4) while the live Ready count includes their
// replacements, so it restarts two more Ready pods while web-1 and web-2's
// replacements are still not Ready: 4 of 8 down with a budget of 2.
func TestReviewPodsDeletedByOthersWidenTheBudget(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRRRRRR")...)
	api.replaceDeleted(func() bool { return false })
	lowest := lowestReadyAtDeletion(api, 8)
	var drained sync.Once
	api.fault = func(r request) (int, string, bool) {
		// Between waves: the drain, before the second wave's list.
		// (Adapted: a wave lists the namespace's pods, with no label selector.)
		if r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") && r.query["continue"] == nil {
			api.mu.Lock()
			if len(api.removed) == 2 {
				drained.Do(func() {
					for _, name := range []string{"web-3", "web-4"} {
						old := api.pods[name]
						delete(api.pods, name)
						p := api.addPodLocked(name+"-d", old.labels)
						api.pods[p.name].owner, api.pods[p.name].ready = old.owner, true
					}
				})
			}
			api.mu.Unlock()
		}
		return 0, "", false
	}
	rec := &fakeRecorder{}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 200 * time.Millisecond, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, hasReason(rec, "RolloutHalted"), waitFor, time.Millisecond)
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.ElementsMatch(t, []string{"web-1", "web-2"}, api.removed, "with web-1-r and web-2-r not Ready, no further Ready pod may go")
	assert.GreaterOrEqual(t, *lowest, 6, "Ready pods fell below N - MAX_UNAVAILABLE")
}

// TestReviewEvictedPodStallsTheRoundForever: a Deployment of 4 Ready pods
// plus one Evicted pod its ReplicaSet left behind (phase Failed, owned, not
// Ready, already replaced). N counts 5, budget 25% of 5 = 1, floor 4. The
// first wave deletes the Evicted pod (not Ready: always), which nothing
// replaces; from then on 4 Ready pods must stay >= 4 Ready, and no Ready pod
// can ever be restarted. The round halts and never completes, though all
// replacements would become Ready at once: the change never reaches the
// pods. (The same with a Completed Job pod carrying the app's labels.)
func TestReviewEvictedPodStallsTheRoundForever(t *testing.T) {
	pods := podsOf("RRRRN")
	pods[4].name, pods[4].phase = "web-evicted", "Failed" // status.reason Evicted (adapted: the fake's phase)
	api := newFakeAPI(t, pods...)
	replace := func(p fakePod) {
		if p.name == "web-evicted" {
			return // a failed pod: its ReplicaSet replaced it long ago
		}
		r := api.addPodLocked(p.name+"-r", p.labels)
		api.pods[r.name].owner, api.pods[r.name].ready = p.owner, true // healthy new data
	}
	api.afterDelete = replace
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 300 * time.Millisecond, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool {
		return m.Reconciles.Value(resultRestarted) == 1 || slices.Contains(rec.reasons(), "ConfigMap/RolloutHalted")
	}, waitFor, time.Millisecond)
	assert.Empty(t, eventText(rec, "RolloutHalted"))
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted), "the round must complete")
	assert.Subset(t, api.deletedPods(), []string{"web-1", "web-2", "web-3", "web-4"}, "every running pod restarted")
}

// TestReviewStatefulSetTerminatingPodNotInN: a StatefulSet of 3 Ready pods
// (a quorum), MAX_UNAVAILABLE 25% (1). A change's first wave deletes web-1,
// which terminates for its grace period; a StatefulSet creates its
// replacement only once it is gone. A second change (the fix of a typo)
// supersedes the round. The new round counts N on non-terminating pods only:
// N = 2, budget 1, floor 1, and it restarts web-2 at once: 2 of 3 down,
// quorum lost, with MAX_UNAVAILABLE allowing one.
func TestReviewStatefulSetTerminatingPodNotInN(t *testing.T) {
	pods := podsOf("RRR")
	for _, p := range pods {
		p.ownerKind = "StatefulSet" // (adapted: the fake's owner is a StatefulSet)
	}
	api := newFakeAPI(t, pods...)
	api.graceful = true // the StatefulSet waits for the pod to be gone
	lowest := lowestReadyAtDeletion(api, 3)
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 200 * time.Millisecond, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 1 }, waitFor, time.Millisecond)
	require.Equal(t, []string{"web-1"}, api.removedPods())
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v3, intent: api.intents()[0]})
	v3hash, _ := parseDigest(hashOf(t, v3))
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		r := c.entries["ns/webapp-config"].round
		return r != nil && r.hash == v3hash && r.halted
	}, waitFor, time.Millisecond)
	assert.Equal(t, []string{"web-1"}, api.removedPods(), "a second pod went down while web-1 terminates")
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.GreaterOrEqual(t, *lowest, 2, "Ready pods of the StatefulSet fell below 3 - 1")
}

// TestReviewHaltedRoundSpreadsBadDataToPodsThatBlip: a round halted because
// its replacements never become Ready (bad data) is not frozen. Its pending
// pods still run the old, good data; when they are not Ready for a moment
// (readiness probes failing under the load of the missing replica, or a
// shared dependency's hiccup), the next halted look restarts them at once
// ("not Ready: always", outside the budget) onto the bad data, where they
// never become Ready again, and the round even records the bad data as
// done. No pod is Ready: a full outage, from a round that had halted after
// one pod.
func TestReviewHaltedRoundSpreadsBadDataToPodsThatBlip(t *testing.T) {
	api, _, m, _ := halted(t, "RRRR")
	require.Equal(t, []string{"web-1"}, api.deletedPods())
	lowest := lowestReadyAtDeletion(api, 3)
	api.mu.Lock()
	for _, name := range []string{"web-2", "web-3", "web-4"} {
		api.revision++
		api.pods[name].ready, api.pods[name].version = false, api.revision // probe failing, container running
	}
	api.mu.Unlock()
	waits := m.Reconciles.Value(resultWaiting)
	require.Eventually(t, func() bool {
		return m.Reconciles.Value(resultWaiting) >= waits+3 || m.Reconciles.Value(resultRestarted) > 0
	}, waitFor, time.Millisecond)
	assert.Equal(t, []string{"web-1"}, api.deletedPods(), "a halted round restarted pods running the good data onto the bad")
	assert.Zero(t, m.Reconciles.Value(resultRestarted), "the halted round of bad data completed")
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.Equal(t, 3, *lowest, "Ready pods at each deletion after the halt")
}

// TestReviewOverlappingRoundTakesTheOthersPodsAsGone: two ConfigMaps, b
// (tier=web: web-1..4 and x-5..8, 25% of 8 = 2, floor 6) and a (app=webapp:
// web-1..4, 25% of 4 = 1). b's round begins first and restarts web-1 and
// web-2; a's round then restarts its four pods one wave at a time (both
// rules hold at each of its restarts) and completes. Every pod a restarted
// that was pending in b's round is "gone" to b, and floor() takes it out of
// b's N although a's ReplicaSet replaced it: b's floor falls to 8-2-2 = 4,
// and its next wave restarts all four x pods at once. The waves are driven
// one reconcile at a time (no workers), so the order is exact.
func TestReviewOverlappingRoundTakesTheOthersPodsAsGone(t *testing.T) {
	pods := podsOf("RRRRRRRR")
	for i, p := range pods {
		p.labels["tier"] = "web"
		if i >= 4 {
			p.name = "x-" + p.name[len("web-"):]
			delete(p.labels, "app")
		}
	}
	api := newFakeAPI(t, pods...)
	api.replaceDeleted(func() bool { return false })
	tier := func(l map[string]string) bool { return l["tier"] == "web" }
	lowest := 8
	replace := api.afterDelete
	api.afterDelete = func(p fakePod) {
		replace(p)
		lowest = min(lowest, api.readyCountLocked(tier))
	}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	ctx := context.Background()
	step := func(key, want string) {
		t.Helper()
		result, _, err := c.reconcile(ctx, key)
		require.NoError(t, err)
		if want != "" {
			require.Equal(t, want, result, key)
		}
	}

	handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-b", selector: ptr("tier=web"), recorded: hashOf(t, v1), data: v2})
	step("ns/b", resultWaiting)
	require.ElementsMatch(t, []string{"web-1", "web-2"}, api.deletedPods())
	api.makeReady()

	handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-a", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	for range 3 {
		step("ns/a", resultWaiting)
		api.makeReady()
	}
	step("ns/a", resultRestarted)
	api.makeReady()
	api.mu.Lock()
	require.Equal(t, 6, lowest, "each round kept the floor so far")
	api.mu.Unlock()

	step("ns/b", "") // b's second wave
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.GreaterOrEqual(t, lowest, 6, "tier=web Ready pods fell below 8 - 2; removed: %v", api.removed)
}
