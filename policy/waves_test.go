package policy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/truncate"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// podsOf makes pods web-1, web-2, … from a pattern, one letter each: R a
// Ready pod a ReplicaSet owns, N one that is not Ready, B a Ready pod
// nothing owns.
func podsOf(pattern string) []*fakePod {
	var pods []*fakePod
	for i, kind := range pattern {
		p := &fakePod{name: fmt.Sprintf("web-%d", i+1), uid: fmt.Sprintf("uid-%d", i+1), labels: map[string]string{"app": "webapp"}, owner: "web-rs", ready: kind != 'N'}
		if kind == 'B' {
			p.owner = ""
		}
		if kind == 'N' {
			p.waiting = "CrashLoopBackOff"
		}
		pods = append(pods, p)
	}
	return pods
}

// replaceDeleted has the fake's ReplicaSet replace each deleted pod it owns
// with a new one, Ready if ready says so.
func (f *fakeAPI) replaceDeleted(ready func() bool) {
	f.afterDelete = func(p fakePod) {
		if p.owner == "" {
			return
		}
		r := f.addPodLocked(p.name+"-r", p.labels)
		n := f.pods[r.name]
		n.owner, n.ready = p.owner, ready()
		if !n.ready {
			n.waiting = "CrashLoopBackOff"
		}
	}
}

// readyCount counts the selected, non-terminating, owned Ready pods.
func (f *fakeAPI) readyCount(matches func(map[string]string) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readyCountLocked(matches)
}

func (f *fakeAPI) readyCountLocked(matches func(map[string]string) bool) int {
	n := 0
	for _, p := range f.pods {
		if p.ready && !p.terminating && p.owner != "" && matches(p.labels) {
			n++
		}
	}
	return n
}

// makeReady sets every pod Ready, at a new revision each, as a kubelet does.
func (f *fakeAPI) makeReady() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pods {
		if !p.ready {
			f.revision++
			p.ready, p.waiting, p.version = true, "", f.revision
		}
	}
}

func webapp(labels map[string]string) bool { return labels["app"] == "webapp" }

var v3 = map[string]string{"message": "Hello, fixed"}

// shortOf is the short digest of data, as Events show it.
func shortOf(t *testing.T, data map[string]string) string {
	d, ok := parseDigest(hashOf(t, data))
	require.True(t, ok)
	return truncate.String(d.text(), len(digestPrefix)+12)
}

func hasReason(rec *fakeRecorder, reason string) func() bool {
	return func() bool { return slices.Contains(rec.reasons(), "ConfigMap/"+reason) }
}

func eventText(rec *fakeRecorder, reason string) string {
	for _, e := range rec.all() {
		if e.reason == reason {
			return e.typ + ": " + e.message
		}
	}
	return ""
}

// TestBudgetRule ensures each wave restarts what MAX_UNAVAILABLE allows and
// no more, with replacements that never become Ready: the pods restarted
// are those of the first wave, and the round halts with the rest pending.
func TestBudgetRule(t *testing.T) {
	for _, tt := range []struct {
		name        string
		pods        string
		budget      Budget
		wantDeleted []string
	}{
		{"ReadyWithinTheBudget", "RRRRRRRR", Budget{Pods: 2}, []string{"web-1", "web-2"}},
		{"NotReadyFirstAndAlways", "RRNN", Budget{Percent: 25}, []string{"web-3", "web-4"}},
		{"NotReadyFirstThenReadyWithinTheBudget", "RRRRRRRN", Budget{Pods: 2}, []string{"web-8", "web-1"}},
		{"PercentRoundsDown", "RRRRRRR", Budget{Percent: 25}, []string{"web-1"}},
		{"PercentAtLeastOne", "RR", Budget{Percent: 25}, []string{"web-1"}},
		{"SingleReplicaRestarted", "R", Budget{Percent: 25}, []string{"web-1"}},
		{"AllAtOnce", "RRRR", Budget{Percent: 100}, []string{"web-1", "web-2", "web-3", "web-4"}},
		{"UnownedNotCountedAndRestarted", "RRRRB", Budget{Pods: 1}, []string{"web-5", "web-1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, podsOf(tt.pods)...)
			api.replaceDeleted(func() bool { return false })
			rec := &fakeRecorder{}
			c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: tt.budget, ProgressDeadline: 50 * time.Millisecond, Events: rec})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			if len(tt.wantDeleted) == len(tt.pods) {
				require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			} else {
				require.Eventually(t, hasReason(rec, "RolloutHalted"), waitFor, time.Millisecond)
				assert.Empty(t, api.recordedHashes(), "a halted round records nothing")
			}
			assert.ElementsMatch(t, tt.wantDeleted, api.deletedPods(), "a wave's restarts go out at once")
		})
	}
}

