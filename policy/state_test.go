package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestEachStateHasOneStep ensures decide maps every state of the model
// (doc.go) to the step the table names.
func TestEachStateHasOneStep(t *testing.T) {
	d1, d2 := digest{sum: [32]byte{1}}, digest{sum: [32]byte{2}}
	intentFor := func(h digest) intent { return parseIntent(h.text() + "/uid-1") }
	tests := []struct {
		name     string
		e        entry
		onServer bool
		want     step
	}{
		{"RoundInProgressContinues", entry{obj: object{hash: d2, stored: stored{recorded: d1, known: true}}, r: d1, i: intentFor(d2), round: &round{}}, true, stepContinue},
		{"IntentForTheDataResumes", entry{obj: object{hash: d2, stored: stored{recorded: d1, known: true}}, r: d1, i: intentFor(d2)}, true, stepResume},
		{"IntentForOtherDataRestartsEveryPod", entry{obj: object{hash: d1, stored: stored{recorded: d1, known: true}}, r: d1, i: intentFor(d2)}, true, stepRound},
		{"IntentForNoDataRestartsEveryPod", entry{obj: object{hash: d1, stored: stored{recorded: d1, known: true}}, r: d1, i: parseIntent("garbage")}, true, stepRound},
		{"OutdatedIntentIsNotResumed", entry{obj: object{hash: d2, stored: stored{recorded: d1, known: true}}, r: d1, i: intentFor(d2), outdated: intentFor(d2).text}, true, stepRound},
		{"FirstSightAdopts", entry{obj: object{hash: d1, stored: stored{known: true}}, r: d1, adopted: true}, true, stepAdopt},
		{"NoRecordAdopts", entry{obj: object{hash: d1, stored: stored{known: true}}}, true, stepAdopt},
		{"RecordOfTheDataDoesNothing", entry{obj: object{hash: d1, stored: stored{recorded: d1, known: true}}, r: d1}, true, stepNothing},
		{"RecordMissingOnTheServerIsWritten", entry{obj: object{hash: d1, stored: stored{known: true}}, r: d1}, true, stepRecord},
		{"RecordInMemoryOnlyDoesNothing", entry{obj: object{hash: d1, stored: stored{known: true}}, r: d1}, false, stepNothing},
		{"OtherDataRestartsEveryPod", entry{obj: object{hash: d2, stored: stored{recorded: d1, known: true}}, r: d1}, true, stepRound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.e.decide(tt.onServer))
		})
	}
}

