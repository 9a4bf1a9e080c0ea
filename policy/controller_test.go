package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

func fastBackOff() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

// waitFor bounds every wait for a condition. It is a safety net, never a
// measure: under -race with many runs on a busy 2-core machine a 100 KB
// selector alone takes seconds to parse, and a tight bound fails the test
// for the machine's load, not for a defect.
const waitFor = 60 * time.Second

// start runs c's workers until the test ends.
func start(t *testing.T, c *Controller) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Under c.mu: Lead queues the keys that need action under the same
	// hold that makes the queue active, so settle cannot find it idle
	// before they are queued.
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.queue.active()
	}, waitFor, time.Millisecond)
}

// settle waits until every queued ConfigMap has been reconciled.
func settle(t *testing.T, c *Controller) {
	t.Helper()
	require.Eventually(t, c.queue.idle, waitFor, time.Millisecond)
}

func webPods() []*fakePod {
	web := map[string]string{"app": "webapp"}
	return []*fakePod{
		{name: "webapp-1", uid: "uid-1", labels: web},
		{name: "webapp-2", uid: "uid-2", labels: web},
		{name: "webapp-3", uid: "uid-3", labels: web},
		{name: "old", uid: "uid-4", labels: web, terminating: true},
		{name: "db-1", uid: "uid-5", labels: map[string]string{"app": "db"}},
	}
}

var (
	v1 = map[string]string{"message": "Hello"}
	v2 = map[string]string{"message": "Hello again"}
)

// TestDataChangeDeletesEachPodOnce ensures a data change deletes every
// matching, non-terminating pod exactly once, each with its uid and
// resourceVersion as listed as preconditions, across list pages, and
// records the new digest afterwards.
func TestDataChangeDeletesEachPodOnce(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)

	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())
	for _, r := range api.seen(http.MethodDelete, "pods") {
		n := r.path[strings.LastIndexByte(r.path, '/')+len("/webapp-"):]
		assert.JSONEq(t, `{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"uid-`+n+`","resourceVersion":"1`+n+`"}}`, r.body)
	}
	assert.Len(t, api.seen(http.MethodGet, "pods"), 3, "the namespace's five pods at two per page")
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
	assert.Equal(t, uint64(3), m.PodDeletions.Value("deleted"))

	var patch map[string]map[string]any
	patches := api.seen(http.MethodPatch, "configmaps")
	require.NoError(t, json.Unmarshal([]byte(patches[len(patches)-1].body), &patch))
	assert.Equal(t, "cm-uid-1", patch["metadata"]["uid"], "the record is guarded by the ConfigMap's uid")
}

// TestNoActionWithoutDataChange ensures edits that leave data and
// binaryData alone, and repeated sightings, send no request at all.
func TestNoActionWithoutDataChange(t *testing.T) {
	base := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1}
	tests := []struct {
		name string
		typ  watch.EventType
		edit func(s *cmSpec)
	}{
		{"LabelEdit", watch.Modified, func(s *cmSpec) { s.labels = map[string]string{"team": "a"} }},
		{"AnnotationEdit", watch.Modified, func(s *cmSpec) { s.annotations = map[string]string{"note": "x"} }},
		{"SelectorEdit", watch.Modified, func(s *cmSpec) { s.selector = ptr("app=webapp,tier") }},
		{"Relist", watch.Synced, func(s *cmSpec) {}},
		{"ResyncAsModified", watch.Modified, func(s *cmSpec) {}},
		{"SameDataOtherKeyOrder", watch.Modified, func(s *cmSpec) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, _ := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			s := base
			tt.edit(&s)
			handle(t, c, tt.typ, s)
			settle(t, c)
			assert.Empty(t, api.requests)
		})
	}
}