// TestWavesKeepTheFloor ensures a rollout over 8 Ready pods with
// MAX_UNAVAILABLE=2, whose replacements become Ready a wave later, never
// leaves fewer than 6 Ready (checked at each deletion, replacements
// counted), restarts each pod once, and completes.
func TestWavesKeepTheFloor(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRRRRRR")...)
	api.replaceDeleted(func() bool { return false })
	lowest := 8
	replace := api.afterDelete
	api.afterDelete = func(p fakePod) {
		replace(p)
		lowest = min(lowest, api.readyCountLocked(webapp))
	}
	// The kubelet: a replacement becomes Ready once a list has shown it not
	// Ready, so that every wave but the first sees some not Ready.
	shown := map[string]bool{}
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodGet {
			api.mu.Lock()
			for _, p := range api.pods {
				if !p.ready && shown[p.name] {
					api.revision++
					p.ready, p.version = true, api.revision
				}
				shown[p.name] = true
			}
			api.mu.Unlock()
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 2}})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.Equal(t, 6, lowest)
	assert.ElementsMatch(t, []string{"web-1", "web-2", "web-3", "web-4", "web-5", "web-6", "web-7", "web-8"}, api.removed)
	assert.Greater(t, m.Reconciles.Value(resultWaiting), uint64(0), "it waited between waves")
}

// halted starts a round from v1 to v2 over pods (see podsOf) whose
// replacements never become Ready, with the default budget and a
// PROGRESS_DEADLINE of 50 ms, and returns once it halted.
func halted(t *testing.T, pods string) (*fakeAPI, *Controller, *Metrics, *fakeRecorder) {
	api := newFakeAPI(t, podsOf(pods)...)
	api.replaceDeleted(func() bool { return false })
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 50 * time.Millisecond, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, hasReason(rec, "RolloutHalted"), waitFor, time.Millisecond)
	return api, c, m, rec
}

// TestHaltedRoundResumesWhenPodsBecomeReady ensures a round whose
// replacements stay not Ready halts after PROGRESS_DEADLINE: a Warning
// Event that says after how many pods and why, the gauge at 1, the intent
// kept; once they become Ready, the round goes on by itself and completes.
func TestHaltedRoundResumesWhenPodsBecomeReady(t *testing.T) {
	api, _, m, rec := halted(t, "RRRRRR")
	assert.Equal(t, "Warning: Halted after 1 of 6 pods: 1 replacement(s) not Ready for 50ms: CrashLoopBackOff in container app (pod web-1-r)."+
		" The round keeps its intent and goes on by itself when pods become Ready; a new data change restarts the pods that are not Ready first.",
		eventText(rec, "RolloutHalted"))
	assert.Equal(t, 1.0, m.RoundsHalted.Value())
	assert.Empty(t, api.recordedHashes())
	assert.Len(t, api.intents(), 1, "the intent stays")

	api.replaceDeleted(func() bool { return true })
	api.makeReady()
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
	assert.Equal(t, "Normal: Resumed after 1 of 6 pods: a restart became possible again.", eventText(rec, "RolloutResumed"))
	assert.Equal(t, 0.0, m.RoundsHalted.Value())
	assert.Len(t, api.deletedPods(), 6)
}

