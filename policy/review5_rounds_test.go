package policy

import (
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

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestReviewTurn5PodFirstListedAfterTheCutoffIsLeft ensures a pod created
// before a change was seen is restarted for it even when the pod index
// first shows it in a relist (its ADDED event lost with a 410) that came
// after the change's cutoff and before the round took its pods: a listed
// pod's revision is that of its last update, not of its creation.
func TestReviewTurn5PodFirstListedAfterTheCutoffIsLeft(t *testing.T) {
	api := newFakeAPI(t, &fakePod{name: "a-1", uid: "uid-a-1", labels: map[string]string{"app": "a"}})
	api.listsAtRevision = true // the mark's LIST answers the revision of the latest write
	x := mirror(t, api, nil)   // the index shows a-1 only
	release := make(chan struct{})
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/a-1") {
			once.Do(func() { <-release }) // a's round holds the only worker
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true, Workers: 1}, x))
	start(t, c)

	a := cmSpec{name: "a-config", uid: "uid-a", selector: ptr("app=a"), recorded: hashOf(t, v1), data: v2}
	handle(t, c, watch.Modified, a)
	require.Eventually(t, func() bool { return len(api.seen(http.MethodDelete, "pods")) == 1 }, waitFor, time.Millisecond)

	// b-1 is created; its ADDED event does not reach the index (yet).
	b1 := api.addPod("b-1", map[string]string{"app": "b"})
	// b's change is seen while a's round is in progress: its mark is sent.
	handle(t, c, watch.Modified, cmSpec{name: "b-config", uid: "uid-b", selector: ptr("app=b"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.entries["ns/b-config"].mark.resolved()
		return ok
	}, waitFor, time.Millisecond)
	// b-1's kubelet reports it Ready; the pod watch ends with a 410 and
	// the index relists: it first shows b-1 at that later revision.
	api.mu.Lock()
	api.revision++
	api.pods["b-1"].ready, api.pods["b-1"].version = true, api.revision
	x.BeginList()
	for _, p := range api.pods {
		x.Handle(podEvent(t, watch.Synced, *p))
	}
	x.EndList()
	x.Progress(strconv.FormatUint(api.revision, 10))
	api.mu.Unlock()
	close(release)

	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Contains(t, api.removedPods(), "b-1",
		"b-1 (uid %s) was created before b's change was seen and runs its old data", b1.uid)
}

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
				// As the server shows it, the round's intent written.
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web,tier=none"), recorded: hashOf(t, v1), data: v2, intent: api.intents()[0], rv: api.patchRV(0)})
			} else {
				leading.Store(false)
			}
			time.Sleep(1500 * time.Millisecond) // the eleventh's token comes
			assert.Len(t, api.deletedPods(), 10, "a DELETE sent after its round ended (%s)", how)
		})
	}
}

// TestReviewTurn5SettlingRoundSupersededLeavesNoIntent ensures a change set
// back while its round waits to settle restarts nothing: the round wrote
// its intent before the wait, restarted no pod, and was superseded. Left
// behind, that intent reads as "pods mixed" (design.md says so of an
// intent superseded right after its write, which is removed): every pod is
// restarted for data they all run.
func TestReviewTurn5SettlingRoundSupersededLeavesNoIntent(t *testing.T) {
	api, c, m := settleTest(t, 300*time.Millisecond)
	start(t, c)
	a := settleSpec("a")
	a.recorded, a.data = hashOf(t, v1), v2
	handle(t, c, watch.Modified, a)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) == 1 }, waitFor, time.Millisecond, "the round wrote its intent and settles")
	require.Len(t, api.intents(), 1)

	a.data, a.intent, a.rv = v1, api.intents()[0], api.patchRV(0) // set back, as the server shows it
	handle(t, c, watch.Modified, a)
	time.Sleep(500 * time.Millisecond) // past SETTLE
	settle(t, c)

	assert.Empty(t, api.removedPods(), "no pod ever ran v2, and the data is v1 again")
	assert.Empty(t, api.recordedHashes())
}

// TestRecreatedWithTheRecordedDataRestartsPodsStartedWhileItWasGone ensures
// an object deleted and created again with the data its pods were
// restarted for restarts its pods when one may have started while it was
// gone (reading none of it, as an optional reference allows): the pod
// index saw one created after the deletion, or, without the index, which
// alone tells, that cannot be known. The pods are mixed: every selected
// pod is restarted, once.
func TestRecreatedWithTheRecordedDataRestartsPodsStartedWhileItWasGone(t *testing.T) {
	for _, tt := range []struct {
		name    string
		indexed bool
		want    []string
	}{
		{name: "the index saw a pod created while it was gone", indexed: true, want: []string{"webapp-1", "webapp-2", "webapp-3", "webapp-4"}},
		{name: "without the index", want: []string{"webapp-1", "webapp-2", "webapp-3", "webapp-4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			cfg := Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}
			var x *podindex.Index
			if tt.indexed {
				x = mirror(t, api, nil)
				cfg = withIndex(cfg, x)
			}
			c, m := newTestController(t, api.client(), cfg)
			start(t, c)
			cm := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1}
			handle(t, c, watch.Synced, cm)
			handle(t, c, watch.Deleted, cm)
			started := api.addPod("webapp-4", map[string]string{"app": "webapp"}) // its optional reference finds nothing
			if x != nil {
				x.Handle(podEvent(t, watch.Added, started))
			}
			handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v1})
			settle(t, c)
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
			assert.ElementsMatch(t, tt.want, api.deletedPods(), "webapp-4 runs none of the data")
			assert.Equal(t, []string{hashOf(t, v1)}, api.recordedHashes())
		})
	}
}

