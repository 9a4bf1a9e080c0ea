package policy

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// readyOnceListed plays the kubelet for replacements: a pod that is not
// Ready becomes Ready (now) once a pod list has shown it not Ready, so
// that every wave but the first sees some not Ready.
func (f *fakeAPI) readyOnceListed() {
	shown := map[string]bool{}
	f.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") {
			f.mu.Lock()
			for _, p := range f.pods {
				if !p.ready && p.waiting == "" && shown[p.uid] {
					f.becomeReady(p)
				}
				shown[p.uid] = true
			}
			f.mu.Unlock()
		}
		return 0, "", false
	}
}

// replaceNotReady has the fake's owners replace each deleted pod they own
// with a new one that is not Ready yet, but not broken either: starting.
func (f *fakeAPI) replaceNotReady() {
	f.afterDelete = func(p fakePod) {
		if p.owner == "" {
			return
		}
		r := f.addPodLocked(p.name+"-r", p.labels)
		n := f.pods[r.name]
		n.owner, n.ownerKind, n.readySince = p.owner, p.ownerKind, time.Now()
	}
}

// addWeb1Replacement adds web-1's replacement, web-1-r, as its owner
// would, set as set says.
func (f *fakeAPI) addWeb1Replacement(set func(r *fakePod)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set(f.pods[f.addPodLocked("web-1-r", map[string]string{"app": "webapp"}).name])
}

// read returns *n as the fake's deletions left it (downAtDeletion).
func (f *fakeAPI) read(n *int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *n
}

// downAtDeletion records, at each of our deletions, the most selected pods
// not available (not Ready, or terminating) and the fewest Ready.
func downAtDeletion(api *fakeAPI, matches func(map[string]string) bool) (most, fewestReady *int) {
	most, fewestReady = new(int), new(int)
	*fewestReady = 1 << 30
	inner := api.afterDelete
	api.afterDelete = func(p fakePod) {
		if inner != nil {
			inner(p)
		}
		down, ready := 0, 0
		for _, q := range api.pods {
			if q.owner == "" || !matches(q.labels) || q.phase != "" {
				continue
			}
			if q.ready && !q.terminating {
				ready++
			} else {
				down++
			}
		}
		*most, *fewestReady = max(*most, down), min(*fewestReady, ready)
	}
	return most, fewestReady
}

// TestExpectedPodsEstimatedWhenTheScaleCannotBeRead ensures a round whose
// owners' scale cannot be read (no RBAC) counts the most of their pods seen
// instead, says so once (a Warning Event, the metric), keeps the budget
// and completes.
func TestExpectedPodsEstimatedWhenTheScaleCannotBeRead(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.replaceNotReady()
	api.readyOnceListed()
	listed := api.fault
	api.fault = func(r request) (int, string, bool) {
		if strings.HasSuffix(r.path, "/scale") {
			return 403, `{"kind":"Status","code":403,"reason":"Forbidden","message":"replicasets.apps \"web-rs\" is forbidden: cannot get resource \"replicasets/scale\""}`, true
		}
		return listed(r)
	}
	most, _ := downAtDeletion(api, webapp)
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Len(t, api.deletedPods(), 4)
	api.mu.Lock()
	assert.Equal(t, 1, *most, "pods down at once with a budget of 1 of 4")
	api.mu.Unlock()
	n := 0
	for _, e := range rec.all() {
		if e.reason == "ExpectedPodsEstimated" {
			n++
			assert.Equal(t, "Warning", e.typ)
			assert.Contains(t, e.message, "ReplicaSet web-rs")
			assert.Contains(t, e.message, "needs verb get on replicasets/scale")
			assert.Contains(t, e.message, "(4) instead")
		}
	}
	assert.Equal(t, 1, n, "one Event per round")
	assert.Equal(t, uint64(1), m.OwnerReadsFailed.Value("forbidden"))
}

// TestMinReadySeconds ensures a replacement counts as available only once
// Ready for MIN_READY_SECONDS: until then the next Ready pod waits.
func TestMinReadySeconds(t *testing.T) {
	for _, tt := range []struct {
		name     string
		minReady time.Duration
		want     int // pods deleted
	}{
		{"ReadyIsAvailable", 0, 4},
		{"ReadyIsNotAvailableYet", time.Hour, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, podsOf("RRRR")...)
			api.replaceNotReady()
			api.readyOnceListed()
			c, m := newTestController(t, api.client(), Config{RecordHash: true, MinReadySeconds: tt.minReady})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			if tt.want == 4 {
				require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			} else {
				require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 5 }, waitFor, time.Millisecond)
			}
			assert.Len(t, api.deletedPods(), tt.want)
		})
	}
}