// TestNewChangeWhileHaltedRestartsNotReadyFirst ensures a data change (the
// fix) while a round is halted on replacements that are not Ready begins a
// new round whose first restart is such a replacement, and which completes
// once the new data makes pods Ready.
func TestNewChangeWhileHaltedRestartsNotReadyFirst(t *testing.T) {
	api, c, m, _ := halted(t, "RRRR")
	require.Equal(t, []string{"web-1"}, api.deletedPods())

	api.replaceDeleted(func() bool { return true }) // the fixed data works
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v3, intent: api.intents()[0]})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	deleted := api.deletedPods()
	require.Greater(t, len(deleted), 1)
	assert.Equal(t, "web-1-r", deleted[1], "the not-Ready replacement goes first")
	assert.ElementsMatch(t, []string{"web-1", "web-1-r", "web-2", "web-3", "web-4"}, deleted)
	assert.Equal(t, []string{hashOf(t, v3)}, api.recordedHashes())
	assert.Equal(t, 0.0, m.RoundsHalted.Value(), "the halted round gave way")
}

// TestRoundWhosePodsAnotherRoundRestartsDoesNotHalt ensures a round over
// pods that another round of its namespace restarts, taking the budget
// first at every wave, does not halt after PROGRESS_DEADLINE: its pods are
// done with all the same (halted, without an index, it would look only
// every 10 s once the budget is free).
func TestRoundWhosePodsAnotherRoundRestartsDoesNotHalt(t *testing.T) {
	api := newFakeAPI(t, owned("webapp", 8)...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		readyAfter := func(p *fakePod, d time.Duration) {
			time.AfterFunc(d, func() { // the kubelet
				api.mu.Lock()
				defer api.mu.Unlock()
				api.becomeReady(p)
			})
		}
		api.afterDelete = func(p fakePod) { readyAfter(api.replacement(p), time.Second) }
		rec := &fakeRecorder{}
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: 3 * time.Second, Events: rec})
		start(t, c)
		for _, name := range []string{"cm-a", "cm-b"} {
			handle(t, c, watch.Modified, cmSpec{name: name, uid: "uid-" + name, selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
		}
		time.Sleep(20 * time.Second) // 8 restarts a second apart, past the deadline
		synctest.Wait()
		assert.Len(t, api.recordedHashes(), 2, "both rounds completed")
		assert.Subset(t, api.removedPods(), []string{"webapp-1", "webapp-2", "webapp-3", "webapp-4", "webapp-5", "webapp-6", "webapp-7", "webapp-8"})
		assert.NotContains(t, rec.reasons(), "ConfigMap/RolloutHalted")
	})
}

// TestPodRelabelledBetweenWavesIsLeft ensures a pod relabelled out of the
// selector while its round waits is not restarted, is counted left, and no
// longer counts in N: the round completes instead of waiting for a Ready
// pod that left.
func TestPodRelabelledBetweenWavesIsLeft(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.replaceDeleted(func() bool { return false })
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 1 }, waitFor, time.Millisecond)
	api.relabel("web-2", map[string]string{"app": "quarantine"})
	api.replaceDeleted(func() bool { return true })
	api.makeReady()
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"web-1", "web-3", "web-4"}, api.deletedPods())
	assert.Equal(t, uint64(1), m.PodDeletions.Value("left"))
}

// TestOverlappingRoundsShareTheBudget ensures a ConfigMap whose selector
// overlaps another's does not take the pods of the other's round below that
// round's floor: web-1..4 are selected by both (25% of 4: 1), x-5..8, of
// the same ReplicaSet, by the second only (25% of 8: 2); while the first
// waits for its replacement, the second restarts that replacement (not
// Ready), not web-2, and no x pod: one gone would be one more of the
// ReplicaSet's 8 expected among the first's (25% of 5: 1, 3 available).
func TestOverlappingRoundsShareTheBudget(t *testing.T) {
	pods := podsOf("RRRRRRRR")
	for i, p := range pods {
		p.labels["tier"] = "web"
		if i >= 4 {
			p.name = fmt.Sprintf("x-%d", i+1)
			delete(p.labels, "app")
		}
	}
	api := newFakeAPI(t, pods...)
	api.replaceDeleted(func() bool { return false })
	c, m := newTestController(t, api.client(), Config{RecordHash: true, ProgressDeadline: 100 * time.Millisecond})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-a", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return slices.Contains(api.deletedPods(), "web-1") }, waitFor, time.Millisecond)
	handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-b", selector: ptr("tier=web"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.RoundsHalted.Value() == 2 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"web-1", "web-1-r"}, api.deletedPods())
	assert.Equal(t, 3, api.readyCount(webapp))
}