// TestApplyKeepsTheModelTrue ensures an event updates R, I and the round
// the way the model needs: our own writes are not undone by events that
// were on their way, an intent seen while the data differs is outdated for
// good, and a round is marked ended (for its worker to let go) when the
// data, the selector, or a peer's record or intent says it is no longer
// current.
func TestApplyKeepsTheModelTrue(t *testing.T) {
	d1, d2 := digest{sum: [32]byte{1}}, digest{sum: [32]byte{2}}
	i2 := parseIntent(d2.text() + "/uid-1")
	t.Run("EventBeforeOurRecordDoesNotUndoIt", func(t *testing.T) {
		e := entry{obj: object{uid: "u", hash: d2, stored: stored{recorded: d1, intent: i2, known: true}}, r: d1, i: i2}
		e.r, e.i = d2, intent{} // our record
		e.apply(object{uid: "u", hash: d2, selector: "a=b", stored: stored{recorded: d1, intent: i2, known: true}})
		assert.Equal(t, d2, e.r)
		assert.False(t, e.i.present())
	})
	t.Run("EventOfOurFirstIntentDoesNotUndoOurSecond", func(t *testing.T) {
		// The sweep wrote a second intent before the first one's event came.
		i2b := parseIntent(d2.text() + "/uid-1,uid-s")
		e := entry{obj: object{uid: "u", version: 8, hash: d2, selector: "a=b", stored: stored{recorded: d1, version: 8, known: true}}, r: d1, i: i2b, written: &stored{recorded: d1, intent: i2b, version: 10, known: true}}
		e.round, e.ourIntent = &round{hash: d2, selector: "a=b"}, i2b.text
		e.apply(object{uid: "u", version: 9, hash: d2, selector: "a=b", stored: stored{recorded: d1, intent: i2, version: 9, known: true}})
		assert.Equal(t, i2b.text, e.i.text)
		assert.False(t, e.ended)
		e.apply(object{uid: "u", version: 10, hash: d2, selector: "a=b", stored: stored{recorded: d1, intent: i2b, version: 10, known: true}})
		assert.Equal(t, i2b.text, e.i.text)
		assert.False(t, e.ended)
	})
	t.Run("OurIntentWipedKeepsTheRoundAndWritesItAgain", func(t *testing.T) {
		e := entry{obj: object{uid: "u", version: 9, hash: d2, selector: "a=b", stored: stored{recorded: d1, intent: i2, version: 9, known: true}}, r: d1, i: i2, written: &stored{version: 9}}
		e.round, e.ourIntent = &round{hash: d2, selector: "a=b", pods: []podRef{{uid: "uid-1"}}}, i2.text
		v := e.apply(object{uid: "u", version: 11, hash: d2, selector: "a=b", stored: stored{version: 11, known: true}}) // kubectl replace
		assert.Equal(t, verdictWiped, v)
		require.False(t, e.ended, "a replace with the same data ends no round")
		assert.True(t, e.needsIntent(e.round, true), "the intent is written again")
		assert.False(t, e.i.present())
		assert.Equal(t, d1, e.r, "R is what the pods ran before the round")
	})
	t.Run("OurOwnLateEventIsThePastOfOurRecord", func(t *testing.T) {
		e := entry{obj: object{uid: "u", version: 8, hash: d2, selector: "a=b", stored: stored{recorded: d1, version: 8, known: true}}, r: d1}
		e.wrote(9, stored{recorded: d1, intent: i2})
		e.r = d2
		e.wrote(10, stored{recorded: d2})
		e.apply(object{uid: "u", version: 9, hash: d2, selector: "a=b", stored: stored{recorded: d1, intent: i2, version: 9, known: true}})
		assert.Equal(t, stepNothing, e.decide(true), "no second record")
	})
	t.Run("OurWriteIsForgottenOnceItsEventIsApplied", func(t *testing.T) {
		// Every entry would otherwise carry a copy of R and I for good.
		e := entry{obj: object{uid: "u", version: 8, hash: d2, selector: "a=b", stored: stored{recorded: d1, version: 8, known: true}}, r: d1}
		e.wrote(9, stored{recorded: d1, intent: i2})
		e.r = d2
		e.wrote(10, stored{recorded: d2})
		require.NotNil(t, e.written)
		e.apply(object{uid: "u", version: 9, hash: d2, selector: "a=b", stored: stored{recorded: d1, intent: i2, version: 9, known: true}})
		assert.NotNil(t, e.written, "still ahead of the view")
		e.apply(object{uid: "u", version: 10, hash: d2, selector: "a=b", stored: stored{recorded: d2, version: 10, known: true}})
		assert.Nil(t, e.written)
		assert.Equal(t, d2, e.shown().recorded)
		e.wrote(10, stored{recorded: d2}) // its event came first
		assert.Nil(t, e.written)
		assert.Equal(t, stepNothing, e.decide(true))
	})
	t.Run("PeerRecordIsTaken", func(t *testing.T) {
		e := entry{obj: object{uid: "u", hash: d2, stored: stored{recorded: d1, known: true}}, r: d1}
		e.apply(object{uid: "u", hash: d2, stored: stored{recorded: d2, known: true}})
		assert.Equal(t, d2, e.r)
	})
	t.Run("IntentSeenWithOtherDataStaysOutdated", func(t *testing.T) {
		e := entry{obj: object{uid: "u", hash: d2, stored: stored{intent: i2, known: true}}, r: d1, i: i2}
		e.apply(object{uid: "u", hash: d1, stored: stored{intent: i2, known: true}})
		e.apply(object{uid: "u", hash: d2, stored: stored{intent: i2, known: true}})
		assert.Equal(t, stepRound, e.decide(true), "data back at the intent's digest does not resume it")
	})
	for _, tt := range []struct {
		name string
		cm   object
	}{
		{"RoundEndsOnOtherData", object{uid: "u", hash: d1, selector: "a=b", stored: stored{intent: i2, known: true}}},
		{"RoundEndsOnAnotherSelector", object{uid: "u", hash: d2, selector: "a=c", stored: stored{intent: i2, known: true}}},
		{"RoundEndsOnAPeersRecord", object{uid: "u", hash: d2, selector: "a=b", stored: stored{recorded: d2, known: true}}},
		{"RoundEndsOnAPeersIntent", object{uid: "u", hash: d2, selector: "a=b", stored: stored{intent: parseIntent(d2.text() + "/uid-9"), known: true}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := entry{obj: object{uid: "u", hash: d2, selector: "a=b", stored: stored{intent: i2, known: true}}, r: d1, i: i2}
			e.round, e.ourIntent = &round{hash: d2, selector: "a=b"}, i2.text
			e.apply(tt.cm)
			assert.True(t, e.ended)
			assert.NotNil(t, e.round, "the worker lets it go, not apply")
		})
	}
	t.Run("RoundGoesOnOnItsOwnEvents", func(t *testing.T) {
		e := entry{obj: object{uid: "u", hash: d2, selector: "a=b", stored: stored{recorded: d1, known: true}}, r: d1, i: i2}
		e.round, e.ourIntent = &round{hash: d2, selector: "a=b"}, i2.text
		e.apply(object{uid: "u", hash: d2, selector: "a=b", stored: stored{intent: i2, recorded: d1, known: true}})
		assert.False(t, e.ended)
	})
}