// TestPartialSelectionCountsTheOwnersOtherPodsOut ensures an owner whose
// pods the selector picks only in part counts its desired replicas less
// its pods the selector does not pick: 4 of a ReplicaSet's 8 selected, 25 %
// is 1 of 4 (not 2 of 8, which would halt the round at once).
func TestPartialSelectionCountsTheOwnersOtherPodsOut(t *testing.T) {
	pods := podsOf("RRRRRRRR")
	for _, p := range pods[4:] {
		p.labels = map[string]string{"app": "other"}
	}
	api := newFakeAPI(t, pods...)
	api.replaceNotReady()
	api.readyOnceListed()
	most, _ := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: time.Minute})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"web-1", "web-2", "web-3", "web-4"}, api.deletedPods())
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.Equal(t, 1, *most)
}

// TestFinishedPodsAreNeitherRestartedNorCounted ensures a Failed (evicted)
// and a Succeeded pod of the owner are not restarted and not counted: the
// round restarts the 4 running pods and completes.
func TestFinishedPodsAreNeitherRestartedNorCounted(t *testing.T) {
	pods := podsOf("RRRRNN")
	pods[4].name, pods[4].phase = "web-evicted", "Failed"
	pods[5].name, pods[5].phase = "web-completed", "Succeeded"
	api := newFakeAPI(t, pods...)
	api.replaceNotReady()
	api.readyOnceListed()
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: time.Minute})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"web-1", "web-2", "web-3", "web-4"}, api.deletedPods())
}

// TestStatefulSetSlowTerminationNeverTwoDown ensures a StatefulSet of 3
// whose restarted pod terminates for a while (its replacement, of the same
// name, comes only once it is gone) never has 2 pods down with a budget of
// 1, and each pod is restarted once.
func TestStatefulSetSlowTerminationNeverTwoDown(t *testing.T) {
	pods := podsOf("RRR")
	for _, p := range pods {
		p.ownerKind = "StatefulSet"
	}
	api := newFakeAPI(t, pods...)
	api.graceful = true
	// The StatefulSet controller and the kubelet: a pod seen terminating
	// by one list is gone at the next, replaced under its name; the
	// replacement is Ready after one more.
	terminating := map[string]bool{}
	notReady := map[string]bool{}
	api.fault = func(r request) (int, string, bool) {
		if r.method != http.MethodGet || !strings.HasSuffix(r.path, "/pods") || r.query["continue"] != nil {
			return 0, "", false
		}
		api.mu.Lock()
		defer api.mu.Unlock()
		for name, p := range api.pods {
			switch {
			case p.terminating && terminating[p.uid]:
				labels := p.labels
				delete(api.pods, name)
				n := api.addPodLocked(name, labels)
				api.pods[name].owner, api.pods[name].ownerKind = p.owner, p.ownerKind
				notReady[n.uid] = true
			case p.terminating:
				terminating[p.uid] = true
			case !p.ready && notReady[p.uid]:
				api.becomeReady(p)
			}
		}
		return 0, "", false
	}
	most, fewest := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: time.Minute})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{"web-1", "web-2", "web-3"}, api.removedPods(), "each pod once, one at a time")
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.Equal(t, 1, *most, "StatefulSet pods down at once")
	assert.Equal(t, 2, *fewest)
}

// TestScaleUpAndDownDuringARound ensures the budget follows the owner's
// desired replicas as they change during a round: pods added by a scale-up
// are not restarted (they run the new data) and keep the budget; pods
// removed by a scale-down are not waited for.
func TestScaleUpAndDownDuringARound(t *testing.T) {
	for _, tt := range []struct {
		name        string
		replicas    int
		wantDeleted []string
	}{
		{"Up", 6, []string{"web-1", "web-2", "web-3", "web-4"}},
		{"Down", 2, []string{"web-1", "web-2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, podsOf("RRRR")...)
			api.replaceNotReady()
			api.readyOnceListed()
			replace := api.afterDelete
			api.afterDelete = func(p fakePod) {
				replace(p)
				if len(api.removed) != 1 {
					return
				}
				// The owner scaled after the round's first restart.
				api.owners["web-rs"].replicas = tt.replicas
				for i := 5; i <= tt.replicas; i++ {
					n := api.addPodLocked(fmt.Sprintf("web-%d", i), map[string]string{"app": "webapp"})
					api.pods[n.name].owner, api.pods[n.name].ready = "web-rs", true
				}
				if tt.replicas < 4 {
					delete(api.pods, "web-3")
					delete(api.pods, "web-4")
				}
			}
			most, _ := downAtDeletion(api, webapp)
			c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: time.Minute})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			assert.ElementsMatch(t, tt.wantDeleted, api.deletedPods())
			api.mu.Lock()
			defer api.mu.Unlock()
			assert.Equal(t, 1, *most)
		})
	}
}