// TestWaitingRoundFreesItsWorker ensures a round waiting for replacements
// holds no worker: with one worker, another ConfigMap's round completes
// while the first one waits.
func TestWaitingRoundFreesItsWorker(t *testing.T) {
	pods := podsOf("RRRR")
	other := &fakePod{name: "api-1", uid: "uid-api", labels: map[string]string{"app": "api"}, owner: "api-rs", ready: true}
	api := newFakeAPI(t, append(pods, other)...)
	api.replaceDeleted(func() bool { return false })
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Workers: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{name: "web", uid: "uid-web", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 2 }, waitFor, time.Millisecond)
	handle(t, c, watch.Modified, cmSpec{name: "api", uid: "uid-api-cm", selector: ptr("app=api"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return slices.Contains(api.deletedPods(), "api-1") }, waitFor, time.Millisecond)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes(), "only the api ConfigMap's round completed")
}

// TestLastLookReportsReplacementsNotReady ensures that PROGRESS_DEADLINE
// after a round's last restart, replacements still not Ready get a Warning
// Event and the counter, and Ready ones nothing; the round has recorded R
// already either way.
func TestLastLookReportsReplacementsNotReady(t *testing.T) {
	notReady := "Warning: 2 replacement(s) not Ready 50ms after the last restart for data " + shortOf(t, v2) +
		": CrashLoopBackOff in container app (pod web-1-r). Every selected pod was restarted; check the new data."
	for _, tt := range []struct {
		name  string
		ready bool
		// recordSeenFirst: the record's own event comes back before the
		// answer to its write, as a warm API server's watch may send it.
		recordSeenFirst bool
		want            string
	}{
		{"NotReadyReported", false, false, notReady},
		{"NotReadyReportedWhenTheRecordIsSeenFirst", false, true, notReady},
		{"ReadyQuiet", true, false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, podsOf("RR")...)
			api.replaceDeleted(func() bool { return tt.ready })
			rec := &fakeRecorder{}
			c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, ProgressDeadline: 50 * time.Millisecond, Events: rec})
			if tt.recordSeenFirst {
				api.fault = func(r request) (int, string, bool) {
					if r.method == http.MethodPatch && strings.Contains(r.body, RestartedForAnnotation) {
						handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2})
					}
					return 0, "", false
				}
			}
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
			if tt.want == "" {
				// The look is due 50 ms after the round: wait until it was taken.
				require.Eventually(t, func() bool { return m.Reconciles.Value(resultUnchanged) >= 1 }, waitFor, time.Millisecond)
				assert.Empty(t, eventText(rec, "ReplacementsNotReady"))
				assert.Zero(t, m.ReplacementsNotReady.Value())
				return
			}
			require.Eventually(t, hasReason(rec, "ReplacementsNotReady"), waitFor, time.Millisecond)
			assert.Equal(t, tt.want, eventText(rec, "ReplacementsNotReady"))
			assert.Equal(t, uint64(1), m.ReplacementsNotReady.Value())
		})
	}
}

// TestDryRunIgnoresTheBudget ensures a dry run, in which no pod goes away,
// tells every pod it would restart in one wave instead of halting.
func TestDryRunIgnoresTheBudget(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, DryRun: true, MaxUnavailable: Budget{Pods: 1}})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Len(t, api.seen(http.MethodDelete, "pods"), 4)
	assert.Len(t, api.pods, 4, "no pod deleted")
}

// TestParseBudget ensures MAX_UNAVAILABLE takes a count or a percentage
// and refuses the rest, and how many pods of N each allows.
func TestParseBudget(t *testing.T) {
	for _, tt := range []struct {
		in      string
		wantErr bool
		n, want int // of n pods, want may be unavailable
	}{
		{in: "25%", n: 8, want: 2},
		{in: "25%", n: 7, want: 1},
		{in: "25%", n: 3, want: 1},
		{in: "25%", n: 0, want: 1},
		{in: "100%", n: 5, want: 5},
		{in: "1%", n: 1000, want: 10},
		{in: "2", n: 8, want: 2},
		{in: "20", n: 8, want: 20},
		{in: "0", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "0%", wantErr: true},
		{in: "101%", wantErr: true},
		{in: "2.5%", wantErr: true},
		{in: "", wantErr: true},
		{in: "%", wantErr: true},
		{in: "a lot", wantErr: true},
	} {
		t.Run(strings.ReplaceAll(tt.in, "%", "pct")+"/"+fmt.Sprint(tt.n), func(t *testing.T) {
			b, err := ParseBudget(tt.in)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.in, b.String())
			assert.Equal(t, tt.want, b.of(tt.n))
		})
	}
}

