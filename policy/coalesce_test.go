package policy

import (
	"net/http"
	"net/http/httptest"
	"path"
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

// TestPodCreatedAfterChangeSeenIsNotRestartedForIt ensures a pod created
// after a change was seen is not restarted for it, whichever object's round
// created it: two ConfigMaps over the same pods change together; the round
// that goes first replaces the pods both select, and the other round
// restarts only the pods it alone selects, not those replacements (they
// run both new data). Each original pod is restarted once.
func TestPodCreatedAfterChangeSeenIsNotRestartedForIt(t *testing.T) {
	front := map[string]string{"app": "web", "tier": "front"}
	api := newFakeAPI(t,
		&fakePod{name: "web-1", uid: "uid-1", labels: front},
		&fakePod{name: "web-2", uid: "uid-2", labels: front},
		&fakePod{name: "web-3", uid: "uid-3", labels: map[string]string{"app": "web"}})
	x := mirror(t, api, api.replacement)
	cfg := withIndex(Config{RecordHash: true, Workers: 1}, x)
	c, m := newTestController(t, api.client(), cfg)

	// Both changes are seen before either round begins.
	handle(t, c, watch.Modified, cmSpec{name: "front", uid: "uid-cm-front", selector: ptr("app=web,tier=front"), recorded: hashOf(t, v1), data: v2})
	handle(t, c, watch.Modified, cmSpec{name: "web", uid: "uid-cm-web", selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
	start(t, c)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, 1e6)
	settle(t, c)

	assert.Equal(t, []string{"web-1", "web-2", "web-3"}, api.removedPods(), "each pod once; no replacement")
	assert.Len(t, api.recordedHashes(), 2, "each object records its own R")
}

// settleTest is three ConfigMaps, a, b and c, over the same three pods of
// a ReplicaSet that replaces each pod deleted, with SETTLE.
func settleTest(t *testing.T, settle time.Duration) (*fakeAPI, *Controller, *Metrics) {
	web := map[string]string{"app": "web"}
	api := newFakeAPI(t,
		&fakePod{name: "web-1", uid: "uid-1", labels: web},
		&fakePod{name: "web-2", uid: "uid-2", labels: web},
		&fakePod{name: "web-3", uid: "uid-3", labels: web})
	x := mirror(t, api, api.replacement)
	cfg := withIndex(Config{RecordHash: true, Settle: settle}, x)
	c, m := newTestController(t, api.client(), cfg)
	return api, c, m
}

func settleSpec(name string) cmSpec {
	return cmSpec{name: name, uid: "uid-cm-" + name, selector: ptr("app=web")}
}

// TestSettleRestartsEachPodOnceForChangesTogether ensures SETTLE makes
// changes of three objects over the same pods, 30 ms apart, restart each
// pod once, not once per object, and that each object records its own R.
// Without it (the second run) the first round restarts the pods before
// the second change is seen, and its replacements, which run the first
// object's new data but the others' old, are restarted again.
func TestSettleRestartsEachPodOnceForChangesTogether(t *testing.T) {
	for _, tt := range []struct {
		settle      time.Duration
		wantRemoved int
	}{{settle: 300 * time.Millisecond, wantRemoved: 3}, {settle: 0, wantRemoved: 9}} {
		t.Run("settle="+tt.settle.String(), func(t *testing.T) {
			api, c, m := settleTest(t, tt.settle)
			start(t, c)
			for _, name := range []string{"a", "b", "c"} {
				s := settleSpec(name)
				s.recorded, s.data = hashOf(t, v1), v2
				handle(t, c, watch.Modified, s)
				if tt.settle == 0 {
					// The first rounds end before the next change.
					require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == uint64(name[0]-'a')+1 }, waitFor, time.Millisecond)
				} else {
					time.Sleep(30 * time.Millisecond) // the changes' pace is the scenario
				}
			}
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 3 }, waitFor, time.Millisecond)
			settle(t, c)
			assert.Len(t, api.removedPods(), tt.wantRemoved, "%v", api.removedPods())
			assert.Len(t, api.recordedHashes(), 3, "each object records its own R")
		})
	}
}

// TestSettleKillBetweenTwoIntentsRestartsEachPodOnce ensures a controller
// killed between two objects' intents (a's written over the three pods, b's
// not yet) leaves states of the table that the next controller resolves
// with each pod restarted once: a resumes its intent, b begins a round,
// and whichever goes first, the other restarts neither the pods it
// restarted nor their replacements.
func TestSettleKillBetweenTwoIntentsRestartsEachPodOnce(t *testing.T) {
	api, c, m := settleTest(t, 100*time.Millisecond)
	a := settleSpec("a")
	a.recorded, a.data, a.intent = hashOf(t, v1), v2, hashOf(t, v2)+"/uid-1,uid-2,uid-3"
	b := settleSpec("b")
	b.recorded, b.data = hashOf(t, v1), v2
	handle(t, c, watch.Added, a)
	handle(t, c, watch.Added, b)
	start(t, c)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"web-1", "web-2", "web-3"}, api.removedPods())
	assert.Len(t, api.recordedHashes(), 2, "each object records its own R")
}