// replacingAPI makes the fake API behave like a ReplicaSet: each deleted
// pod is replaced by a new one with the same labels.
func replacingAPI(t *testing.T) *fakeAPI {
	api := newFakeAPI(t, webPods()...)
	api.afterDelete = func(p fakePod) {
		if !p.terminating {
			api.addPodLocked(p.name+"x", p.labels)
		}
	}
	return api
}

// assertEachDeletedOnce checks that no pod name was deleted twice.
func assertEachDeletedOnce(t *testing.T, api *fakeAPI) {
	t.Helper()
	api.mu.Lock()
	deleted := slices.Clone(api.removed)
	api.mu.Unlock()
	slices.Sort(deleted)
	assert.Equal(t, slices.Compact(slices.Clone(deleted)), deleted, "a pod deleted twice")
}

// webappPods lists the names of the pods app=webapp selects now.
func (f *fakeAPI) webappPods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for name, p := range f.pods {
		if p.labels["app"] == "webapp" && !p.terminating {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// TestRevertAfterACutShortRound ensures data set back to the recorded
// digest after a round was cut short (killed, or its record failed)
// restarts every selected pod: the replacements of the cut-short round run
// the other data.
func TestRevertAfterACutShortRound(t *testing.T) {
	t.Run("KilledMidRoundThenReverted", func(t *testing.T) {
		// A fresh controller finds v1 recorded, data v1 again, and the
		// intent of the v2 round that was killed after webapp-1 went.
		api := replacingAPI(t)
		api.pods["webapp-1x"] = &fakePod{name: "webapp-1x", uid: "uid-1x", labels: map[string]string{"app": "webapp"}, version: 50}
		delete(api.pods, "webapp-1")
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1,
			intent: hashOf(t, v2) + "/uid-1,uid-2,uid-3"})
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
		assert.ElementsMatch(t, []string{"webapp-1x", "webapp-2", "webapp-3"}, api.deletedPods(), "every pod, the v2 replacement included")
		assert.Equal(t, []string{hashOf(t, v1)}, api.recordedHashes())
		assert.Empty(t, api.intents()[len(api.intents())-1], "the record removes the intent")
	})
	t.Run("RecordFailsWhileReverted", func(t *testing.T) {
		api := replacingAPI(t)
		var failRecord atomic.Bool
		failRecord.Store(true)
		recordTried := make(chan struct{}, 100)
		api.fault = func(r request) (int, string, bool) {
			if r.method == http.MethodPatch && strings.Contains(r.body, RestartedForAnnotation) && failRecord.Load() {
				recordTried <- struct{}{}
				return 503, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`, true
			}
			return 0, "", false
		}
		c, _ := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		<-recordTried
		intentV2 := api.intents()[0]
		// Set back to v1 while the record is retried; the server holds the intent.
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1, intent: intentV2})
		failRecord.Store(false)
		settle(t, c)
		require.Eventually(t, func() bool { return slices.Contains(api.recordedHashes(), hashOf(t, v1)) }, waitFor, time.Millisecond)
		settle(t, c)
		assert.Equal(t, []string{"webapp-1xx", "webapp-2xx", "webapp-3xx"}, api.webappPods(), "every pod runs v1: restarted after the revert")
		assertEachDeletedOnce(t, api)
		recorded := api.recordedHashes()
		assert.Equal(t, hashOf(t, v1), recorded[len(recorded)-1], "v1 recorded last (the v2 attempts failed)")
	})
}

// TestToggledDataNeverReusesARound ensures a round or intent for data that
// was left and came back is not resumed: v2's round fails on one pod, data
// goes back to v1 (a round for v1 restarts everything), every pod is then
// replaced (a rollout restart), and v2 again restarts every pod.
func TestToggledDataNeverReusesARound(t *testing.T) {
	api := replacingAPI(t)
	var failing atomic.Bool
	failing.Store(true)
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/webapp-2") && failing.Load() {
			return 500, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","code":500}`, true
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultError) >= 1 }, waitFor, time.Millisecond)
	intentV2 := api.intents()[0]

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1, intent: intentV2})
	failing.Store(false)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)

	api.replaceAll() // kubectl rollout restart
	before := api.webappPods()
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, time.Millisecond)
	settle(t, c)
	for _, p := range before {
		assert.Contains(t, api.deletedPods(), p, "a pod of before the second v2 was kept")
	}
	assertEachDeletedOnce(t, api)
	assert.Equal(t, []string{hashOf(t, v1), hashOf(t, v2)}, api.recordedHashes())
}

