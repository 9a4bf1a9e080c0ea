package policy

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestMaxConcurrentRestartsPaces ensures MAX_CONCURRENT_RESTARTS=1 restarts
// one pod after the other, so a pod that cannot be restarted holds the
// ones after it, while the default restarts them all at once.
func TestMaxConcurrentRestartsPaces(t *testing.T) {
	for _, tt := range []struct {
		name        string
		limit       int
		wantWebapp3 bool
	}{
		{"OneAtATimeStopsAtFailure", 1, false},
		{"UnlimitedRestartsTheOthers", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			api.fault = func(r request) (int, string, bool) {
				if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/webapp-2") {
					return 403, `{"kind":"Status","code":403,"reason":"Forbidden"}`, true
				}
				return 0, "", false
			}
			c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxConcurrentRestarts: tt.limit})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultError) >= 2 }, waitFor, time.Millisecond)
			assert.Equal(t, tt.wantWebapp3, strings.Contains(strings.Join(api.deletedPods(), ","), "webapp-3"))
			assert.Empty(t, api.recordedHashes())
		})
	}
}

// pdbRefusal is kube-apiserver's answer to an eviction a PodDisruptionBudget
// does not allow now: 429 with the cause DisruptionBudget.
const pdbRefusal = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Cannot evict pod as it would violate the pod's disruption budget.","reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget","message":"The disruption budget webapp needs 3 healthy pods and has 3 currently"}]},"code":429}`

// TestEvictStrategy ensures RESTART_STRATEGY=evict posts Evictions (never
// DELETE) and tries one a disruption budget refuses with 429 again in the
// next wave, halting the round (not recording it) while the budget refuses
// for longer than PROGRESS_DEADLINE.
func TestEvictStrategy(t *testing.T) {
	for _, tt := range []struct {
		name       string
		refusals   int32 // 429s for webapp-2
		wantResult map[string]uint64
	}{
		{"EvictsEachPod", 0, map[string]uint64{"evicted": 3}},
		{"RetriesWhileBudgetRefuses", 3, map[string]uint64{"evicted": 3, "blocked": 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			var refused atomic.Int32
			api.fault = func(r request) (int, string, bool) {
				if r.method == http.MethodPost && strings.Contains(r.path, "/webapp-2/") && refused.Add(1) <= tt.refusals {
					return 429, pdbRefusal, true
				}
				return 0, "", false
			}
			c, m := newTestController(t, api.client(), Config{RecordHash: true, Strategy: StrategyEvict, ProgressDeadline: 50 * time.Millisecond})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			assert.Empty(t, api.deletedPods(), "evict never deletes")
			for result, want := range tt.wantResult {
				assert.Equal(t, want, m.PodEvictions.Value(result), result)
			}
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes(), "the round completes")
		})
	}
}

// TestEvictionRefusedPastTheDeadlineHalts ensures a pod a disruption budget
// keeps from being evicted halts the round after PROGRESS_DEADLINE: a
// Warning Event that names the pod, the gauge at 1, the intent kept and
// nothing recorded; once the budget allows it, the round goes on by itself
// and completes.
func TestEvictionRefusedPastTheDeadlineHalts(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var refuse atomic.Bool
	refuse.Store(true)
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPost && strings.Contains(r.path, "/webapp-2/") && refuse.Load() {
			return 429, pdbRefusal, true
		}
		return 0, "", false
	}
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Strategy: StrategyEvict, ProgressDeadline: 50 * time.Millisecond, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return slices.Contains(rec.reasons(), "ConfigMap/RolloutHalted") }, waitFor, time.Millisecond)
	assert.Equal(t, 1.0, m.RoundsHalted.Value())
	assert.Equal(t, uint64(2), m.PodEvictions.Value("evicted"))
	assert.Empty(t, api.recordedHashes(), "a halted round records nothing")
	assert.Len(t, api.intents(), 1, "the intent stays")
	for _, e := range rec.all() {
		if e.reason == "RolloutHalted" {
			assert.Equal(t, events.Warning, e.typ)
			assert.Contains(t, e.message, "Halted after 2 of 3 pods: the eviction of pod webapp-2 refused by a disruption budget for 50ms")
		}
	}

	refuse.Store(false)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
	assert.Contains(t, rec.reasons(), "ConfigMap/RolloutResumed")
	assert.Equal(t, 0.0, m.RoundsHalted.Value())
}

// TestDryRun ensures DRY_RUN sends every restart with dryRun=All (so the
// server checks RBAC and preconditions), deletes nothing, records nothing,
// and still does not repeat itself for the same data.
func TestDryRun(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, DryRun: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, labels: map[string]string{"a": "b"}})
	settle(t, c)
	require.Len(t, api.seen(http.MethodDelete, "pods"), 3)
	for _, r := range api.seen(http.MethodDelete, "pods") {
		assert.Contains(t, r.body, `"dryRun":["All"]`)
	}
	assert.Len(t, api.pods, 5, "no pod deleted")
	assert.Empty(t, api.seen(http.MethodPatch, "configmaps"), "nothing recorded")
	assert.Equal(t, uint64(3), m.PodDeletions.Value("dry_run"))
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
}

// emittedEvent is an Event the controller asked for.
type emittedEvent struct{ kind, name, typ, reason, message string }

type fakeRecorder struct {
	mu     sync.Mutex
	events []emittedEvent
}