// TestHashIgnoresKeyOrderAndEscaping ensures the digest depends on content
// only, and that different content, including moving a key between data and
// binaryData, always changes it.
func TestHashIgnoresKeyOrderAndEscaping(t *testing.T) {
	digest := func(raw string) string {
		cm, err := parseObject([]byte(raw), kindConfigMap, DefaultSelectorAnnotation, nil)
		require.NoError(t, err)
		return cm.hash.text()
	}
	const meta = `"metadata":{"name":"c","namespace":"ns"}`
	same := []string{
		`{` + meta + `,"data":{"a":"1","b":"<x>"}}`,
		`{"data":{"b":"\u003cx\u003e","a":"1"},` + meta + `}`,
	}
	assert.Equal(t, digest(same[0]), digest(same[1]))
	assert.Equal(t, digest(`{`+meta+`}`), digest(`{`+meta+`,"data":{},"binaryData":null}`), "absent, empty and null sections are the same")

	different := []string{
		`{` + meta + `,"data":{"a":"1"}}`,
		`{` + meta + `,"data":{"a":"2"}}`,
		`{` + meta + `,"data":{"a":"1","b":""}}`,
		`{` + meta + `,"data":{"ab":""}}`,
		`{` + meta + `,"data":{"a":"b"}}`,
		`{` + meta + `,"binaryData":{"a":"1"}}`,
		`{` + meta + `,"data":{"a":1}}`,
		`{` + meta + `,"data":"a"}`,
		`{` + meta + `}`,
	}
	seen := map[string]string{}
	for _, raw := range different {
		d := digest(raw)
		require.NotContains(t, seen, d, "%s hashes like %s", raw, seen[d])
		seen[d] = raw
	}
}

// TestAdoption ensures a ConfigMap seen for the first time without a record
// restarts nothing and gets its digest recorded, and that a re-created
// ConfigMap is judged against the data the pods were restarted for.
func TestAdoption(t *testing.T) {
	tests := []struct {
		name        string
		events      func(t *testing.T, c *Controller)
		wantDeletes int
		wantRecords []string
	}{
		{"FirstSightAdopts", func(t *testing.T, c *Controller) {
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v1})
		}, 0, []string{hashOf(t, v1)}},
		{"RecreatedWithOtherDataIsAChange", func(t *testing.T, c *Controller) {
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			handle(t, c, watch.Deleted, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2})
		}, 3, []string{hashOf(t, v2)}},
		{"RecreatedWithSameDataRestartsNothing", func(t *testing.T, c *Controller) {
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			handle(t, c, watch.Deleted, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v1})
		}, 0, []string{hashOf(t, v1)}},
		{"SelectorAddedLaterAdopts", func(t *testing.T, c *Controller) {
			handle(t, c, watch.Synced, cmSpec{data: v1})
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2})
		}, 0, []string{hashOf(t, v2)}},
		{"NotAnnotatedIsIgnored", func(t *testing.T, c *Controller) {
			handle(t, c, watch.Synced, cmSpec{data: v1})
			handle(t, c, watch.Modified, cmSpec{data: v2})
		}, 0, nil},
		{"RemovedRecordIsRestored", func(t *testing.T, c *Controller) {
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v1})
		}, 0, []string{hashOf(t, v1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			// With the pod index, which tells that no pod was created while
			// an object was gone (startedWhileGone).
			c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, mirror(t, api, nil)))
			start(t, c)
			tt.events(t, c)
			settle(t, c)
			assert.Len(t, api.deletedPods(), tt.wantDeletes)
			assert.Equal(t, tt.wantRecords, api.recordedHashes())
		})
	}
}

// TestControllerRestart ensures a fresh controller (as after a restart)
// acts once on a change made while it was away and not at all otherwise.
func TestControllerRestart(t *testing.T) {
	tests := []struct {
		name        string
		recorded    map[string]string
		wantDeletes int
	}{
		{"ChangedWhileDownActsOnce", v1, 3},
		{"UnchangedDoesNothing", v2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, _ := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			all := c.ForConfigMaps("")
			all.BeginList()
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, tt.recorded), data: v2})
			all.EndList()
			settle(t, c)
			assert.Len(t, api.deletedPods(), tt.wantDeletes)
		})
	}
}

// TestInvalidSelectorsDeleteNothing ensures each class of bad selector is
// refused before any request, counted, and leaves the change pending so a
// fixed selector still restarts the pods.
func TestInvalidSelectorsDeleteNothing(t *testing.T) {
	for _, tt := range []struct{ name, selector string }{
		{"Empty", ""},
		{"Blank", "   "},
		{"SyntaxError", "app in ("},
		{"OnlyNotExists", "!app"},
		{"OnlyNotEquals", "app!=db"},
		{"OnlyNotIn", "app notin (db)"},
		{"QueryInjection", "app=webapp&labelSelector="},
		{"NonASCII", "app=wébapp"},
		{"OverlongValue", "app=" + strings.Repeat("x", 64)},
		{"OnlyExistence", "app"},
		{"EveryDeploymentPod", "pod-template-hash"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, m := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr(tt.selector), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			assert.Empty(t, api.requests, "no request is made for a refused selector")
			assert.Equal(t, uint64(1), m.InvalidSelectors.Value())
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultRefused))

			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			assert.Len(t, api.deletedPods(), 3, "the fixed selector acts on the pending change")
		})
	}
}

