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
		if r.method != http.MethodPatch && r.method != http.MethodPost { // the state's first write creates it
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
		return r != nil && r.hash == v3hash && c.halted["ns/webapp-config"] == r // r.halted is its worker's
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

// TestReviewSecretOwnerSyncThenLateStateEventRestartsTwice: the state of a
// Secret lives in its state ConfigMap, whose events come on the ConfigMap
// watch; the Secret's on another. A Secret event (an owner's sync that
// changes no data) applies R and I as our last write left them and forgets
// that write (entry.written = nil), although no event of the state
// ConfigMap has caught up; observeState's replay check compares only with
// the last state ConfigMap *event*. So a late state ConfigMap event older
// than our own writes (the ConfigMap watch resuming after a break replays
// in order) is taken as someone else's record: R goes back to the digest
// before the change, and a new round restarts every pod a second time.
//
// Sequence: first sight of the Secret (s1) is adopted (state ConfigMap
// written at rv p); its data changes to s2 and the round restarts the 3 pods
// (intent at rv a, record at rv b); the owner syncs the Secret (metadata
// only); the ConfigMap watch then delivers the state ConfigMap's ADDED at p.
func TestReviewSecretOwnerSyncThenLateStateEventRestartsTwice(t *testing.T) {
	api := replacingAPI(t)
	secret := secretSpec{selector: ptr("app=webapp"), data: s1}
	c := secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}, nil, []secretSpec{secret})
	settle(t, c)
	require.Equal(t, []string{secretHashOf(t, s1)}, api.recordedHashes(), "adopted")

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)
	require.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())
	require.Equal(t, []string{secretHashOf(t, s1), secretHashOf(t, s2)}, api.recordedHashes())

	secret.annotations = map[string]string{"owner.example/synced": "1"} // the owner's sync
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)

	// The ConfigMap watch catches up: first the adoption's state ConfigMap.
	adopted := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")
	adopted.rv = api.patchRV(0)
	handle(t, c, watch.Added, adopted)
	settle(t, c)

	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods(), "each pod restarted once for s2")
	assert.Equal(t, []string{secretHashOf(t, s1), secretHashOf(t, s2)}, api.recordedHashes(), "no second round")
}

// TestReviewSecretOwnerSyncThenOwnLateIntentResumesARound: the same hole
// with ordinary timing. A short round's own intent event arriving after its
// record was answered is normal (TestOwnLateIntentEventWritesNoSecondRecord
// covers it for ConfigMaps); if the Secret's owner syncs in between, that
// intent event reads as someone else's: R goes back, I is taken, and a
// "resumed" round writes the record a second time and reports a second
// PodsRestarted Event for 0 pods.
func TestReviewSecretOwnerSyncThenOwnLateIntentResumesARound(t *testing.T) {
	api := replacingAPI(t)
	rec := &fakeRecorder{}
	secret := secretSpec{selector: ptr("app=webapp"), data: s1}
	state := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")
	c := secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, Events: rec}, []cmSpec{state}, []secretSpec{secret})
	settle(t, c)

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)
	require.Len(t, api.deletedPods(), 3)
	writes := len(api.seen(http.MethodPatch, "configmaps"))
	require.Equal(t, 2, writes, "the intent and the record")

	secret.annotations = map[string]string{"owner.example/synced": "1"}
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)

	intent := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), api.intents()[0])
	intent.rv = api.patchRV(0)
	handle(t, c, watch.Modified, intent)
	settle(t, c)
	record := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s2), "")
	record.rv = api.patchRV(1)
	handle(t, c, watch.Modified, record)
	settle(t, c)

	assert.Len(t, api.seen(http.MethodPatch, "configmaps"), writes, "our own late intent event caused a write")
	n := 0
	for _, e := range rec.all() {
		if e.reason == "PodsRestarted" {
			n++
		}
	}
	assert.Equal(t, 1, n, "PodsRestarted Events: %v", rec.all())
}

// TestReviewRecreatedMidRoundRestartsEveryPodAgain: a ConfigMap deleted and
// re-created with the same data (kubectl replace --force, helm --force, a
// GitOps prune and re-create) while its round for that data finishes. The
// round restarted every pod for v2; its record finds the ConfigMap gone
// (404: superseded). The tombstone keeps R = v1 and the new object starts
// with no I, so the re-created ConfigMap (v2) reads as a change from v1 and
// a new round restarts every pod again, replacements that already run v2.
// design.md: a re-created ConfigMap "is compared with the digest its pods
// were restarted for"; they were restarted for v2.
func TestReviewRecreatedMidRoundRestartsEveryPodAgain(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	// The pod index tells that every replacement was created before the
	// deletion was seen (startedWhileGone).
	x := mirror(t, api, func(p fakePod) *fakePod {
		if p.terminating {
			return nil
		}
		return api.pods[api.addPodLocked(p.name+"x", p.labels).name]
	})
	var c *Controller
	var once sync.Once
	cm := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}
	api.fault = func(r request) (int, string, bool) {
		gone := false
		if r.method == http.MethodPatch && strings.Contains(r.body, RestartedForAnnotation) {
			once.Do(func() {
				handle(t, c, watch.Deleted, cm)
				gone = true
			})
		}
		if gone {
			return 404, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, true
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)
	handle(t, c, watch.Modified, cm)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultUnchanged) >= 1 }, waitFor, time.Millisecond)
	settle(t, c)
	require.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())

	// Re-created from the same manifest: same data, new uid, no annotations of ours.
	handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2})
	settle(t, c)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods(), "the replacements already run v2")
}