// TestReadinessBlipRestartsNothing ensures that when every selected pod is
// not Ready for a moment (a shared dependency's hiccup), no pod is
// restarted, outside the budget or in it; once they are Ready again, the
// round goes on and completes.
func TestReadinessBlipRestartsNothing(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.replaceNotReady()
	api.mu.Lock()
	for _, p := range api.pods {
		api.revision++
		p.ready, p.version, p.readySince = false, api.revision, time.Now()
	}
	api.mu.Unlock()
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: time.Minute})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 5 }, waitFor, time.Millisecond)
	assert.Empty(t, api.deletedPods(), "pods not Ready for a moment")

	api.readyOnceListed()
	api.makeReady()
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Len(t, api.deletedPods(), 4)
}

// TestTwoRoundsOverTheSamePodsKeepTheBudget ensures two ConfigMaps that
// select the same 8 pods and change together never have more than
// MAX_UNAVAILABLE (2) of them down between them, and restart each pod that
// ran before the changes once.
func TestTwoRoundsOverTheSamePodsKeepTheBudget(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRRRRRR")...)
	api.replaceNotReady()
	api.readyOnceListed()
	most, fewest := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 2}, ProgressDeadline: time.Minute})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-a", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-b", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, time.Millisecond)
	deleted := map[string]int{}
	for _, name := range api.deletedPods() {
		deleted[name]++
	}
	for i := 1; i <= 8; i++ {
		assert.Equal(t, 1, deleted[fmt.Sprintf("web-%d", i)], "deletions of web-%d", i)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.LessOrEqual(t, *most, 2, "pods down at once")
	assert.GreaterOrEqual(t, *fewest, 6)
}

// TestEstimateCountsPodsAnEarlierRoundRestarted ensures a round that begins
// after an earlier round's restart landed and before its replacement
// exists (a change superseding the round) counts that pod as expected when
// it estimates its owner: a DaemonSet (no scale), or a ReplicaSet whose
// scale cannot be read. Counting only the pods it sees, a DaemonSet of 2
// with a budget of 1 goes fully down.
func TestEstimateCountsPodsAnEarlierRoundRestarted(t *testing.T) {
	for _, tt := range []struct {
		name, kind string
		forbidden  bool
	}{
		{"DaemonSet", "DaemonSet", false},
		{"ReplicaSetScaleForbidden", "ReplicaSet", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pods := podsOf("RR")
			for _, p := range pods {
				p.ownerKind = tt.kind
			}
			api := newFakeAPI(t, pods...) // no replacement until the test makes it
			if tt.forbidden {
				api.fault = func(r request) (int, string, bool) {
					if strings.HasSuffix(r.path, "/scale") {
						return 403, `{"kind":"Status","code":403,"reason":"Forbidden","message":"cannot get resource \"replicasets/scale\""}`, true
					}
					return 0, "", false
				}
			}
			_, fewestReady := downAtDeletion(api, webapp)
			c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return len(api.removedPods()) == 1 }, waitFor, time.Millisecond)

			// The data changes again while web-1's replacement is missing.
			waited := m.Reconciles.Value(resultWaiting)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v3})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= waited+3 || len(api.removedPods()) > 1 }, waitFor, time.Millisecond)

			api.addWeb1Replacement(func(r *fakePod) { r.owner, r.ownerKind, r.ready = "web-rs", tt.kind, true })
			require.Eventually(t, func() bool { return len(api.removedPods()) == 2 }, waitFor, time.Millisecond)
			assert.Equal(t, 1, api.read(fewestReady), "2 expected, a budget of 1: web-2 waits for web-1's replacement")
		})
	}
}

// TestRoundCountsAnOwnerWhosePodsAnEarlierRoundRestarted ensures a round
// that supersedes another after it restarted every pod of one owner (a-rs,
// 1 replica), its replacement not created yet, counts that owner although
// its view shows none of its pods: 3 expected with a budget of 1, web-2
// waits for web-1's replacement (simulator seeds 967, 1098).
func TestRoundCountsAnOwnerWhosePodsAnEarlierRoundRestarted(t *testing.T) {
	pods := podsOf("RRR")
	pods[0].owner = "a-rs"        // web-1; web-2 and web-3 are web-rs's
	api := newFakeAPI(t, pods...) // no replacement until the test makes it
	_, fewestReady := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.removedPods()) == 1 }, waitFor, time.Millisecond)
	require.Equal(t, []string{"web-1"}, api.removedPods())

	// The data changes again while web-1's replacement is missing.
	waited := m.Reconciles.Value(resultWaiting)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v3})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= waited+3 || len(api.removedPods()) > 1 }, waitFor, time.Millisecond)

	api.addWeb1Replacement(func(r *fakePod) { r.owner, r.ready = "a-rs", true })
	require.Eventually(t, func() bool { return len(api.removedPods()) == 2 }, waitFor, time.Millisecond)
	assert.Equal(t, 2, api.read(fewestReady), "3 expected, a budget of 1: web-2 waits for web-1's replacement")
}