// TestLooksDueLaterAreNotQueueDepth ensures the work queue's depth counts
// keys waiting for a worker and retries, not a finished round's last look
// due PROGRESS_DEADLINE later: an idle controller shows 0.
func TestLooksDueLaterAreNotQueueDepth(t *testing.T) {
	api := newFakeAPI(t, podsOf("RR")...)
	api.replaceDeleted(func() bool { return true })
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, 1, c.queue.Len(), "the last look is due in 10 min")
	assert.Zero(t, m.QueueDepth.Value())
}

// TestWholePodsFromARecordedList ensures a wave reads what it decides on
// from a pod list as kube-apiserver answers it (testdata/recorded: the
// webapp's two pods, Pending on a control plane without a node): names,
// uids, resourceVersions, labels, the ReplicaSet as controller, and not
// Ready with the reason the Event would give.
func TestWholePodsFromARecordedList(t *testing.T) {
	list, err := os.ReadFile("../testdata/recorded/pods-list.json")
	require.NoError(t, err)
	pods, err := listAnswered(t, list, func(r *http.Request) {
		assert.Equal(t, "app=webapp", r.URL.Query().Get("labelSelector"))
		assert.Equal(t, "application/json", r.Header.Get("Accept"), "whole pods: readiness is in their status")
	})
	require.NoError(t, err)
	require.Len(t, pods, 2)
	for _, p := range pods {
		assert.True(t, strings.HasPrefix(p.name, "webapp-"), p.name)
		assert.NotEmpty(t, p.uid)
		assert.NotZero(t, p.version, "resourceVersion %q", p.rv)
		assert.Equal(t, "webapp", p.labels["app"])
		assert.True(t, p.owned(), "a ReplicaSet controls it")
		assert.Equal(t, "ReplicaSet", p.owner.kind)
		assert.Equal(t, "apps/v1", p.owner.apiVersion)
		assert.NotEmpty(t, p.owner.uid)
		assert.False(t, p.ready)
		assert.False(t, p.terminating)
		assert.Equal(t, "phase Pending", p.why)
	}
}

// TestPodListCutShortListsAgain ensures a pod list that ends mid-page, or
// is not a list, fails the wave (it is retried) instead of passing for the
// pods read so far: a round must not decide on part of a list.
func TestPodListCutShortListsAgain(t *testing.T) {
	list, err := os.ReadFile("../testdata/recorded/pods-list.json")
	require.NoError(t, err)
	for name, body := range map[string][]byte{
		"CutShort":  list[:len(list)*2/3],
		"NotAList":  []byte(`{"items":{"a":1}}`),
		"NotJSON":   []byte(`<html>bad gateway</html>`),
		"ItemsCut":  []byte(`{"metadata":{},"items":[{"metadata":{"name":"webapp-1"`),
		"TrailingX": append(append([]byte{}, list...), 'x'),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := listAnswered(t, body, nil)
			assert.Error(t, err)
		})
	}
}