// TestDeleteAnswers ensures each API answer to a DELETE leads to the right
// outcome: gone pods count as done, a failed precondition re-reads the pod
// and retries it while it is still selected, RBAC and server errors fail
// the round, which is retried without deleting any pod twice and without
// recording the digest before it succeeds.
func TestDeleteAnswers(t *testing.T) {
	tests := []struct {
		name        string
		status      int
		body        string
		times       int // how many DELETEs of webapp-2 get the answer
		wantDeletes []string
		wantRecords int
		wantResult  string
	}{
		{"NotFoundIsDone", 404, `{"kind":"Status","code":404,"reason":"NotFound"}`, 1, []string{"webapp-1", "webapp-2", "webapp-3"}, 1, resultRestarted},
		{"ConflictReReadsAndRetries", 409, `{"kind":"Status","code":409,"reason":"Conflict"}`, 1, []string{"webapp-1", "webapp-2", "webapp-2", "webapp-3"}, 1, resultRestarted},
		{"ServerErrorRetriesOnlyThatPod", 500, `{"kind":"Status","code":500,"reason":"InternalError"}`, 2, []string{"webapp-1", "webapp-2", "webapp-2", "webapp-2", "webapp-3"}, 1, resultRestarted},
		{"TooManyRequestsRetried", 429, `{"kind":"Status","code":429,"reason":"TooManyRequests"}`, 1, []string{"webapp-1", "webapp-2", "webapp-2", "webapp-3"}, 1, resultRestarted},
		{"ForbiddenFailsAndRecordsNothing", 403, `{"kind":"Status","code":403,"reason":"Forbidden","message":"pods \"webapp-2\" is forbidden"}`, 1 << 30, nil, 0, resultError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			var mu sync.Mutex
			left := tt.times
			api.fault = func(r request) (int, string, bool) {
				mu.Lock()
				defer mu.Unlock()
				if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/webapp-2") && left > 0 {
					left--
					return tt.status, tt.body, true
				}
				return 0, "", false
			}
			c, m := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(tt.wantResult) >= 1 }, waitFor, time.Millisecond)
			settle(t, c)
			if tt.wantDeletes != nil {
				assert.ElementsMatch(t, tt.wantDeletes, api.deletedPods())
			} else {
				counts := map[string]int{}
				for _, p := range api.deletedPods() {
					counts[p]++
				}
				assert.Equal(t, 1, counts["webapp-1"], "the other pods are restarted once")
				assert.Equal(t, 1, counts["webapp-3"], "the other pods are restarted once")
				assert.GreaterOrEqual(t, counts["webapp-2"], 1)
			}
			assert.Len(t, api.recordedHashes(), tt.wantRecords)
		})
	}
}

// TestRetryDoesNotDeleteReplacements ensures a retried round deletes only
// pods that existed when it began: replacements created meanwhile already
// run with the new data.
func TestRetryDoesNotDeleteReplacements(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	failed := false
	var mu sync.Mutex
	api.fault = func(r request) (int, string, bool) {
		mu.Lock()
		defer mu.Unlock()
		if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/webapp-2") && !failed {
			failed = true
			api.addPod("webapp-1b", map[string]string{"app": "webapp"}) // webapp-1's replacement
			return 500, `{"kind":"Status","code":500}`, true
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-2", "webapp-3"}, api.deletedPods(), "the retry's list shows webapp-1b, which it does not take")
}

// TestBurstCoalesces ensures many changes of one ConfigMap during a round
// stop that round at its next restart and lead to one more round, for the
// latest data, not one round per event; no pod is deleted twice.
func TestBurstCoalesces(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var deletes atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete && deletes.Add(1) == 1 {
			<-release // hold the first round
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Workers: 4, MaxConcurrentRestarts: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return deletes.Load() >= 1 }, waitFor, time.Millisecond)
	var last map[string]string
	for i := range 50 {
		last = map[string]string{"message": strings.Repeat("x", i)}
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: last})
	}
	releaseOnce.Do(func() { close(release) })
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
	assert.Equal(t, []string{hashOf(t, last)}, api.recordedHashes())
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods(), "each pod once")
}