// TestRecreatedWithTheDataOfAChangeNotYetActedOnRestartsPodsStartedWhileItWasGone
// ensures an object whose change was seen but whose round had not begun
// (a storm's gate, a busy worker), deleted and created again with that same
// data, has the pods that started while it was gone restarted: they read
// none of it, though created after the change was seen.
func TestRecreatedWithTheDataOfAChangeNotYetActedOnRestartsPodsStartedWhileItWasGone(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	x := mirror(t, api, nil)
	c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	cm := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1}
	handle(t, c, watch.Synced, cm)
	cm.data = v2 // seen; no worker runs yet
	handle(t, c, watch.Modified, cm)
	handle(t, c, watch.Deleted, cm)
	started := api.addPod("webapp-4", map[string]string{"app": "webapp"}) // its optional reference finds nothing
	x.Handle(podEvent(t, watch.Added, started))
	handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2})
	c.mu.Lock()
	mixed := c.entries[keyOf(kindConfigMap, "ns", "webapp-config")].i == mixedIntent
	c.mu.Unlock()
	assert.True(t, mixed, "the pods are mixed")
	start(t, c)
	settle(t, c)
	assert.Contains(t, api.deletedPods(), "webapp-4", "it runs none of the data")
}

// TestRecreatedMidRoundRestartsPodsStartedWhileItWasGone ensures an object
// deleted while its round restarts pods, and created again with the data
// of that round, has the pods that started while it was gone restarted
// too: resuming the intent alone restarts only the pods it names, and
// takes one created since the change was seen to run the data.
func TestRecreatedMidRoundRestartsPodsStartedWhileItWasGone(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var c *Controller
	cm, x := deletedMidRound(t, api, &c)
	c, _ = newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)
	handle(t, c, watch.Modified, cm)
	require.Eventually(t, func() bool { return len(api.deletedPods()) > 0 }, waitFor, time.Millisecond)
	settle(t, c)
	require.NotContains(t, api.deletedPods(), "webapp-4")

	handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2})
	settle(t, c)
	assert.Contains(t, api.deletedPods(), "webapp-4", "it runs none of the data")
}

// TestRecreatedWithPodsMixedLeavesPodsCreatedAfterTheRecreation ensures
// an object created again with the data its pods were being restarted
// for, a pod having started while it was gone, counts its mixed pods from
// the re-creation: a pod created after it runs the data, and a round begun
// later (its worker busy, or its first round superseded by a selector
// refused then fixed, simulator seed 3285) leaves it.
func TestRecreatedWithPodsMixedLeavesPodsCreatedAfterTheRecreation(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	api.listsAtRevision = true // the mark's LIST answers the revision of the latest write
	var c *Controller
	cm, x := deletedMidRound(t, api, &c)
	release := make(chan struct{})
	var hold sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/db-1") {
			hold.Do(func() { <-release }) // the db round holds the only worker
		}
		return 0, "", false
	}
	c, _ = newTestController(t, api.client(), withIndex(Config{RecordHash: true, Workers: 1}, x))
	start(t, c)
	t.Cleanup(sync.OnceFunc(func() { close(release) })) // before the controller is stopped
	handle(t, c, watch.Modified, cm)
	require.Eventually(t, func() bool { return len(api.deletedPods()) > 0 }, waitFor, time.Millisecond)
	settle(t, c)

	handle(t, c, watch.Modified, cmSpec{name: "db-config", uid: "uid-db", selector: ptr("app=db"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(api.seen(http.MethodDelete, "pods"), func(r request) bool { return strings.HasSuffix(r.path, "/db-1") })
	}, waitFor, time.Millisecond)
	handle(t, c, watch.Added, cmSpec{uid: "cm-uid-2", selector: ptr("app=webapp"), data: v2})
	require.Eventually(t, func() bool { // its mark answered, if one was sent
		c.mu.Lock()
		defer c.mu.Unlock()
		m := c.entries["ns/webapp-config"].mark
		_, ok := m.resolved()
		return m == nil || ok
	}, waitFor, time.Millisecond)
	api.addReadyShown(t, x, "webapp-5", "", map[string]string{"app": "webapp"}) // it reads the data created again
	release <- struct{}{}
	settle(t, c)

	assert.Contains(t, api.deletedPods(), "webapp-4", "it runs none of the data")
	assert.NotContains(t, api.deletedPods(), "webapp-5", "created after the re-creation was seen")
}

// deletedMidRound returns cm (selecting app=webapp, v1 recorded, v2 its
// data) and an index of api's pods in which, while the round's first
// DELETE is answered, cm is deleted (shown to *c) and webapp-4 starts, its
// optional reference finding nothing.
func deletedMidRound(t *testing.T, api *fakeAPI, c **Controller) (cmSpec, *podindex.Index) {
	var once sync.Once
	cm := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}
	x := mirror(t, api, func(fakePod) *fakePod {
		var started *fakePod
		once.Do(func() {
			handle(t, *c, watch.Deleted, cm)
			p := api.addPodLocked("webapp-4", map[string]string{"app": "webapp"})
			started = &p
		})
		return started
	})
	return cm, x
}