// listAnswered lists the pods app=webapp selects from a server that answers
// body; check, if set, sees the request.
func listAnswered(t *testing.T, body []byte, check func(r *http.Request)) ([]livePod, error) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if check != nil {
			check(r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	client, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	c, _ := newTestController(t, client, Config{})
	sel, err := selector.Parse("app=webapp")
	require.NoError(t, err)
	return c.listWhole(t.Context(), "default", &selection{labels: sel})
}

// TestRoundKeepsTheBudgetOfAChangeWhoseRoundHasNotBegun ensures a restart
// keeps the budget of another object whose change is known and whose round
// has not begun yet (one worker, busy with this round: a controller just
// started begins one round at a time), not only of those begun: tier=web's
// pods, two of six not Ready, allow no Ready one to go, though app=webapp's
// four Ready ones would allow one (simulator seed 147).
func TestRoundKeepsTheBudgetOfAChangeWhoseRoundHasNotBegun(t *testing.T) {
	pods := podsOf("RRRRNN")
	for i, p := range pods {
		p.labels["tier"] = "web"
		if i >= 4 {
			p.name, p.owner = fmt.Sprintf("x-%d", i+1), "x-rs"
			delete(p.labels, "app")
		}
	}
	api := newFakeAPI(t, pods...)
	m := bChangedDuringAsFirstList(t, api, Config{MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: 100 * time.Millisecond})
	require.Eventually(t, func() bool { return m.RoundsHalted.Value() == 2 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"x-5", "x-6"}, api.deletedPods(), "b's pods that serve nothing, outside the budget; no Ready one")
	assert.Equal(t, 4, api.readyCount(webapp))
}

// TestRestartOfAPodAnotherRoundDoesNotSelectKeepsItsBudget ensures a
// wave's restart of a pod another round does not select, of an owner whose
// other pods that round selects, counts in that round's budget: expected
// pods are the owner's desired replicas less those the round does not
// select, so one of those gone is one more expected of its own. a
// (app=webapp) may restart 2 of web-1..4 at 50 %; b (tier=web: web-2,
// relabelled into it, and x-5) allows 1 of its 2 expected, and web-1's
// restart makes that 0 of 3: web-2 waits, web-3 goes.
func TestRestartOfAPodAnotherRoundDoesNotSelectKeepsItsBudget(t *testing.T) {
	pods := append(podsOf("RRRR"), &fakePod{name: "x-5", uid: "uid-5", labels: map[string]string{"tier": "web"}, owner: "x-rs", ready: true})
	pods[1].labels["tier"] = "web"
	api := newFakeAPI(t, pods...)
	bChangedDuringAsFirstList(t, api, Config{MaxUnavailable: Budget{Percent: 50}, ProgressDeadline: time.Minute})
	require.Eventually(t, func() bool { return len(api.deletedPods()) >= 2 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"web-1", "web-3"}, api.deletedPods()[:2], "a's first wave")
}

// TestRoundOverItsBudgetTakesNoMoreOfItsOwnersPods ensures a restart that
// takes one more of a round's expected pods down is refused while that
// round is over its budget, though a percentage's budget grows with
// expected as much: b (tier=web: web-2, and x-5 and x-6, crash-looping)
// expects 3 and has 1 available at 50 % (2 must be); web-1's restart would
// make that 4 expected, 1 available, 2 allowed down: 3 down. a restarts
// nothing; b restarts its crash-looping pods, outside the budget.
func TestRoundOverItsBudgetTakesNoMoreOfItsOwnersPods(t *testing.T) {
	pods := podsOf("RRRR")
	pods[1].labels["tier"] = "web"
	for _, name := range []string{"x-5", "x-6"} {
		pods = append(pods, &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"tier": "web"}, owner: "x-rs", waiting: "CrashLoopBackOff"})
	}
	api := newFakeAPI(t, pods...)
	m := bChangedDuringAsFirstList(t, api, Config{MaxUnavailable: Budget{Percent: 50}, ProgressDeadline: 100 * time.Millisecond})
	require.Eventually(t, func() bool { return m.RoundsHalted.Value() == 2 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"x-5", "x-6"}, api.deletedPods())
}

// bChangedDuringAsFirstList starts a controller with one worker over api
// (replacements never Ready), a's change (app=webapp) first; b's
// (tier=web) is seen while a's first wave reads the pods: known, its round
// not begun.
func bChangedDuringAsFirstList(t *testing.T, api *fakeAPI, cfg Config) *Metrics {
	api.replaceDeleted(func() bool { return false })
	listing, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") {
			once.Do(func() { close(listing); <-release })
		}
		return 0, "", false
	}
	cfg.RecordHash, cfg.Workers = true, 1
	c, m := newTestController(t, api.client(), cfg)
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-a", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	<-listing // a's first wave reads the pods
	handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-b", selector: ptr("tier=web"), recorded: hashOf(t, v1), data: v2})
	close(release)
	return m
}