// TestStaleEventAfterRecordDoesNothing ensures an event older than our own
// record (it still carries the previous digest) does not start a second
// round for a change already handled.
func TestStaleEventAfterRecordDoesNothing(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	// A label edit made before our record landed arrives now.
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: api.intents()[0], labels: map[string]string{"x": "y"}, rv: api.patchRV(0)})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3)
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
}

// TestOwnPodNeverDeleted ensures POD_NAME protects the controller's pod
// even when its selector matches it.
func TestOwnPodNeverDeleted(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, OwnPod: OwnPod{Name: "webapp-2"}})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-3"}, api.deletedPods())
}

// TestRecordHashFalse ensures that without RECORD_HASH nothing is patched
// and the digest is kept in memory, so a second sighting does nothing.
func TestRecordHashFalse(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: false})
	start(t, c)
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v1})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2})
	settle(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2, labels: map[string]string{"a": "b"}})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3)
	assert.Empty(t, api.seen(http.MethodPatch, "configmaps"))
}

// TestMalformedObjectSkipped ensures an object the controller cannot read is
// counted and skipped without a panic or a request.
func TestMalformedObjectSkipped(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	for _, raw := range []string{`{}`, `{"metadata":null}`, `{"metadata":{"name":"x"}}`, `not json`, ``} {
		configMaps(c).Handle(watch.Event{Type: watch.Modified, Object: []byte(raw)})
	}
	assert.Equal(t, uint64(5), m.SkippedObjects.Value())
	assert.True(t, c.queue.idle())
}

// TestTombstoneOutlivesARelist ensures a ConfigMap missing from a complete
// list becomes a tombstone, and a deleted one stays one through a relist
// that does not show it, however its deletion was seen, so that its
// re-creation with other data is still a change, not adopted.
func TestTombstoneOutlivesARelist(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delete func(c *Controller)
	}{
		{"GoneFromAList", func(*Controller) {}}, // deleted while the history was lost
		{"DeletedEventThenRelist", func(c *Controller) {
			handle(t, c, watch.Deleted, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
		}},
		{"GoneFromTwoLists", func(c *Controller) {
			c.all[kindConfigMap].BeginList()
			c.all[kindConfigMap].EndList()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, _ := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			c.all[kindConfigMap].BeginList()
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
			c.all[kindConfigMap].EndList()
			tc.delete(c)
			c.all[kindConfigMap].BeginList() // a 410: the watch relists
			c.all[kindConfigMap].EndList()
			handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2})
			settle(t, c)
			assert.Len(t, api.deletedPods(), 3)
		})
	}
}

// TestShutdownLetsInFlightRoundFinish ensures stopping lets a deletion in
// flight complete within the grace period and starts no new round.
func TestShutdownLetsInFlightRoundFinish(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	inDelete := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			once.Do(func() { close(inDelete); <-release })
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ShutdownGrace: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	<-inDelete
	cancel()
	select {
	case <-done:
		t.Fatal("Run returned while a deletion was in flight")
	default:
	}
	close(release)
	<-done
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted), "the round in flight completed")
}

// TestShutdownGraceBoundsRound ensures a round stuck on the API is cut off
// when the grace period ends.
func TestShutdownGraceBoundsRound(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	inDelete := make(chan struct{})
	var once sync.Once
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			once.Do(func() { close(inDelete) })
			<-unblock
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ShutdownGrace: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	<-inDelete
	cancel()
	<-done
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultError))
	assert.Empty(t, api.recordedHashes(), "an unfinished round records nothing")
}

// TestStandbyActsOnlyWhenLeading ensures a standby keeps its state warm but
// sends nothing, and on becoming leader acts once on what changed while it
// stood by, not on what the previous leader already handled.
func TestStandbyActsOnlyWhenLeading(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	// Standing by: events arrive, no worker runs.
	handle(t, c, watch.Synced, cmSpec{name: "handled", selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v1})
	handle(t, c, watch.Modified, cmSpec{name: "handled", selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2}) // the leader's round, recorded
	handle(t, c, watch.Synced, cmSpec{name: "pending", uid: "u2", selector: ptr("app=db"), recorded: hashOf(t, v1), data: v1})
	handle(t, c, watch.Modified, cmSpec{name: "pending", uid: "u2", selector: ptr("app=db"), recorded: hashOf(t, v1), data: v2}) // the leader died before acting
	assert.Empty(t, api.requests, "a standby sends nothing")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Lead(ctx, func() time.Duration { return 0 })
		close(done)
	}()
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	cancel()
	<-done
	assert.Equal(t, []string{"db-1"}, api.deletedPods(), "only the change no leader handled is acted on")
}

