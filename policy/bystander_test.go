package policy

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// The tests of this file each replay one sequence in which a round once
// restarted a pod it must not have, restarted one twice, dropped a change,
// or wrote more than it needed to.

// removedPods returns the pods the fake API deleted, sorted.
func (f *fakeAPI) removedPods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(slices.Values(f.removed))
}

// patchRV returns the resourceVersion the i-th ConfigMap patch answered.
func (f *fakeAPI) patchRV(i int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strconv.FormatUint(f.patchRVs[i], 10)
}

// isIntentWrite: a patch of I alone (a record removes I too).
func isIntentWrite(r request) bool {
	return r.method == http.MethodPatch && strings.Contains(r.body, RestartingAnnotation) && !strings.Contains(r.body, RestartedForAnnotation)
}

// TestRelabelledPodIsNeverRestartedOnARetry ensures a pod relabelled out of
// the selector while its restart is retried is left alone, on every path:
// each DELETE and eviction carries the uid and resourceVersion of the pod as
// selected, and a refused one re-reads the pod before it tries again.
func TestRelabelledPodIsNeverRestartedOnARetry(t *testing.T) {
	const internal = `{"kind":"Status","code":500,"reason":"InternalError","message":"etcdserver: request timed out"}`
	const budget = `{"kind":"Status","code":429,"reason":"TooManyRequests","message":"Cannot evict pod as it would violate the pod's disruption budget."}`
	for _, tt := range []struct {
		name     string
		cfg      Config
		index    bool
		code     int
		answer   string
		outcomes func(m *Metrics) *uint64
	}{
		{name: "DeleteFromAListRetriedAfter500", cfg: Config{}, code: 500, answer: internal},
		{name: "DeleteFromTheIndexRetriedAfter500", cfg: Config{}, index: true, code: 500, answer: internal},
		{name: "EvictionRetriedWhileABudgetRefuses", cfg: Config{Strategy: StrategyEvict}, code: 429, answer: budget},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pods := webPods()
			api := newFakeAPI(t, pods...)
			var once sync.Once
			api.fault = func(r request) (int, string, bool) {
				if strings.Contains(r.path, "/pods/webapp-2") && r.method != http.MethodGet {
					refused := false
					once.Do(func() {
						api.relabel("webapp-2", map[string]string{"app": "quarantine"})
						refused = true
					})
					if refused {
						return tt.code, tt.answer, true
					}
				}
				return 0, "", false
			}
			cfg := tt.cfg
			cfg.RecordHash = true
			if tt.index {
				cfg = withIndex(cfg, indexOf(t, pods...))
			}
			c, m := newTestController(t, api.client(), cfg)
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			settle(t, c)
			assert.Equal(t, []string{"webapp-1", "webapp-3"}, api.removedPods(), "the relabelled pod was restarted")
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
		})
	}
}

// TestRefusedIntentIsRetriedVisibly ensures a write of I that the server
// refuses with 422 or 403 (an admission policy, the annotation size limit)
// is neither dropped nor silent: a Warning Event says what refused it, the
// round is retried, and each pod is restarted once when the write passes.
// An intent too large for the annotations falls back to the form that
// names no pods.
func TestRefusedIntentIsRetriedVisibly(t *testing.T) {
	const vap = `configmaps \"webapp-config\" is forbidden: ValidatingAdmissionPolicy 'freeze' with binding 'freeze' denied request: config-watcher may not annotate`
	for _, tt := range []struct {
		name       string
		code       int
		answer     string
		refuses    func(r request) bool
		wantCoarse bool
		wantReason string
	}{
		{
			name:       "AdmissionPolicy422",
			code:       422,
			answer:     `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"` + vap + `","reason":"Invalid","details":{"name":"webapp-config","kind":"configmaps"},"code":422}`,
			wantReason: "WriteRefused",
		},
		{
			name:       "AdmissionPolicy403",
			code:       403,
			answer:     `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"` + vap + `","reason":"Forbidden","details":{"name":"webapp-config","kind":"configmaps"},"code":403}`,
			wantReason: "WriteRefused",
		},
		{
			name:       "AnnotationsTooLong",
			code:       422,
			answer:     `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"ConfigMap \"webapp-config\" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes","reason":"Invalid","details":{"name":"webapp-config","kind":"ConfigMap","causes":[{"reason":"FieldValueTooLong","message":"Too long: may not be more than 262144 bytes","field":"metadata.annotations"}]},"code":422}`,
			refuses:    func(r request) bool { return !strings.Contains(r.body, `/*"`) },
			wantCoarse: true,
			wantReason: "IntentTooLarge",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			var refusals atomic.Int32
			api.fault = func(r request) (int, string, bool) {
				if !isIntentWrite(r) || !strings.Contains(r.body, "sha256:") {
					return 0, "", false
				}
				if (tt.refuses != nil && tt.refuses(r)) || (tt.refuses == nil && refusals.Add(1) <= 3) {
					return tt.code, tt.answer, true
				}
				return 0, "", false
			}
			rec := &fakeRecorder{}
			c, m := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			settle(t, c)
			assert.Equal(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.removedPods())
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
			assert.Contains(t, rec.reasons(), "ConfigMap/"+tt.wantReason)
			intents := api.intents()
			require.NotEmpty(t, intents)
			if tt.wantCoarse {
				assert.Equal(t, hashOf(t, v2)+"/*", intents[len(intents)-2], "the coarse intent")
			}
			for _, e := range rec.all() {
				if e.reason == tt.wantReason {
					assert.Equal(t, "Warning", e.typ)
				}
			}
		})
	}
}