// TestPeersRecordEndsOurRound ensures a round whose pods a peer (the new
// leader) restarted and recorded stops: nothing more is deleted and our
// own record is not written over the peer's.
func TestPeersRecordEndsOurRound(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	release := make(chan struct{})
	var once sync.Once
	var c *Controller
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			once.Do(func() {
				// Our intent, then the peer's record of the round it
				// finished while our first deletion hung.
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: api.intents()[0]})
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2})
				close(release)
			})
			<-release
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxConcurrentRestarts: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultUnchanged) >= 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"webapp-1"}, api.deletedPods())
	assert.Empty(t, api.recordedHashes())
}

// TestOwnIntentSeenBeforeItsAnswerKeepsTheRound ensures the event of our
// own intent write, arriving before the write's answer, does not stop the
// round as if someone else had written it (it would then be resumed, after
// one more LIST).
func TestOwnIntentSeenBeforeItsAnswerKeepsTheRound(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var c *Controller
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPatch && strings.Contains(r.body, RestartingAnnotation) && !strings.Contains(r.body, RestartedForAnnotation) {
			var patch struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.body), &patch))
			once.Do(func() {
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: patch.Metadata.Annotations[RestartingAnnotation]})
			})
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3)
	lists := slices.DeleteFunc(api.seen(http.MethodGet, "pods"), func(r request) bool { return r.query["continue"] != nil })
	assert.Len(t, lists, 1, "one LIST: the round was not stopped and resumed")
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
}

// TestTombstonesAreBounded ensures ConfigMaps created and deleted under
// ever new names (kustomize's configMapGenerator with prune) leave a
// bounded memory on a healthy watch.
func TestTombstonesAreBounded(t *testing.T) {
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{})
	for i := range 3 * maxTombstones {
		s := cmSpec{name: fmt.Sprintf("gen-%d", i), uid: fmt.Sprintf("u%d", i), selector: ptr("app=webapp"), data: v1}
		handle(t, c, watch.Added, s)
		handle(t, c, watch.Deleted, s)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.LessOrEqual(t, len(c.entries), maxTombstones)
	assert.LessOrEqual(t, len(c.tombstones), maxTombstones)
}