// TestSettlingRoundSupersededKeepsItsIntentOverAPodCreatedMeanwhile ensures
// a round superseded while it settles keeps its intent where a pod it
// selects was created meanwhile (a scale-up): that pod runs the round's
// data, so the pods are mixed, and when the data is set back the next
// round restarts it too, not only the pods that never ran it.
func TestSettlingRoundSupersededKeepsItsIntentOverAPodCreatedMeanwhile(t *testing.T) {
	web := map[string]string{"app": "web"}
	api := newFakeAPI(t,
		&fakePod{name: "web-1", uid: "uid-1", labels: web},
		&fakePod{name: "web-2", uid: "uid-2", labels: web})
	x := mirror(t, api, api.replacement)
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true, Settle: 300 * time.Millisecond}, x))
	start(t, c)
	a := settleSpec("a")
	a.recorded, a.data = hashOf(t, v1), v2
	handle(t, c, watch.Modified, a)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) == 1 }, waitFor, time.Millisecond, "the round wrote its intent and settles")
	require.Len(t, api.intents(), 1)

	api.mu.Lock()
	scaled := api.addPodLocked("web-3", web) // created with v2
	api.mu.Unlock()
	x.Handle(podEvent(t, watch.Added, scaled))
	a.data, a.intent, a.rv = v1, api.intents()[0], api.patchRV(0) // set back
	handle(t, c, watch.Modified, a)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)

	assert.Contains(t, api.removedPods(), "web-3", "web-3 was created with v2, and the data is v1")
	assert.Equal(t, []string{hashOf(t, v1)}, api.recordedHashes())
}

// TestRoundTakesNoReplacementOfADeleteInFlight ensures a round whose change
// was seen before another round's DELETEs were sent does not take their
// replacements, though the index shows them before those DELETEs' answers
// are back: it waits for the answers (its cutoff) before it takes its pods.
// b's change is seen first, its selector refused; a resumes and deletes the
// three pods, their answers held; b's selector is fixed (its data, and the
// moment its change was seen, unchanged) and b takes its pods.
func TestRoundTakesNoReplacementOfADeleteInFlight(t *testing.T) {
	api, c, m := settleTest(t, 100*time.Millisecond)
	c.catchUpWait = time.Hour // only the answers end b's wait
	held := make(chan struct{})
	var holding atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method != http.MethodDelete || strings.HasSuffix(r.path, "r") {
			return 0, "", false
		}
		// Carried out, the replacement shown by the index; the answer held.
		rec := httptest.NewRecorder()
		api.mu.Lock()
		api.deletePod(rec, path.Base(r.path), []byte(r.body), false)
		api.mu.Unlock()
		holding.Add(1)
		<-held
		return rec.Code, rec.Body.String(), true
	}
	a := settleSpec("a")
	a.recorded, a.data, a.intent = hashOf(t, v1), v2, hashOf(t, v2)+"/uid-1,uid-2,uid-3"
	b := settleSpec("b")
	b.recorded, b.data, b.selector = hashOf(t, v1), v2, ptr("!app")
	handle(t, c, watch.Added, b)
	handle(t, c, watch.Added, a)
	start(t, c)
	require.Eventually(t, func() bool { return holding.Load() == 3 && m.Reconciles.Value(resultRefused) == 1 }, waitFor, time.Millisecond)

	b.selector = ptr("app=web")
	handle(t, c, watch.Modified, b)
	budget := c.budgetOf("ns")
	require.Eventually(t, func() bool {
		budget.mu.Lock()
		defer budget.mu.Unlock()
		return budget.answered != nil || len(api.intents()) > 0 // b waits for the answers, or took its pods and settles
	}, waitFor, time.Millisecond)
	close(held)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"web-1", "web-2", "web-3"}, api.removedPods(), "each pod once; no replacement")
}