var _ EventRecorder = (*fakeRecorder)(nil)

func (f *fakeRecorder) Event(obj events.Object, typ, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, emittedEvent{obj.Kind, obj.Name, typ, reason, message})
}

func (f *fakeRecorder) all() []emittedEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]emittedEvent(nil), f.events...)
}

func (f *fakeRecorder) reasons() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.events {
		out = append(out, e.kind+"/"+e.reason)
	}
	return out
}

// TestEventsTellTheStory ensures a round, a refused selector and a failed
// round each leave an Event on the ConfigMap, and that no Event carries a
// data value.
func TestEventsTellTheStory(t *testing.T) {
	secret := map[string]string{"password": "hunter2-top-secret"}
	for _, tt := range []struct {
		name     string
		selector string
		fail     bool
		want     []string
	}{
		{"PodsRestarted", "app=webapp", false, []string{"ConfigMap/PodsRestarted"}},
		{"InvalidSelector", "!app", false, []string{"ConfigMap/InvalidSelector"}},
		{"OnlyExistenceIsAnInvalidSelector", "app", false, []string{"ConfigMap/InvalidSelector"}},
		{"SystemKeyIsAnInvalidSelector", "pod-template-hash", false, []string{"ConfigMap/InvalidSelector"}},
		{"RestartFailed", "app=webapp", true, []string{"ConfigMap/RestartFailed"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			if tt.fail {
				api.fault = func(r request) (int, string, bool) {
					if r.method == http.MethodDelete {
						return 500, `{"kind":"Status","code":500,"reason":"InternalError"}`, true
					}
					return 0, "", false
				}
			}
			rec := &fakeRecorder{}
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr(tt.selector), recorded: hashOf(t, v1), data: secret})
			require.Eventually(t, func() bool { return len(rec.reasons()) > 0 }, waitFor, time.Millisecond)
			assert.Equal(t, tt.want, rec.reasons()[:1])
			for _, e := range rec.all() {
				assert.Equal(t, "webapp-config", e.name)
				assert.NotContains(t, e.message, "hunter2", "an Event carries a data value")
			}

		})
	}
}

// TestInterruptedRoundResumes ensures a round records the pods it began
// with, and a controller that finds such a record for the current data (it
// was killed mid-round) restarts only those pods, not the replacements
// created since, and clears the record when the round is done.
func TestInterruptedRoundResumes(t *testing.T) {
	t.Run("RoundRecordsItsPodsAndClearsThem", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
		require.Len(t, api.intents(), 2)
		assert.Equal(t, hashOf(t, v2)+"/uid-1,uid-2,uid-3", api.intents()[0])
		assert.Equal(t, "", api.intents()[1], "the record of the round is removed with the final record")
	})
	t.Run("IntentIsWrittenBeforeTheFirstDeletion", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		calls := &callOrder{API: api.client()}
		c, m := newTestController(t, calls, Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
		assert.Equal(t, []string{"PATCH", "DELETE"}, calls.first(2, http.MethodGet), "after the list: the intent, then the deletions")
	})
	t.Run("NoDeletionWhenTheIntentCannotBeWrittenAndRetriesKeepTheirPods", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		var failing atomic.Bool
		failing.Store(true)
		api.fault = func(r request) (int, string, bool) {
			if r.method == http.MethodPatch && failing.Load() {
				return 503, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`, true
			}
			return 0, "", false
		}
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultError) >= 2 }, waitFor, time.Millisecond)
		assert.Empty(t, api.deletedPods(), "no deletion without the intent")
		api.addPod("created-meanwhile", map[string]string{"app": "webapp"}) // after the change: new data
		failing.Store(false)
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
		assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods(), "the retry keeps the pods the round began with")
	})
	t.Run("ResumeSkipsReplacements", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...) // webapp-2 stands for a replacement: not in the record
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2,
			intent: hashOf(t, v2) + "/uid-1,uid-3,uid-gone"})
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
		assert.ElementsMatch(t, []string{"webapp-1", "webapp-3"}, api.deletedPods())
		assert.Equal(t, []string{""}, api.intents(), "no new record of the round; the old one is cleared")
	})
	t.Run("RecordForOtherDataIsIgnored", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2,
			intent: hashOf(t, v1) + "/uid-1"})
		require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
		assert.Len(t, api.deletedPods(), 3, "a record of an older round says nothing about this one")
	})
}

// callOrder is an API that remembers the order in which calls began.
type callOrder struct {
	API
	mu    sync.Mutex
	calls []string
}

func (o *callOrder) began(method string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, method)
}

// first returns the first n calls, leaving out those of method skip.
func (o *callOrder) first(n int, skip string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	calls := slices.DeleteFunc(slices.Clone(o.calls), func(m string) bool { return m == skip })
	return calls[:min(n, len(calls))]
}

func (o *callOrder) GetBody(ctx context.Context, path string, q url.Values, accept string) (io.ReadCloser, error) {
	o.began(http.MethodGet)
	return o.API.GetBody(ctx, path, q, accept)
}

func (o *callOrder) Delete(ctx context.Context, path string, body []byte) ([]byte, error) {
	o.began(http.MethodDelete)
	return o.API.Delete(ctx, path, body)
}

func (o *callOrder) MergePatch(ctx context.Context, path string, patch []byte) ([]byte, error) {
	o.began(http.MethodPatch)
	return o.API.MergePatch(ctx, path, patch)
}