// TestMayActFalseStopsRound ensures a replica that may no longer act (its
// lease may have lapsed) deletes nothing more and records nothing.
func TestMayActFalseStopsRound(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var allowed atomic.Bool
	allowed.Store(true)
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			allowed.Store(false) // the lease lapses during the first deletion
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MayAct: allowed.Load, MaxConcurrentRestarts: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultError) >= 1 }, waitFor, time.Millisecond)
	assert.Len(t, api.deletedPods(), 1)
	assert.Empty(t, api.recordedHashes())
}

// TestRelistOfUnchangedObjectsKeepsThem ensures a relist showing a
// ConfigMap unchanged (same resourceVersion) keeps what the controller knows
// of it, so a later change is acted on rather than adopted.
func TestRelistOfUnchangedObjectsKeepsThem(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: false})
	start(t, c)
	for range 3 {
		c.all[kindConfigMap].BeginList()
		handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v1, rv: "10"})
		c.all[kindConfigMap].EndList()
	}
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2, rv: "11"})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3)
}

// TestListScopedToNamespace ensures the list of one namespace's watch says
// nothing about ConfigMaps of another namespace.
func TestListScopedToNamespace(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: false})
	start(t, c)
	ns, other := c.ForConfigMaps("ns"), c.ForConfigMaps("other")
	ns.BeginList()
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v1})
	ns.EndList()
	for range 2 { // two complete lists of another namespace
		other.BeginList()
		other.EndList()
	}
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3, "the ConfigMap was forgotten by another namespace's list")
}

// TestAnnotatedNamespacesAreReported ensures Config.Pods.Annotated hears of a
// namespace when its first annotated ConfigMap appears and when its last
// one goes (deleted, annotation removed, or missing from a relist), and
// only then.
func TestAnnotatedNamespacesAreReported(t *testing.T) {
	var calls []string
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{Pods: oneIndex{annotated: func(ns string, on bool) {
		calls = append(calls, fmt.Sprintf("%s=%v", ns, on))
	}}})
	a := cmSpec{name: "a", uid: "uid-a", selector: ptr("app=a"), data: v1}
	b := cmSpec{name: "b", uid: "uid-b", selector: ptr("app=b"), data: v1}

	handle(t, c, watch.Added, a)
	handle(t, c, watch.Added, b)
	handle(t, c, watch.Modified, a)
	assert.Equal(t, []string{"ns=true"}, calls, "the first annotated ConfigMap")

	a.selector = nil
	handle(t, c, watch.Modified, a)
	assert.Equal(t, []string{"ns=true"}, calls, "one is left")

	handle(t, c, watch.Deleted, b)
	assert.Equal(t, []string{"ns=true", "ns=false"}, calls, "the last one deleted")

	handle(t, c, watch.Added, b)
	c.all[kindConfigMap].BeginList()
	c.all[kindConfigMap].EndList()
	assert.Equal(t, []string{"ns=true", "ns=false", "ns=true", "ns=false"}, calls, "missing from a relist")
}

// TestWorkersWaitForTheInitialLists ensures nothing is written while a
// first list is still coming in (adoption records would slow it down), and
// that the adoptions follow as soon as every list has ended.
func TestWorkersWaitForTheInitialLists(t *testing.T) {
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	scope := c.ForConfigMaps("ns")
	start(t, c)
	scope.BeginList()
	scope.Handle(watch.Event{Type: watch.Synced, Object: cmSpec{selector: ptr("app=webapp"), data: v1}.json(t)})
	assert.Never(t, func() bool { return len(api.recordedHashes()) > 0 }, 200*time.Millisecond, 10*time.Millisecond, "written during the list")
	scope.EndList()
	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 1 }, waitFor, time.Millisecond, "adopted after the list")
	assert.Equal(t, []string{hashOf(t, v1)}, api.recordedHashes())
}