// TestEstimateCountsPodsAnEarlierProcessRestarted ensures a round that
// resumes an intent over a DaemonSet of 2 (budget 1), one of whose pods
// the earlier process restarted and whose replacement does not exist yet,
// counts 2 expected, not the 1 it sees: the other pod waits for the
// replacement.
func TestEstimateCountsPodsAnEarlierProcessRestarted(t *testing.T) {
	pods := podsOf("RR")
	for _, p := range pods {
		p.ownerKind = "DaemonSet"
	}
	api := newFakeAPI(t, pods[1]) // web-1 restarted, its replacement not created yet
	_, fewestReady := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: hashOf(t, v2) + "/uid-1,uid-2"})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 3 || len(api.removedPods()) > 0 }, waitFor, time.Millisecond)

	api.addWeb1Replacement(func(r *fakePod) { r.owner, r.ownerKind, r.ready = "web-rs", "DaemonSet", true })
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{"web-2"}, api.removedPods())
	assert.Equal(t, 1, api.read(fewestReady), "2 expected, a budget of 1: web-2 waits for web-1's replacement")
}

// TestEstimateTakesNoPodOnANodeComeBackForAReplacement ensures a round
// over a DaemonSet of 3 nodes, one of them lost when it began (budget 1),
// that restarted the pod on node n1 does not take the pod of the node that
// comes back (n3) for that restart's replacement: the DaemonSet wants 3,
// and the pod on n2 waits for n1's replacement (simulator seeds 1435,
// 1972).
func TestEstimateTakesNoPodOnANodeComeBackForAReplacement(t *testing.T) {
	onNode := func(p *fakePod, node string) {
		p.owner, p.ownerKind, p.ready = "web-ds", "DaemonSet", true
		p.spec = `{"nodeName":"` + node + `","containers":[{"name":"app","image":"webapp:1"}]}`
	}
	pods := podsOf("RR")
	onNode(pods[0], "n1")
	onNode(pods[1], "n2")
	api := newFakeAPI(t, pods...) // no replacement until the test makes it
	_, fewestReady := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.removedPods()) == 1 }, waitFor, time.Millisecond)
	require.Equal(t, []string{"web-1"}, api.removedPods())

	// Node n3 comes back while web-1's replacement is missing.
	waited := m.Reconciles.Value(resultWaiting)
	api.mu.Lock()
	*fewestReady = 1 << 30 // web-1's deletion left web-2 alone, as the budget allows
	back := api.addPodLocked("web-3", map[string]string{"app": "webapp"})
	onNode(api.pods[back.name], "n3")
	api.mu.Unlock()
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= waited+3 || len(api.removedPods()) > 1 }, waitFor, time.Millisecond)

	api.addWeb1Replacement(func(r *fakePod) { onNode(r, "n1") })
	require.Eventually(t, func() bool { return len(api.removedPods()) == 2 }, waitFor, time.Millisecond)
	assert.Equal(t, 2, api.read(fewestReady), "3 expected once n3 is back, a budget of 1: web-2 waits for web-1's replacement")
}

// TestResumedRoundOwesNoPodItsOwnerDoesNotReplace ensures a round that
// resumes an intent owes the one owner its view shows no pod gone that
// this owner will not replace, and so restarts its next pod at once
// (budget 1), not after the 2 minutes a restart counts in flight: a
// ReplicaSet's pod the earlier process restarted, whose replacement runs
// beside a DaemonSet's only pod (simulator seed 203), and a bare pod it
// restarted beside a DaemonSet's 3, the intent grouping them by owner (seed
// 481).
func TestResumedRoundOwesNoPodItsOwnerDoesNotReplace(t *testing.T) {
	for _, tt := range []struct {
		name   string
		pods   func() []*fakePod
		intent string // after the digest
		want   []string
	}{
		{"ReplacedUnderAnotherOwner", func() []*fakePod {
			pods := podsOf("RR")
			pods[0].owner, pods[0].ownerKind = "web-ds", "DaemonSet"
			pods[1].name, pods[1].uid = "web-2-r", "uid-2-r" // web-2 (uid-2) restarted, its replacement Ready
			return pods
		}, "uid-1,uid-2", []string{"web-1"}},
		{"BarePodBesideTheOwnerShown", func() []*fakePod {
			pods := podsOf("RRR")
			for _, p := range pods {
				p.owner, p.ownerKind = "web-ds", "DaemonSet"
			}
			pods[0].name, pods[0].uid = "web-1-r", "uid-1-r" // web-1 restarted, its replacement Ready; web-4, bare, restarted
			return pods
		}, "uid-1,uid-2,uid-3,,uid-4", []string{"web-2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, tt.pods()...)
			c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: hashOf(t, v2) + "/" + tt.intent})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 3 || len(api.removedPods()) > 0 }, waitFor, time.Millisecond)

			assert.Equal(t, tt.want, api.removedPods(), "the DaemonSet misses no pod")
		})
	}
}