// TestHaltIsKeptOnTheObject ensures a round that halts marks its intent
// halted on the object, so that a controller that takes the round over
// (after a restart or a failover) is halted at once: a RolloutHalted Event
// that says since when, the gauge at 1 and nothing more restarted, without
// waiting PROGRESS_DEADLINE again; and that the fix's writes remove the
// mark.
func TestHaltIsKeptOnTheObject(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.replaceDeleted(func() bool { return false })
	rec1 := &fakeRecorder{}
	c1, _ := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 50 * time.Millisecond, Events: rec1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c1.Run(ctx); close(done) }()
	cm := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}
	handle(t, c1, watch.Modified, cm)
	require.Eventually(t, hasReason(rec1, "RolloutHalted"), waitFor, time.Millisecond)
	var mark string
	require.Eventually(t, func() bool {
		for _, a := range api.patchedAnnotations() {
			if v := a[HaltedAnnotation]; v != nil {
				mark = *v
			}
		}
		return mark != ""
	}, waitFor, time.Millisecond)
	assert.True(t, strings.HasPrefix(mark, hashOf(t, v2)+"@"), "the mark names the intent's digest: %s", mark)
	cancel() // the controller is restarted
	<-done

	rec2 := &fakeRecorder{}
	c2, m2 := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: time.Hour, Events: rec2})
	start(t, c2)
	cm.intent, cm.annotations = api.intents()[0], map[string]string{HaltedAnnotation: mark}
	handle(t, c2, watch.Modified, cm)
	require.Eventually(t, hasReason(rec2, "RolloutHalted"), waitFor, time.Millisecond)
	assert.Contains(t, eventText(rec2, "RolloutHalted"), "halted since")
	assert.Equal(t, 1.0, m2.RoundsHalted.Value())
	assert.Equal(t, []string{"web-1"}, api.deletedPods(), "nothing more restarted")

	api.replaceDeleted(func() bool { return true })
	patches := len(api.patchedAnnotations())
	handle(t, c2, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v3, intent: cm.intent, annotations: cm.annotations})
	require.Eventually(t, func() bool { return m2.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	for _, a := range api.patchedAnnotations()[patches:] {
		v, ok := a[HaltedAnnotation]
		assert.True(t, ok && v == nil, "a write of the fix that keeps the mark: %v", a)
	}
	assert.Equal(t, 0.0, m2.RoundsHalted.Value())
}

// TestThrottledEvictionIsRetriedAfterTheServersHint ensures an eviction
// answered 429 by API priority and fairness (no DisruptionBudget cause, a
// Retry-After) is not taken for a disruption budget's refusal: it is not
// counted blocked, the round is retried after the server's hint, and the pod
// is evicted then.
func TestThrottledEvictionIsRetriedAfterTheServersHint(t *testing.T) {
	api := newFakeAPI(t, podsOf("R")...)
	var throttled atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPost && strings.HasSuffix(r.path, "/eviction") && throttled.Add(1) == 1 {
			return 429, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}`, true
		}
		return 0, "", false
	}
	c, m, logs := loggedController(t, api.client(), Config{RecordHash: true, Strategy: StrategyEvict, MaxUnavailable: Budget{Percent: 100}})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.PodEvictions.Value("evicted") == 1 }, waitFor, time.Millisecond)
	assert.Zero(t, m.PodEvictions.Value("blocked"), "throttling is no disruption budget")
	assert.Equal(t, uint64(1), m.PodEvictions.Value("error"))
	assert.Contains(t, logs.String(), "priority and fairness")
	assert.Contains(t, logs.String(), "retry_in=1s", "the server's hint")
}

// TestConflictWithoutAReplacementIsRetried ensures a 409 on the intent's
// PATCH that no replacement of the ConfigMap explains (an admission
// webhook's answer) is retried with backoff, visibly (a RestartFailed
// Event), and the round then restarts the pods: only an event showing the
// object replaced or deleted supersedes a round.
func TestConflictWithoutAReplacementIsRetried(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var refused atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if isIntentWrite(r) && refused.Add(1) == 1 {
			return 409, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"admission webhook \"quota.example.com\" denied the request: try again","reason":"Conflict","code":409}`, true
		}
		return 0, "", false
	}
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())
	assert.Contains(t, eventText(rec, "RestartFailed"), "no event shows it replaced or deleted")
	assert.GreaterOrEqual(t, m.Reconciles.Value(resultError), uint64(1))
}

// TestCreatedAgainInAStormCarriesAnIntentWithoutARecord ensures a ConfigMap
// created again while a storm holds its round back gets the tombstone's
// intent written on it even where the tombstone holds no record (every
// round since its last adoption cut short): a successor that finds the
// intent restarts every pod for the new data, where one that finds nothing
// adopts it and leaves the pods on older data for good (the simulator's
// seed 2052). No empty record is written beside it.
func TestCreatedAgainInAStormCarriesAnIntentWithoutARecord(t *testing.T) {
	d1, d2, d3 := digest{sum: [32]byte{1}}, digest{sum: [32]byte{2}}, digest{sum: [32]byte{3}}
	intentFor := func(h digest) intent { return parseIntent(h.text() + "/uid-1") }
	tests := []struct {
		name string
		e    entry
	}{
		{"IntentOnly", entry{obj: object{kind: kindConfigMap, hash: d3, stored: stored{known: true, version: 7}}, i: intentFor(d2)}},
		{"RecordAndIntent", entry{obj: object{kind: kindConfigMap, hash: d3, stored: stored{known: true, version: 7}}, r: d1, i: intentFor(d2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			carry := tt.e.toCarry(true)
			require.NotNil(t, carry, "the tombstone's state is carried to the new object")
			a := stateWrite{carry: carry}.annotations(tt.e.obj.hash, "", false)
			assert.Equal(t, tt.e.i.text, a[RestartingAnnotation])
			if tt.e.r.isZero() {
				assert.Nil(t, a[RestartedForAnnotation], "no record to carry: none written")
			}

			// A successor sees the new object as the carry leaves it.
			st := stateWrite{carry: carry}.after(tt.e.obj.stored, tt.e.obj.hash, "")
			next := entry{obj: object{kind: kindConfigMap, hash: d3, stored: st}, r: st.recorded, i: st.intent}
			assert.Equal(t, stepRound, next.decide(true), "its pods are mixed: every one restarts")
		})
	}
	none := entry{obj: object{kind: kindConfigMap, hash: d3, stored: stored{known: true, version: 7}}}
	assert.Nil(t, none.toCarry(true), "nothing to carry: the new object is adopted")
}