// TestReplaceMidRoundRestartsNoReplacement ensures an object replaced with
// the same data during a round (kubectl replace, a GitOps tool: R and I
// are gone) does not end the round: it writes I again and goes on, and no
// replacement the round caused is restarted.
func TestReplaceMidRoundRestartsNoReplacement(t *testing.T) {
	api := replacingAPI(t)
	var c *Controller
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			once.Do(func() {
				// The round's intent comes back, then the replace wipes it.
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: api.intents()[0], rv: api.patchRV(0)})
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2})
			})
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxConcurrentRestarts: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.removedPods(), "a replacement was restarted")
	intents := api.intents()
	require.Len(t, intents, 3, "I, I again after the wipe, removed with R")
	assert.Equal(t, intents[0], intents[1])
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
}

// TestDeleteWithLostAnswerCountsAsRestarted ensures a DELETE that took
// effect although its answer was lost (a 504 from the ambassador) counts as
// a restart once the index shows the pod terminating: the retry's 409 is
// not a refusal. Its termination bounds nothing (nothing tells it from
// someone else's before the change, which a view behind shows late: see
// TestMembershipBoundTakesNoTerminationItCannotTellOurs), so the sweep
// takes the replacement: a restart too many, never a pod left.
func TestDeleteWithLostAnswerCountsAsRestarted(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	pods := []*fakePod{{name: "webapp-1", uid: "uid-1", labels: web}}
	api := newFakeAPI(t, pods...)
	x := indexOf(t, pods...)
	api.graceful = true
	api.afterDelete = func(p fakePod) { // as the index's watch shows it
		x.Handle(podEvent(t, watch.Modified, p))
		x.Handle(podEvent(t, watch.Added, api.addPodLocked(p.name+"x", p.labels)))
	}
	var lost atomic.Bool
	api.lose = func(r request) bool { return r.method == http.MethodDelete && lost.CompareAndSwap(false, true) }
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"webapp-1", "webapp-1x"}, api.removedPods(), "webapp-1 deleted once, and its replacement")
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
}

// TestStandbyQueuesNothing ensures a replica that does not lead keeps no
// work queued, however many ConfigMaps come and go (generated names), and
// that on taking the lease it acts on what changed meanwhile.
func TestStandbyQueuesNothing(t *testing.T) {
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	for i := range 2000 {
		s := cmSpec{name: fmt.Sprintf("gen-%d", i), uid: fmt.Sprintf("u%d", i), selector: ptr("app=webapp"), data: v1}
		handle(t, c, watch.Added, s)
		handle(t, c, watch.Deleted, s)
	}
	assert.Zero(t, c.queue.Len(), "keys queued on a standby")
}

// TestIntentForDataNoLongerCurrentIsRemoved ensures data set back (v1 → v2
// → v1) while the v2 round writes its intent restarts nothing: the round
// finds itself superseded after the write and removes the intent, and the
// intent's own late event is the past of that removal.
func TestIntentForDataNoLongerCurrentIsRemoved(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var c *Controller
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if isIntentWrite(r) {
			once.Do(func() {
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			})
		}
		return 0, "", false
	}
	c, _ = newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.intents()) > 0 }, waitFor, time.Millisecond)
	settle(t, c)
	intentV2 := api.intents()[0]
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1, intent: intentV2, rv: api.patchRV(0)})
	settle(t, c)
	assert.Empty(t, api.deletedPods(), "no pod ever ran v2")
	assert.Equal(t, []string{intentV2, ""}, api.intents(), "the superseded intent is removed")
	assert.Empty(t, api.recordedHashes())
}

// TestOwnLateIntentEventWritesNoSecondRecord ensures the round's own intent
// event, arriving after its record was written (normal for short rounds),
// is taken as the past of that record: R is written once.
func TestOwnLateIntentEventWritesNoSecondRecord(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: api.intents()[0], rv: api.patchRV(0)})
	settle(t, c)
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
}