// TestResumedRoundOwesNoReplacementARestartInFlightOwes ensures a round
// that resumes an intent naming four pods of a DaemonSet (n0 and n1
// restarted by the earlier process, their replacements shown; n2 just
// restarted by another object's round of this term, its replacement still
// to come; n3 shown) owes nothing more: n2's missing replacement is owed
// by its own restart in flight, and owed again, the estimate counted one
// pod more for the 2 minutes a restart counts in flight, holding every
// round over the DaemonSet (simulator seed 8092). Where the earlier
// process restarted n2 too, the round owes its replacement.
func TestResumedRoundOwesNoReplacementARestartInFlightOwes(t *testing.T) {
	view := []livePod{daemonSetPod("n0-r", "n0"), daemonSetPod("n1-r", "n1"), daemonSetPod("n3", "n3")}
	for _, tt := range []struct {
		name         string
		n2InFlight   bool
		wantInFlight int
	}{
		{"RestartedByThisTerm", true, 1},
		{"RestartedByTheEarlierProcess", false, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := &namespaceBudget{inFlight: map[string]restartChosen{}}
			b.noteShown(view)
			if tt.n2InFlight {
				b.inFlight["n2"] = restartChosen{at: time.Now(), by: "ns/other", pod: "n2", owner: testDS.uid, count: b.counts, node: "n2"}
			}
			b.oweResumed(webappRound(t, "n0", "n1", "n2", "n3"), view, time.Now())
			assert.Len(t, b.inFlight, tt.wantInFlight, "restarts in flight, the one owed included")
			assert.Equal(t, 1, b.owed(testDS.uid, ownedLive(view), nil), "n2's replacement is still to come: one owed")
		})
	}
}

// TestResumedRoundOwesNoneWhoseReplacementThisTermRestarted ensures a
// round that resumes an intent naming a DaemonSet's n0 (gone: the earlier
// process restarted it) and n1 (shown) owes n0 no replacement where n0's
// replacement was shown to this process and restarted by another object's
// round of this term before this one took its view: that restart in flight
// owes the one replacement n0's node lacks, and owed again, the estimate
// counted one pod more for leftAfter, holding every round over the
// DaemonSet (simulator seed 4814).
func TestResumedRoundOwesNoneWhoseReplacementThisTermRestarted(t *testing.T) {
	view := []livePod{daemonSetPod("n1", "n1")}
	b := &namespaceBudget{inFlight: map[string]restartChosen{}}
	b.noteShown([]livePod{daemonSetPod("n0-r", "n0"), daemonSetPod("n1", "n1")})
	b.inFlight["n0-r"] = restartChosen{at: time.Now(), by: "ns/other", pod: "n0-r", owner: testDS.uid, count: b.counts, node: "n0", shown: daemonSetPod("n0-r", "n0")}
	b.oweResumed(webappRound(t, "n0", "n1"), view, time.Now())
	assert.Len(t, b.inFlight, 1, "no resumed restart owed beside n0-r's")
	assert.Equal(t, 1, b.owed(testDS.uid, ownedLive(view), nil), "one replacement still to come, on n0")
}

// TestResumedRestartIsOwedForLeftAfter ensures the replacement a resumed
// round owes for a gone pod its intent names (an earlier process's
// restart, or a pod gone with a DaemonSet's node removed while no replica
// ran: the controller cannot tell) counts for leftAfter, as a pod gone by
// other hands, not for the 2 minutes of a restart of its own: a DaemonSet
// of 2 pods, one node removed before the process began, held every round
// over it that long (simulator seed 5013).
func TestResumedRestartIsOwedForLeftAfter(t *testing.T) {
	view := []livePod{daemonSetPod("n1", "n1")}
	b := &namespaceBudget{inFlight: map[string]restartChosen{}}
	resumed := time.Now()
	b.oweResumed(webappRound(t, "n0", "n1"), view, resumed)
	require.Equal(t, 1, b.owed(testDS.uid, ownedLive(view), nil), "n0's replacement owed")

	b.prune(resumed.Add(leftAfter - time.Millisecond))
	assert.Equal(t, 1, b.owed(testDS.uid, ownedLive(view), nil), "owed until leftAfter")
	b.prune(resumed.Add(leftAfter))
	assert.Zero(t, b.owed(testDS.uid, ownedLive(view), nil), "owed no longer")
}