// TestReviewReplacedObjectSeenOnARelistLosesTheChange: a round in waves for
// v2 runs on ConfigMap uid-1 (its intent written there). The ConfigMap is
// deleted and re-created from its manifest (same data v2, new uid-2, none
// of our annotations) while the ConfigMap watch is relisting after a 410,
// so no DELETED event is seen: the relist shows uid-2. entry.apply resets I
// for the new object but does not end the round (same data and selector)
// nor mark it wiped, so the round goes on restarting pods with no intent on
// the object that now exists. The controller is then restarted (its own
// rolling update): the new process finds uid-2 with no R and no I, adopts
// v2, and the pods that still run v1 are never restarted.
func TestReviewReplacedObjectSeenOnARelistLosesTheChange(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.replaceDeleted(func() bool { return false })
	c1, m1 := newTestController(t, api.client(), Config{RecordHash: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c1.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	handle(t, c1, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m1.Reconciles.Value(resultWaiting) >= 1 }, waitFor, time.Millisecond)
	require.Equal(t, []string{"web-1"}, api.deletedPods())
	patchesBefore := len(api.seen(http.MethodPatch, "configmaps"))

	// The relist: the same name, a new object.
	recreated := cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2}
	h := c1.ForConfigMaps("")
	h.BeginList()
	handle(t, c1, watch.Synced, recreated)
	h.EndList()
	api.makeReady() // web-1-r Ready: the next wave restarts web-2
	require.Eventually(t, func() bool { return len(api.deletedPods()) >= 2 }, waitFor, time.Millisecond)
	cancel() // the controller's own rolling update
	<-done
	done = make(chan struct{})
	close(done) // for the cleanup

	// What the server now holds on uid-2: our annotations written since the relist.
	for _, a := range api.patchedAnnotations()[patchesBefore:] {
		if v, ok := a[RestartingAnnotation]; ok && v != nil {
			recreated.intent = *v
		}
		if v, ok := a[RestartedForAnnotation]; ok && v != nil {
			recreated.recorded = *v
		}
	}
	assert.NotEmpty(t, recreated.intent, "pods were restarted for uid-2 with no intent on it")

	c2, m2 := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c2)
	api.replaceDeleted(func() bool { return true })
	api.makeReady()
	handle(t, c2, watch.Synced, recreated)
	require.Eventually(t, func() bool {
		return m2.Reconciles.Value(resultRestarted)+m2.Reconciles.Value(resultAdopted) >= 1
	}, waitFor, time.Millisecond)
	assert.Zero(t, m2.Reconciles.Value(resultAdopted), "the new process adopted v2 with pods still on v1")
	assert.Subset(t, api.deletedPods(), []string{"web-1", "web-2", "web-3", "web-4"}, "pods still running v1 were never restarted")
}

// TestReviewStandbyKeepsReportingAHaltedRound: the leader's round halts
// (gauge 1), then the replica loses the lease. As a standby it runs no
// round, yet its config_watcher_rounds_halted stays 1 (c.halted and
// e.round are kept), while the new leader resumes the round un-halted for a
// whole PROGRESS_DEADLINE and then reports its own 1: an "alert on > 0"
// fires on the wrong replica, and sum() over replicas counts the round
// twice. (operations.md: "rounds halted now"; "always 0 on a standby" is
// said of the queue depth.)
func TestReviewStandbyKeepsReportingAHaltedRound(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.replaceDeleted(func() bool { return false })
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 50 * time.Millisecond, Events: rec})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Lead(ctx, func() time.Duration { return 0 }); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, c.queue.active, waitFor, time.Millisecond)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, hasReason(rec, "RolloutHalted"), waitFor, time.Millisecond)
	require.Equal(t, 1.0, m.RoundsHalted.Value())
	cancel() // the lease is lost
	<-done
	done = make(chan struct{})
	close(done)
	assert.Equal(t, 0.0, m.RoundsHalted.Value(), "a standby reports a halted round")
}