// TestChangeDuringARoundRestartsEachPodOnceForBoth ensures that when object
// b's change arrives while object a's round over the same Ready pods runs in
// waves, a pod a has not restarted yet is restarted once for both, a's
// replacement made before b's change is restarted for b (it runs b's old
// data), and no replacement made after it is restarted by either; both
// objects record, and the shared budget (one pod at a time) holds.
func TestChangeDuringARoundRestartsEachPodOnceForBoth(t *testing.T) {
	api := newFakeAPI(t, owned("web", 4)...)
	x := mirror(t, api, api.replacement) // replacements start not Ready
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour, Workers: 2}
	cfg.Pods = oneIndex{x: x}
	c, m := newTestController(t, api.client(), cfg)
	start(t, c)
	spec := func(name string) cmSpec {
		return cmSpec{name: name, uid: "uid-cm-" + name, selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2}
	}
	// The kubelet's part: a replacement not Ready becomes Ready.
	readyOne := func() bool {
		api.mu.Lock()
		var p *fakePod
		for _, q := range api.pods {
			if !q.ready && !q.terminating {
				p = q
			}
		}
		if p != nil {
			api.becomeReady(p)
		}
		api.mu.Unlock()
		if p != nil {
			x.Handle(podEvent(t, watch.Modified, *p))
		}
		return p != nil
	}

	handle(t, c, watch.Modified, spec("a"))
	require.Eventually(t, func() bool { return len(api.removedPods()) == 1 }, waitFor, time.Millisecond)
	first := api.removedPods()[0]
	handle(t, c, watch.Modified, spec("b")) // a's replacement of first exists, not Ready
	require.Eventually(t, func() bool {
		readyOne()
		return m.Reconciles.Value(resultRestarted) == 2
	}, waitFor, 5*time.Millisecond)
	settle(t, c)

	assert.ElementsMatch(t, []string{"web-1", "web-2", "web-3", "web-4", first + "r"}, api.removedPods(),
		"the originals once, a's replacement made before b's change once, none made after it")
	assert.Len(t, api.recordedHashes(), 2, "each object records its own R")
}

// TestChangeSeenDuringRestartsInFlightLeavesTheirReplacements ensures the
// issue's case: a change seen while the same object's DELETEs are in flight
// (a slow server) is acted on once they are answered, and the replacements
// they make, created after the change was seen, are not restarted for it:
// the moment it was seen is marked by a pod LIST sent then (a round of the
// namespace was in progress). Each pod is restarted once, not twice.
func TestChangeSeenDuringRestartsInFlightLeavesTheirReplacements(t *testing.T) {
	web := map[string]string{"app": "web"}
	api := newFakeAPI(t,
		&fakePod{name: "web-1", uid: "uid-1", labels: web},
		&fakePod{name: "web-2", uid: "uid-2", labels: web})
	api.listsAtRevision = true
	x := mirror(t, api, api.replacement)
	release, free := heldUntilFreed(t)
	var held atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			held.Add(1)
			<-release // the server carries the DELETE out later
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return held.Load() == 2 }, waitFor, time.Millisecond, "both DELETEs in flight")
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, v1), data: v3})
	require.Eventually(t, func() bool { return markResolved(c) }, waitFor, time.Millisecond, "the mark's LIST answered before the DELETEs")
	free()
	require.Eventually(t, func() bool {
		rs := api.recordedHashes()
		return len(rs) > 0 && rs[len(rs)-1] == hashOf(t, v3)
	}, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"web-1", "web-2"}, api.removedPods(), "the replacements, made after v3 was seen, run it")
	assert.Zero(t, m.Reconciles.Value(resultError))
}

// TestChangeSeenWhileRefusedLeavesPodsCreatedBeforeTheFix ensures a change
// seen while the selector is refused, with no round in progress, is marked
// when it is refused: a pod created before the selector is fixed (another
// round's replacement) runs the new data, and the round that begins at the
// fix restarts only the pod that was there before the change.
func TestChangeSeenWhileRefusedLeavesPodsCreatedBeforeTheFix(t *testing.T) {
	web := map[string]string{"app": "web"}
	api := newFakeAPI(t, &fakePod{name: "web-1", uid: "uid-1", labels: web})
	api.listsAtRevision = true
	x := mirror(t, api, nil)
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{selector: ptr(""), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRefused) == 1 }, waitFor, time.Millisecond)
	assert.Eventually(t, func() bool { return markResolved(c) }, waitFor, time.Millisecond, "the refused change's mark answered")
	api.mu.Lock()
	x.Handle(podEvent(t, watch.Added, api.addPodLocked("web-2", web)))
	api.mu.Unlock()

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"web-1"}, api.removedPods(), "web-2, created after v2 was seen, runs it")
	assert.Zero(t, m.Reconciles.Value(resultError))
}