// TestOwnerWithOnlyUnselectedPodsShownStillCounts ensures a round keeps
// counting an owner whose pods it selects it has all restarted, their
// replacements not created yet, while the view still shows another pod of
// that owner it does not select: a DaemonSet of 2 (one pod selected) beside
// a ReplicaSet's 4, MAX_UNAVAILABLE 50 %, the DaemonSet's selected pod and
// one of the ReplicaSet's restarted: 5 expected and 3 available let no
// pod go, where counting the ReplicaSet alone (4, 3) let a third go
// (simulator seeds 9565, 7481).
func TestOwnerWithOnlyUnselectedPodsShownStillCounts(t *testing.T) {
	c, _ := newTestController(t, newFakeAPI(t).client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 50}})
	b := c.budgetOf("ns")
	rs := ownerRef{apiVersion: "apps/v1", kind: "ReplicaSet", name: "web-rs", uid: "rs-uid"}
	rsPod := func(uid string) livePod {
		return livePod{podRef: podRef{name: uid, uid: uid, ownerUID: rs.uid}, labels: map[string]string{"app": "webapp"}, owner: rs, ready: true}
	}
	other := daemonSetPod("n1", "n1")
	other.labels = map[string]string{"app": "other"}
	view := []livePod{daemonSetPod("n0", "n0"), other, rsPod("r1"), rsPod("r2"), rsPod("r3"), rsPod("r4")}
	r := webappRound(t)
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Equal(t, 2, c.count(b, r, view, now).allowed(), "5 expected, 5 available")
	for _, p := range []livePod{view[0], view[2]} { // n0 and r1 restarted
		b.inFlight[p.uid] = restartChosen{at: now, by: r.key, pod: p.name, owner: p.owner.uid, count: b.counts, node: p.node, shown: p}
	}

	after := []livePod{other, rsPod("r2"), rsPod("r3"), rsPod("r4")} // no replacement yet
	assert.Zero(t, c.count(b, r, after, now).allowed(), "5 expected, 3 available")
}

// TestOwnerWhosePodTheRoundSelectedIsReplacedUnselectedCountsNoMore
// ensures an owner a round counted through one pod it selects (labelled by
// hand: the owner's template does not carry the label), that pod restarted
// by another object's round, counts only until the replacement shows: the
// replacement, from the template, is not the round's, and an owner none of
// whose pods the round selects counts none of its replicas, as the
// disruption controller's. Counted on, each restart of that owner's other
// pods would be one more down of the round's, and the other object's round
// would wait on this one's budget, spent on its own pods, for nothing.
func TestOwnerWhosePodTheRoundSelectedIsReplacedUnselectedCountsNoMore(t *testing.T) {
	c, _ := newTestController(t, newFakeAPI(t).client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}})
	b := c.budgetOf("ns")
	batch := ownerRef{apiVersion: "apps/v1", kind: "ReplicaSet", name: "batch-rs", uid: "batch-uid"}
	web := ownerRef{apiVersion: "apps/v1", kind: "ReplicaSet", name: "web-rs", uid: "web-uid"}
	pod := func(owner ownerRef, uid, app string, ready bool) livePod {
		return livePod{podRef: podRef{name: uid, uid: uid, ownerUID: owner.uid}, labels: map[string]string{"app": app}, owner: owner, ready: ready}
	}
	labelled := pod(batch, "b1", "webapp", true) // by hand
	b2, b3 := pod(batch, "b2", "batch", true), pod(batch, "b3", "batch", true)
	w1, w2 := pod(web, "w1", "webapp", true), pod(web, "w2", "webapp", false) // one of the round's own down
	r := webappRound(t)
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	c.count(b, r, []livePod{labelled, b2, b3, w1, w2}, now)
	b.inFlight[labelled.uid] = restartChosen{at: now, by: "ns/batch-config", pod: labelled.name, owner: batch.uid, count: b.counts, shown: labelled}

	before := []livePod{b2, b3, w1, w2} // no replacement yet
	assert.False(t, c.count(b, r, before, now).allows(&b2), "the labelled pod's replacement is still due: b2 down would be one more of the round's")

	after := []livePod{pod(batch, "b4", "batch", true), b2, b3, w1, w2}
	assert.True(t, c.count(b, r, after, now).allows(&b2), "the replacement shown is not the round's: b2 bears on it no more")
}

// testDS owns daemonSetPod's pods.
var testDS = ownerRef{apiVersion: "apps/v1", kind: "DaemonSet", name: "web-ds", uid: "ds-uid"}

// daemonSetPod is a Ready pod of testDS on node, labelled app=webapp.
func daemonSetPod(uid, node string) livePod {
	return livePod{podRef: podRef{name: uid, uid: uid, ownerUID: testDS.uid}, labels: map[string]string{"app": "webapp"}, owner: testDS, ready: true, node: node}
}

// webappRound is a round over app=webapp that resumed an intent naming
// the pods of uids (none: a round that resumed nothing).
func webappRound(t *testing.T, uids ...string) *round {
	sel, err := selector.Parse("app=webapp")
	require.NoError(t, err)
	var only map[string]bool
	for _, uid := range uids {
		if only == nil {
			only = map[string]bool{}
		}
		only[uid] = true
	}
	return &round{key: "ns/webapp-config", sel: &selection{labels: sel}, only: only}
}

// TestRoundBegunJustAfterAPodLeftCountsIt ensures a round that begins just
// after a DaemonSet's pod was deleted by other hands (its replacement not
// created yet), counted live by the round it superseded, still counts it
// in the owner's estimate for leftAfter: 2 expected, 1 available, a budget
// of 1 lets no pod go, where the round's own first view showed 1 pod and
// let its last one go (simulator seed 4506, a storm's round superseded).
func TestRoundBegunJustAfterAPodLeftCountsIt(t *testing.T) {
	c, _ := newTestController(t, newFakeAPI(t).client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}})
	b := c.budgetOf("ns")
	now := time.Now()
	b.mu.Lock()
	c.count(b, webappRound(t), []livePod{daemonSetPod("n0", "n0"), daemonSetPod("n1", "n1")}, now) // the superseded round's last count
	b.mu.Unlock()

	view := []livePod{daemonSetPod("n1", "n1")} // n0 deleted by other hands
	r := webappRound(t)
	c.take(b, object{namespace: "ns", name: "webapp-config"}, r, view, nil, math.MaxUint64, c.log)
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Zero(t, c.count(b, r, view, now).allowed(), "2 expected, 1 available")
	assert.Equal(t, 1, c.count(b, r, view, now.Add(leftAfter)).allowed(), "n0 left leftAfter ago: 1 expected")
}

// TestIntentGroupsItsPodsByOwner ensures the intent names a round's pods
// by owner, bare pods together, and that a reader without the groups
// (every version before them) reads the same pods from it.
func TestIntentGroupsItsPodsByOwner(t *testing.T) {
	pods := []podRef{{uid: "a1", ownerUID: "a"}, {uid: "b1"}, {uid: "a2", ownerUID: "a"}, {uid: "c1", ownerUID: "c"}}
	hash, _ := parseDigest(hashOf(t, v2))
	in := newIntent(hash, pods)
	assert.Equal(t, hashOf(t, v2)+"/a1,a2,,b1,,c1", in.text)
	assert.Equal(t, [][]string{{"a1", "a2"}, {"b1"}, {"c1"}}, in.groups())
	assert.Equal(t, map[string]bool{"a1": true, "a2": true, "b1": true, "c1": true}, in.uids())
	assert.Len(t, parseIntent(hashOf(t, v2)+"/a1,a2,b1").groups(), 1, "an intent without groups is one")
}

// TestOwnerWithEveryPodRestartedStillCounts ensures a round over two
// owners keeps counting one whose every pod it restarted before any
// replacement exists: the view shows none of its pods, and counting only
// the owners it shows, a budget of 2 over 4 pods lets a third go.
func TestOwnerWithEveryPodRestartedStillCounts(t *testing.T) {
	pods := podsOf("RRRR")
	pods[0].owner, pods[0].ownerKind = "web-ds", "DaemonSet" // web-1, alone on its owner
	api := newFakeAPI(t, pods...)                            // no replacement: the owners are slow
	_, fewestReady := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 2}, ProgressDeadline: time.Hour})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.removedPods()) >= 2 }, waitFor, time.Millisecond)
	waited := m.Reconciles.Value(resultWaiting)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= waited+3 || len(api.removedPods()) > 2 }, waitFor, time.Millisecond)

	assert.ElementsMatch(t, []string{"web-1", "web-2"}, api.removedPods())
	assert.Equal(t, 2, api.read(fewestReady), "4 expected, a budget of 2")
}

// TestOwnerScaledToZeroMidRoundIsReadAgain ensures a round that still
// counts an owner none of whose pods it sees (each restarted, or all gone)
// reads that owner's scale again: scaled to zero meanwhile, it wants none,
// and its remembered count must not stall the round over the other owner.
func TestOwnerScaledToZeroMidRoundIsReadAgain(t *testing.T) {
	pods := podsOf("RRRRR")
	pods[0].owner, pods[1].owner = "a-rs", "a-rs" // web-1 and web-2; web-3 to web-5 are web-rs's
	api := newFakeAPI(t, pods...)
	api.replaceNotReady()
	api.readyOnceListed()
	replace := api.afterDelete
	api.afterDelete = func(p fakePod) {
		replace(p)
		if p.name != "web-1" {
			return
		}
		// a-rs is scaled to zero right after its first restart.
		api.owners["a-rs"].replicas = 0
		delete(api.pods, "web-1-r")
		delete(api.pods, "web-2")
	}
	most, _ := downAtDeletion(api, webapp)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"web-1", "web-3", "web-4", "web-5"}, api.deletedPods())
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.Equal(t, 1, *most)
}