// TestChangeSeenWhileEveryWorkerIsBusyLeavesPodsCreatedBeforeItsRound
// ensures a change seen while no worker is free (here the only one writes
// another object's record, its answer slow), with no round of the
// namespace in progress, is marked when it is seen: a pod created before a
// worker takes the change (a scale-up, an earlier round's replacement)
// runs the new data, and the round restarts only the pod from before it.
func TestChangeSeenWhileEveryWorkerIsBusyLeavesPodsCreatedBeforeItsRound(t *testing.T) {
	web := map[string]string{"app": "web"}
	api := newFakeAPI(t, &fakePod{name: "web-1", uid: "uid-1", labels: web})
	api.listsAtRevision = true
	x := mirror(t, api, nil)
	release, free := heldUntilFreed(t)
	var held atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPatch && strings.HasSuffix(r.path, "/configmaps/other") {
			held.Add(1)
			<-release
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true, Workers: 1}, x))
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{name: "other", uid: "uid-cm-other", selector: ptr("app=other")})
	require.Eventually(t, func() bool { return held.Load() == 1 }, waitFor, time.Millisecond, "the worker writes the other object's record")
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
	if assert.True(t, markSent(c), "the change is marked when it is seen") {
		// Its LIST answers before the pod comes: the mark precedes it.
		require.Eventually(t, func() bool { return markResolved(c) }, waitFor, time.Millisecond)
	}
	api.mu.Lock()
	x.Handle(podEvent(t, watch.Added, api.addPodLocked("web-2", web)))
	api.mu.Unlock()

	free()
	require.Eventually(t, func() bool { return slices.Contains(api.recordedHashes(), hashOf(t, v2)) }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"web-1"}, api.removedPods(), "web-2, created after v2 was seen, runs it")
	assert.Zero(t, m.Reconciles.Value(resultError))
}

// TestBurstRoundsDoNotWaitForOneAnothersRequests: changes of objects over
// different pods, arriving together (the bench's burst), each seen while
// other rounds run. A round whose pods were all there before its change was
// seen completes and records without waiting for what only places that
// moment among pod revisions: the other rounds' DELETEs in flight, sent
// after it, and its mark's LIST. Its own replacement is still left alone.
func TestBurstRoundsDoNotWaitForOneAnothersRequests(t *testing.T) {
	api := newFakeAPI(t,
		&fakePod{name: "a-1", uid: "uid-a", labels: map[string]string{"app": "a"}},
		&fakePod{name: "b-1", uid: "uid-b", labels: map[string]string{"app": "b"}},
		&fakePod{name: "c-1", uid: "uid-c", labels: map[string]string{"app": "c"}})
	api.listsAtRevision = true
	x := mirror(t, api, api.replacement)
	release, free := heldUntilFreed(t)
	var heldDeletes, heldLists atomic.Int32
	cSent := make(chan struct{})
	api.fault = func(r request) (int, string, bool) {
		switch {
		case r.method == http.MethodDelete && strings.HasSuffix(r.path, "/a-1"):
			<-cSent // a's answer comes once c's DELETE, sent after a was seen, is in flight
		case r.method == http.MethodDelete:
			if heldDeletes.Add(1) == 2 {
				close(cSent)
			}
			<-release // the server carries the DELETE out later
		case r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") && slices.Contains(r.query["limit"], "1"):
			heldLists.Add(1)
			<-release
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	c.sweepWait, c.catchUpWait = time.Hour, time.Hour // a wait would outlast the test
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-cm-b", selector: ptr("app=b"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return heldDeletes.Load() == 1 }, waitFor, time.Millisecond, "b's DELETE in flight")
	handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-cm-a", selector: ptr("app=a"), recorded: hashOf(t, v1), data: v2})
	handle(t, c, watch.Modified, cmSpec{name: "c", uid: "uid-cm-c", selector: ptr("app=c"), recorded: hashOf(t, v1), data: v2})

	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 1 }, waitFor, time.Millisecond,
		"a's round recorded while the others' requests are in flight")
	assert.Equal(t, int32(2), heldDeletes.Load(), "b's and c's DELETEs still held")
	// The mark's LIST is sent apart from the round: it may come after the
	// record, and is held until free.
	require.Eventually(t, func() bool { return heldLists.Load() > 0 }, waitFor, time.Millisecond, "a mark's LIST held")
	assert.Equal(t, []string{"a-1"}, api.removedPods())

	free()
	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 3 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"a-1", "b-1", "c-1"}, api.removedPods(), "each pod once, no replacement")
	assert.Zero(t, m.Reconciles.Value(resultError))
}

// heldUntilFreed returns a channel that the fake server's held requests wait
// on, and free, which closes it once. free also runs at cleanup, before the
// server closes: a failed check must not hang on held requests.
func heldUntilFreed(t *testing.T) (release <-chan struct{}, free func()) {
	ch := make(chan struct{})
	var once sync.Once
	free = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(free)
	return ch, free
}

// markSent reports whether some change pending on c has a mark.
func markSent(c *Controller) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.mark != nil {
			return true
		}
	}
	return false
}

// markResolved reports whether the mark of some change pending on c has
// its LIST answered.
func markResolved(c *Controller) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if _, ok := e.mark.resolved(); ok {
			return true
		}
	}
	return false
}