// TestRoundResumedAgainOwesNoMore ensures a round that resumes an intent
// this process already resumed (its selector narrowed meanwhile) owes its
// gone pods no second time: the first resume owed what the earlier
// process left in flight, and owing again, with the replacement no longer
// selected, holds its owner's other rounds for 2 minutes (simulator seed
// 497, and 481's second resume).
func TestRoundResumedAgainOwesNoMore(t *testing.T) {
	pods := podsOf("RR")
	for _, p := range pods {
		p.owner, p.ownerKind = "web-ds", "DaemonSet"
	}
	pods[0].labels = map[string]string{"app": "webapp", "tier": "front"}
	pods[1].name, pods[1].uid = "web-4", "uid-4" // web-2's or web-3's replacement, not named
	api := newFakeAPI(t, pods...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
	start(t, c)
	intent := hashOf(t, v2) + "/uid-1,uid-2,uid-3"
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, intent: intent})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 2 }, waitFor, time.Millisecond)
	owed := func() int {
		b := c.budgetOf("ns")
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.inFlight)
	}
	require.Equal(t, 1, owed(), "web-2 and web-3 gone, one replacement: one owed")

	waited := m.Reconciles.Value(resultWaiting)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("tier=front"), recorded: hashOf(t, v1), data: v2, intent: intent})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= waited+2 || len(api.removedPods()) > 0 }, waitFor, time.Millisecond)
	assert.Equal(t, 1, owed(), "the same intent, resumed again: nothing more owed")
}

// TestDeletedObjectsRoundHoldsNoOtherRoundsBudget ensures a round its
// object's deletion ended keeps no other round from the pods it selected:
// a's round over a ReplicaSet of 2 (MAX_UNAVAILABLE=50%) restarts its
// crash-looping pod and waits, its replacement starting, to restart the
// other; a is deleted, and b's round over those pods and 4 more restarts
// that other pod in its first wave, within its own budget (2 of 6), as if
// a had never been: a no longer asks anything of them.
func TestDeletedObjectsRoundHoldsNoOtherRoundsBudget(t *testing.T) {
	pods := append(owned("ds", 2), owned("web", 4)...)
	pods[1].ready, pods[1].waiting = false, "CrashLoopBackOff"
	api := newFakeAPI(t, pods...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		x := mirror(t, api, api.replacement)
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 50}, ProgressDeadline: time.Hour, Pods: oneIndex{x: x}})
		c.wavePoll = time.Hour
		start(t, c)
		a := cmSpec{name: "a", uid: "uid-cm-a", selector: ptr("app=ds"), recorded: hashOf(t, v1), data: v2}
		handle(t, c, watch.Modified, a)
		synctest.Wait()
		require.Equal(t, []string{"ds-2"}, api.removedPods(), "a restarts the broken pod, and waits for its replacement to keep ds-1")

		handle(t, c, watch.Deleted, a)
		handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-cm-b", selector: ptr("app in (ds,web)"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait()
		assert.Contains(t, api.removedPods(), "ds-1", "b's first wave: 5 of 6 available, 3 may be unavailable")
	})
}

// TestDeletedObjectsRoundWakesTheRoundsItHeldBack ensures a round waiting
// only on the budget of another object's round goes on as soon as that
// object is deleted, not at its next look: b's round (resumed, over ds-1
// alone, its budget 2 of 6) waits on a's (ds-1 is the only available pod
// of a's 2), and restarts ds-1 once a is gone.
func TestDeletedObjectsRoundWakesTheRoundsItHeldBack(t *testing.T) {
	pods := append(owned("ds", 2), owned("web", 4)...)
	pods[1].ready, pods[1].waiting = false, "CrashLoopBackOff"
	api := newFakeAPI(t, pods...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		x := mirror(t, api, api.replacement)
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 50}, ProgressDeadline: time.Hour, Pods: oneIndex{x: x}})
		c.wavePoll = time.Hour
		start(t, c)
		a := cmSpec{name: "a", uid: "uid-cm-a", selector: ptr("app=ds"), recorded: hashOf(t, v1), data: v2}
		handle(t, c, watch.Modified, a)
		synctest.Wait()
		handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-cm-b", selector: ptr("app in (ds,web)"), recorded: hashOf(t, v1), data: v2, intent: hashOf(t, v2) + "/uid-ds-1"})
		synctest.Wait()
		require.Equal(t, []string{"ds-2"}, api.removedPods(), "b waits on a's budget for ds-1")

		handle(t, c, watch.Deleted, a)
		synctest.Wait()
		assert.Equal(t, []string{"ds-1", "ds-2"}, api.removedPods(), "b goes on at a's deletion")
	})
}
