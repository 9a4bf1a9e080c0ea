package policy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// mirror returns a pod index that listed the fake's pods and goes on
// seeing its deletions and their replacements (replace, if set, makes one
// for a deleted pod, with f.mu held), as a watch shows them: each event at
// its revision, so that the index catches up to a DELETE's answer.
func mirror(t *testing.T, f *fakeAPI, replace func(p fakePod) *fakePod) *podindex.Index {
	x := indexOf(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	x.BeginList()
	for _, p := range f.pods {
		x.Handle(podEvent(t, watch.Synced, *p))
	}
	x.EndList()
	x.Progress(strconv.FormatUint(f.revision, 10))
	f.afterDelete = func(p fakePod) {
		if f.graceful {
			x.Handle(podEvent(t, watch.Modified, *f.pods[p.name]))
		} else {
			p.version = f.revision
			x.Handle(podEvent(t, watch.Deleted, p))
		}
		if replace != nil {
			if r := replace(p); r != nil {
				x.Handle(podEvent(t, watch.Added, *r))
			}
		}
	}
	return x
}

// owned makes n Ready pods of ReplicaSet rs, labelled app=app.
func owned(app string, n int) []*fakePod {
	var pods []*fakePod
	for i := range n {
		name := app + "-" + strconv.Itoa(i+1)
		pods = append(pods, &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"app": app}, ready: true, owner: app + "-rs"})
	}
	return pods
}

// replacement has the fake's ReplicaSet replace a deleted pod with one
// that is not Ready yet. f.mu must be held.
func (f *fakeAPI) replacement(p fakePod) *fakePod {
	r := f.addPodLocked(p.name+"r", p.labels)
	n := f.pods[r.name]
	n.owner, n.readySince = p.owner, time.Now()
	return n
}

// addReadyShown adds a Ready pod of owner, as its ReplicaSet and the
// kubelet would, and shows it to the index x.
func (f *fakeAPI) addReadyShown(t *testing.T, x *podindex.Index, name, owner string, labels map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pods[f.addPodLocked(name, labels).name]
	p.owner, p.ready, p.readySince = owner, true, time.Now()
	x.Handle(podEvent(t, watch.Added, *p))
}

// podLists returns the pod LISTs the fake served (not DELETEs, evictions,
// scale reads).
func (f *fakeAPI) podLists() []request {
	var out []request
	for _, r := range f.seen(http.MethodGet, "pods") {
		if strings.HasSuffix(r.path, "/pods") {
			out = append(out, r)
		}
	}
	return out
}

// firstPages counts the LISTs in lists, each by its first page.
func firstPages(lists []request) int {
	n := 0
	for _, l := range lists {
		if _, next := l.query["continue"]; !next {
			n++
		}
	}
	return n
}

// TestMembershipBound ensures a round that began from the index completes
// its membership from the index once it has caught up to the bound (its
// first DELETE's answer), with no pod LIST: a pod created just before the
// bound that the index showed late is restarted, named in the intent
// first; one created just after it (a replacement) is left; a pod that came
// in a list, whose creation the index did not see, counts as older and is
// restarted; where the index does not catch up in time, one sweep LIST
// decides.
func TestMembershipBound(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	tests := []struct {
		name string
		// deleting runs as webapp-1 is deleted, before its DELETE answers
		// and before the index sees it, with api.mu held; deleted runs
		// once the index has seen it.
		deleting    func(t *testing.T, api *fakeAPI, x *podindex.Index)
		deleted     func(t *testing.T, api *fakeAPI, x *podindex.Index)
		quiet       bool // the index sees no event after the round began
		wantRemoved []string
		wantIntent  []string // uids in the last intent written
		wantLists   int
	}{{
		name: "a pod created just before the bound, seen late, is restarted",
		deleting: func(t *testing.T, api *fakeAPI, x *podindex.Index) {
			// Created before the deletion, its ADDED event delivered after
			// the round took its pods.
			x.Handle(podEvent(t, watch.Added, *api.pods["straggler"]))
		},
		wantRemoved: []string{"straggler", "webapp-1"},
		wantIntent:  []string{"uid-1", "uid-s"},
	}, {
		name:     "a pod created just after the bound is left",
		deleting: func(t *testing.T, api *fakeAPI, x *podindex.Index) { delete(api.pods, "straggler") },
		deleted: func(t *testing.T, api *fakeAPI, x *podindex.Index) {
			x.Handle(podEvent(t, watch.Added, api.addPodLocked("late", web))) // a revision after the deletion's
		},
		wantRemoved: []string{"webapp-1"},
		wantIntent:  []string{"uid-1"},
	}, {
		name: "a pod that came in a list counts as older, wherever it was created",
		deleting: func(t *testing.T, api *fakeAPI, x *podindex.Index) {
			delete(api.pods, "straggler")
			api.revision += 2
			relisted := &fakePod{name: "relisted", uid: "uid-r", labels: web, version: api.revision + 1}
			api.pods["relisted"] = relisted
			x.BeginList()
			for _, p := range api.pods {
				x.Handle(podEvent(t, watch.Synced, *p))
			}
			x.EndList()
			x.Progress(strconv.FormatUint(api.revision+2, 10))
		},
		wantRemoved: []string{"relisted", "webapp-1"},
		wantIntent:  []string{"uid-1", "uid-r"},
		wantLists:   0, // its creation unknown, it counts as older: the index, caught up, decides
	}, {
		name:        "an index that does not catch up: one sweep LIST",
		quiet:       true,
		wantRemoved: []string{"straggler", "webapp-1"},
		wantIntent:  []string{"uid-1", "uid-s"},
		wantLists:   1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := &fakePod{name: "webapp-1", uid: "uid-1", labels: web}
			api := newFakeAPI(t, first)
			x := mirror(t, api, nil) // the index shows webapp-1 only
			api.mu.Lock()
			api.pods["straggler"] = &fakePod{name: "straggler", uid: "uid-s", labels: web, version: api.revision + 1}
			api.revision++
			api.mu.Unlock()
			deleteEvent := api.afterDelete
			var once sync.Once
			api.afterDelete = func(p fakePod) {
				once.Do(func() {
					if tt.deleting != nil {
						tt.deleting(t, api, x)
					}
				})
				if !tt.quiet {
					deleteEvent(p)
				}
				if tt.deleted != nil {
					tt.deleted(t, api, x)
				}
			}
			c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
			c.sweepWait = 2 * time.Second // the index catches up at once, or never
			start(t, c)

			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			settle(t, c)

			assert.Equal(t, tt.wantRemoved, api.removedPods())
			intents := api.intents()
			require.GreaterOrEqual(t, len(intents), 2)
			assert.Empty(t, intents[len(intents)-1], "the record ends the round")
			for _, uid := range tt.wantIntent {
				assert.Contains(t, intents[len(intents)-2], uid, "the intent names every pod before it goes")
			}
			lists := api.podLists()
			assert.Len(t, lists, tt.wantLists, "pod LISTs: %v", lists)
			for _, l := range lists {
				assert.Equal(t, []string{"app=webapp"}, l.query["labelSelector"], "a sweep lists the selected pods")
			}
		})
	}
}

// TestMembershipBoundTakesNoTerminationItCannotTellOurs ensures a pod that
// someone else deleted before the change was seen, shown running by an
// index behind, bounds nothing when the round's DELETE of it has no answer
// that says it was the round's (a 500, a failed precondition): its
// replacement, created before the change, is restarted too.
func TestMembershipBoundTakesNoTerminationItCannotTellOurs(t *testing.T) {
	for _, tt := range []struct {
		name     string
		graceful bool
		answer   int // the round's first DELETE of webapp-1: 0, the server's own (409)
	}{
		{name: "its DELETE answered 500, the pod gone", answer: http.StatusInternalServerError},
		{name: "its DELETE refused for the precondition, the pod terminating", graceful: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			web := map[string]string{"app": "webapp"}
			api := newFakeAPI(t, &fakePod{name: "webapp-1", uid: "uid-1", labels: web}, &fakePod{name: "webapp-2", uid: "uid-2", labels: web})
			api.graceful = tt.graceful
			x := mirror(t, api, nil) // shows webapp-1 and webapp-2 running
			// Before the change, unseen by the index yet: webapp-1 is
			// deleted by someone else, and its ReplicaSet replaces it.
			api.mu.Lock()
			gone := *api.pods["webapp-1"]
			api.revision++
			gone.version = api.revision
			if tt.graceful {
				api.pods["webapp-1"].terminating, api.pods["webapp-1"].version = true, gone.version
				gone.terminating = true
			} else {
				delete(api.pods, "webapp-1")
			}
			replacement := api.addPodLocked("webapp-1r", web)
			api.mu.Unlock()
			var once sync.Once
			api.fault = func(r request) (int, string, bool) {
				if r.method != http.MethodDelete || !strings.HasSuffix(r.path, "/webapp-1") {
					return 0, "", false
				}
				caughtUp := false
				once.Do(func() {
					// The index catches up as the round's DELETE is sent.
					typ := watch.Deleted
					if tt.graceful {
						typ = watch.Modified
					}
					x.Handle(podEvent(t, typ, gone))
					x.Handle(podEvent(t, watch.Added, replacement))
					caughtUp = true
				})
				if caughtUp && tt.answer != 0 {
					return tt.answer, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}`, true
				}
				return 0, "", false
			}
			c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
			c.sweepWait = 2 * time.Second
			start(t, c)

			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
			settle(t, c)

			assert.Contains(t, api.removedPods(), "webapp-1r", "the replacement, created before the change, was left on the old data")
			assert.NotContains(t, api.removedPods(), "webapp-1", "someone else deleted it")
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
		})
	}
}

// TestMembershipBoundOfEvictions ensures a round whose restarts answer no
// revision (evictions) takes its bound from a consistent LIST of one pod,
// no resourceVersion, and completes its membership from the index once it
// has caught up to that: no other pod LIST.
func TestMembershipBoundOfEvictions(t *testing.T) {
	pods := owned("webapp", 3)
	api := newFakeAPI(t, pods...)
	x := mirror(t, api, nil)
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") {
			x.Progress("100") // the fake's LIST revision, as a bookmark shows it soon after
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true, Strategy: StrategyEvict}, x))
	c.sweepWait = 10 * time.Second // never reached: a sweep would fail the test
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)

	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.evictedPods())
	lists := api.podLists()
	require.Len(t, lists, 1, "the bound's LIST only")
	assert.Equal(t, []string{"1"}, lists[0].query["limit"])
	assert.NotContains(t, lists[0].query, "resourceVersion", "a consistent read")
}

// TestWavesWakeOnReadiness ensures a round in waves that decides from the
// index reads no pod LIST, and is woken by the index when a replacement
// becomes Ready: with polling set an hour apart, the next wave follows
// the readiness change, not a poll.
func TestWavesWakeOnReadiness(t *testing.T) {
	pods := owned("webapp", 3)
	api := newFakeAPI(t, pods...)
	x := mirror(t, api, api.replacement)
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour}
	c, m := startWaves(t, api.client(), cfg, x)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	for n := 1; n <= 3; n++ {
		// Well within lookEvery: a look by itself would come too late.
		require.Eventually(t, func() bool { return len(api.removedPods()) == n }, lookEvery/4, time.Millisecond, "restart %d", n)
		// The replacement becomes Ready, as its kubelet says.
		api.mu.Lock()
		var ready *fakePod
		for _, p := range api.pods {
			if !p.ready {
				ready = p
			}
		}
		require.NotNil(t, ready)
		api.becomeReady(ready)
		api.mu.Unlock()
		x.Handle(podEvent(t, watch.Modified, *ready))
	}
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Empty(t, api.podLists(), "every wave decided from the index")
}

// TestWaveCountsOnTheIndexAfterItsScaleReads ensures a wave that decides
// from the index counts on the index as it is once its owners' scale is
// read, not as it was before: a pod that goes not Ready (simulator seeds
// 1622, 1811), or a pod of its own deleted by other hands (seed 995),
// while the read is slow (4 Ready pods, MAX_UNAVAILABLE=1) leaves no pod to
// restart, where the view taken before the read, still showing it Ready,
// allowed one.
func TestWaveCountsOnTheIndexAfterItsScaleReads(t *testing.T) {
	for _, tt := range []struct {
		name string
		// meanwhile happens to webapp-4 while the scale is read; it
		// returns the event the pods watch shows. api.mu is held.
		meanwhile func(api *fakeAPI, p *fakePod) watch.Event
	}{
		{"PodGoneNotReady", func(api *fakeAPI, p *fakePod) watch.Event { // its probe fails
			api.revision++
			p.ready, p.version, p.readySince = false, api.revision, time.Now()
			return podEvent(t, watch.Modified, *p)
		}},
		{"PodDeletedByOthers", func(api *fakeAPI, p *fakePod) watch.Event { // kubectl delete pod
			delete(api.pods, p.name)
			api.revision++
			gone := *p
			gone.version = api.revision
			return podEvent(t, watch.Deleted, gone)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, owned("webapp", 4)...)
			x := mirror(t, api, nil)
			waveWithScaleReadMeanwhile(t, api, x, func() { x.Handle(tt.meanwhile(api, api.pods["webapp-4"])) })
			assert.Empty(t, api.removedPods(), "4 expected, 3 available with a budget of 1: no pod may go")
		})
	}
}

// TestWaveListsAgainWhenANewerListAnsweredDuringItsReads ensures a wave
// that decides on its own LIST (no index) counts on the newest view the
// controller was shown: a LIST of the namespace by another round that
// answers while the wave's scale read is out, showing a pod gone not Ready
// (4 Ready pods, MAX_UNAVAILABLE=1), makes the wave list again, and no pod
// goes, where its own older LIST allowed one (simulator seeds 2649, 7618).
// With no newer LIST, the wave lists once: a LIST per wave stays the cost.
func TestWaveListsAgainWhenANewerListAnsweredDuringItsReads(t *testing.T) {
	for _, tt := range []struct {
		name        string
		otherLists  bool
		wantRemoved int
		wantLists   int // pod LISTs sent before the wave's decision
	}{
		{"AnotherRoundListedMeanwhile", true, 0, 3},
		{"NoNewerList", false, 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, owned("webapp", 4)...)
			api.listsAtRevision = true
			cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour}
			c, m := newTestController(t, api.client(), cfg)
			c.wavePoll = time.Hour
			var read, decided atomic.Bool
			var listsBefore atomic.Int64
			api.fault = func(r request) (int, string, bool) {
				switch {
				case strings.HasSuffix(r.path, "/scale") && read.CompareAndSwap(false, true) && tt.otherLists:
					api.mu.Lock()
					p := api.pods["webapp-4"] // its probe fails
					api.revision++
					p.ready, p.version, p.readySince = false, api.revision, time.Now()
					api.mu.Unlock()
					_, _, err := c.viewOf(context.Background(), "ns", &round{}) // another round's wave
					require.NoError(t, err)
				case r.method == http.MethodDelete && decided.CompareAndSwap(false, true):
					listsBefore.Store(int64(firstPages(api.podLists())))
				}
				return 0, "", false
			}
			start(t, c)

			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 1 }, waitFor, time.Millisecond)
			require.True(t, read.Load(), "the scale was read")
			assert.Len(t, api.removedPods(), tt.wantRemoved)
			if !decided.Load() {
				listsBefore.Store(int64(firstPages(api.podLists())))
			}
			assert.EqualValues(t, tt.wantLists, listsBefore.Load(), "pod LISTs before the wave decided")
		})
	}
}

// TestWaveCountsOnAnIndexSyncedDuringItsScaleReads ensures a wave that
// listed its pods, the index not synced yet (a controller just started),
// counts on the index once it has synced while the owners' scale was read:
// a pod the index shows not Ready (4 pods, MAX_UNAVAILABLE=1) leaves no pod
// to restart, where the wave's own older LIST, still showing it Ready,
// allowed one (simulator seed 2203: a DaemonSet's pod for a node come back,
// created after the LIST, shown by the index).
func TestWaveCountsOnAnIndexSyncedDuringItsScaleReads(t *testing.T) {
	api := newFakeAPI(t, owned("webapp", 4)...)
	x := podindex.New(slog.New(slog.NewTextHandler(io.Discard, nil))) // not listed yet
	waveWithScaleReadMeanwhile(t, api, x, func() {
		p := api.pods["webapp-4"] // its probe fails
		api.revision++
		p.ready, p.version, p.readySince = false, api.revision, time.Now()
		x.BeginList() // it lists now, and shows the probe's failure
		for _, p := range api.pods {
			x.Handle(podEvent(t, watch.Synced, *p))
		}
		x.EndList()
		x.Progress(strconv.FormatUint(api.revision, 10))
	})
	require.NotEmpty(t, api.podLists(), "the wave listed: the index had not synced")
	assert.Empty(t, api.removedPods(), "4 expected, 3 available with a budget of 1: no pod may go")
}

// TestWaveCountsARoundOfAChangeSeenWhileItsScaleReadIsSlow ensures a wave
// counts the budget of a round whose change was seen while its owners'
// scale reads were out, not begun yet (one worker, busy with the wave): 8
// Ready pods, MAX_UNAVAILABLE=25 %, the wave's object selecting all (2 may
// go), the other 4 of them (1 may go), so one of those 4 goes, where the
// rounds listed before the reads allowed two (simulator seed 5654).
func TestWaveCountsARoundOfAChangeSeenWhileItsScaleReadIsSlow(t *testing.T) {
	api := newFakeAPI(t, append(owned("webapp", 4), owned("zz", 4)...)...)
	x := mirror(t, api, nil)
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Percent: 25}, ProgressDeadline: time.Hour, Workers: 1}
	c, m := startWaves(t, api.client(), cfg, x)
	web := cmSpec{name: "web-config", uid: "cm-uid-web", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1}
	handle(t, c, watch.Modified, web)
	settle(t, c)

	var changed atomic.Bool
	api.fault = func(r request) (int, string, bool) {
		if strings.HasSuffix(r.path, "/scale") && changed.CompareAndSwap(false, true) {
			web.data = v2 // its change, seen while the scale is read
			handle(t, c, watch.Modified, web)
		}
		return 0, "", false
	}
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app in (webapp,zz)"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 1 || len(api.removedPods()) > 1 }, waitFor, time.Millisecond)
	require.True(t, changed.Load(), "the scale was read")
	assert.ElementsMatch(t, []string{"webapp-1", "zz-1"}, api.removedPods(), "web-config's 4 pods allow 1 unavailable, the 8 of both 2")
}

// TestWavesLookAgainWhenMinReadySecondsElapse ensures a waiting round looks
// again by itself when a replacement has been Ready for MinReadySeconds,
// which no event tells.
func TestWavesLookAgainWhenMinReadySecondsElapse(t *testing.T) {
	const minReady = 2 * time.Second
	pods := owned("webapp", 2)
	api := newFakeAPI(t, pods...)
	x := mirror(t, api, func(p fakePod) *fakePod {
		r := api.replacement(p)
		r.ready = true // Ready at once, available only after minReady
		return r
	})
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, MinReadySeconds: minReady, ProgressDeadline: time.Hour}
	c, m := startWaves(t, api.client(), cfg, x)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	// Well within lookEvery: a look by itself would come too late.
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, lookEvery/4, time.Millisecond)
	assert.Len(t, api.removedPods(), 2)
	assert.Empty(t, api.podLists())
}

// TestRoundsOfANamespaceSendSideBySide ensures two rounds of one namespace
// have their requests in flight together: each decides under the
// namespace's lock, and sends outside it. The fake holds every DELETE until
// both rounds have sent one.
func TestRoundsOfANamespaceSendSideBySide(t *testing.T) {
	pods := append(owned("a", 4), owned("b", 4)...)
	api := newFakeAPI(t, pods...)
	x := mirror(t, api, api.replacement)
	both := make(chan struct{})
	var mu sync.Mutex
	inFlight := map[string]bool{} // by app
	api.fault = func(r request) (int, string, bool) {
		if r.method != http.MethodDelete {
			return 0, "", false
		}
		name := r.path[strings.LastIndexByte(r.path, '/')+1:]
		mu.Lock()
		inFlight[name[:1]] = true
		if len(inFlight) == 2 {
			select {
			case <-both:
			default:
				close(both)
			}
		}
		mu.Unlock()
		select {
		case <-both:
		case <-time.After(5 * time.Second): // the other round never sent: the assertion below fails
		}
		return 0, "", false
	}
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour, Workers: 2}
	cfg.Pods = oneIndex{x: x}
	c, _ := newTestController(t, api.client(), cfg)
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-cm-a", selector: ptr("app=a"), recorded: hashOf(t, v1), data: v2})
	handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-cm-b", selector: ptr("app=b"), recorded: hashOf(t, v1), data: v2})
	select {
	case <-both:
	case <-time.After(waitFor):
		t.Fatal("the two rounds' DELETEs were never in flight together")
	}
}

// TestListedAndIndexedPodsDecideAlike ensures a LIST's pods and the index's
// are read by the same parser: the recorded Running pod, listed and
// indexed, is the same livePod (owner, Ready and since when).
func TestListedAndIndexedPodsDecideAlike(t *testing.T) {
	body, err := os.ReadFile("../testdata/recorded/pods-running-list.json")
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	t.Cleanup(srv.Close)
	api := &fakeAPI{t: t, srv: srv}
	c, _ := newTestController(t, api.client(), Config{})
	listed, _, err := c.listNamespace(context.Background(), "default")
	require.NoError(t, err)
	require.Len(t, listed, 1)

	x := indexOf(t)
	x.Handle(watch.Event{Type: watch.Added, Object: []byte(strings.TrimSpace(itemOf(t, body)))})
	recs, ok := x.View("default")
	require.True(t, ok)
	require.Len(t, recs, 1)
	assert.Equal(t, listed[0], fromRecord(recs[0]))
	assert.Equal(t, "ReplicaSet", listed[0].owner.kind)
	assert.True(t, listed[0].available(0, time.Now()))
}

// itemOf returns the first item of a recorded list.
func itemOf(t *testing.T, list []byte) string {
	item := gjson.GetBytes(list, "items.0")
	require.True(t, item.Exists())
	return item.Raw
}

// TestOpaqueBoundCountsEveryPodAsOlder ensures a bound LIST whose revision
// is not a decimal number is compared with nothing: every pod the sweep
// shows counts as created before the round, a replacement included (a
// restart too many, never a pod left behind), and it is said once.
func TestOpaqueBoundCountsEveryPodAsOlder(t *testing.T) {
	pods := owned("webapp", 1)
	api := newFakeAPI(t, pods...)
	x := mirror(t, api, api.replacement)
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") && strings.Join(r.query["limit"], "") == "1" {
			return http.StatusOK, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"opaque-7"},"items":[]}`, true
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true, Strategy: StrategyEvict}, x))
	var said atomic.Int32
	c.log = slog.New(countingHandler{&said, "pod resourceVersions are not decimal numbers"})
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"webapp-1", "webapp-1r"}, api.evictedPods(), "the replacement counted as older")
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v1})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 2 }, waitFor, time.Millisecond)
	assert.Equal(t, int32(1), said.Load(), "said once")
}

// countingHandler counts the log records whose message starts with prefix.
type countingHandler struct {
	n      *atomic.Int32
	prefix string
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestEstimateCountsNoReplacementTwice ensures a round whose owner's scale
// cannot be read does not count a ReplicaSet's replacement and the pod it
// replaces (terminating through its grace period) as two expected pods,
// which would take the budget's last pod for ever: the next Ready pod goes
// once the replacement is Ready.
func TestEstimateCountsNoReplacementTwice(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRR")...)
	api.graceful = true // the old pod stays, terminating, beside its replacement
	api.replaceNotReady()
	api.readyOnceListed()
	listed := api.fault
	api.fault = func(r request) (int, string, bool) {
		if strings.HasSuffix(r.path, "/scale") {
			return 403, `{"kind":"Status","code":403,"reason":"Forbidden","message":"cannot get resource \"replicasets/scale\""}`, true
		}
		return listed(r)
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{"web-1", "web-2", "web-3"}, api.removedPods())
}

// changedInBubble starts, inside a synctest bubble, a controller over
// api's pods as an index mirrors them (MAX_UNAVAILABLE=budget pods, looks
// only when woken, no deadline), shows it a data change of the ConfigMap
// selecting them and waits for its first wave; it returns the index.
func changedInBubble(t *testing.T, api *fakeAPI, budget int) *podindex.Index {
	x, _ := changedInBubbleWith(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Pods: budget}, ProgressDeadline: time.Hour})
	return x
}

// startWaves starts a controller whose rounds decide from the index x and
// look again only when it wakes them (no poll).
func startWaves(t *testing.T, api API, cfg Config, x *podindex.Index) (*Controller, *Metrics) {
	cfg.Pods = oneIndex{x: x}
	c, m := newTestController(t, api, cfg)
	c.wavePoll = time.Hour
	start(t, c)
	return c, m
}

// changedInBubbleWith is changedInBubble with the settings of cfg; it
// returns the controller's metrics too.
func changedInBubbleWith(t *testing.T, api *fakeAPI, cfg Config) (*podindex.Index, *Metrics) {
	x := mirror(t, api, api.replacement)
	c, m := startWaves(t, memAPI{api}, cfg, x)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	synctest.Wait()
	return x, m
}

// TestWavesGoOnOnceTheScaleGoesDown ensures a round whose owner is scaled
// down mid-round (8 Ready pods, MAX_UNAVAILABLE=2, the ReplicaSet scaled
// to 4 after the first wave, its replacements still starting) restarts
// the next pods within a second of its replacements' readiness, on
// synctest's clock: the waves the scale-down's deletions and the
// readiness woke decided on the scale read before them (8), and no pod
// event tells of the new one; a look a minute later is a stall.
func TestWavesGoOnOnceTheScaleGoesDown(t *testing.T) {
	api := newFakeAPI(t, owned("webapp", 8)...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		x := changedInBubble(t, api, 2)
		first := api.removedPods()
		require.Len(t, first, 2, "the first wave")

		// The Deployment scaled to 4: its ReplicaSet wants 4 and deletes
		// 4 of the 6 old pods left, keeping the 2 starting replacements.
		api.mu.Lock()
		api.owners["webapp-rs"].replicas = 4
		var kept, starting []*fakePod
		for _, name := range slices.Sorted(maps.Keys(api.pods)) {
			switch p := api.pods[name]; {
			case !p.ready:
				starting = append(starting, p)
			case len(kept) < 2:
				kept = append(kept, p)
			default:
				delete(api.pods, name)
				api.revision++
				p.version = api.revision
				x.Handle(podEvent(t, watch.Deleted, *p))
			}
		}
		api.mu.Unlock()
		require.Len(t, starting, 2)
		synctest.Wait()
		require.Len(t, api.removedPods(), 2, "8 expected (as read before the scale-down), 2 available")

		// The replacements become Ready.
		api.mu.Lock()
		for _, p := range starting {
			api.becomeReady(p)
			x.Handle(podEvent(t, watch.Modified, *p))
		}
		api.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, slices.Sorted(slices.Values(append(first, kept[0].name, kept[1].name))), api.removedPods(),
			"4 expected, 4 available: the 2 old pods left go within a second of the replacements' readiness")
	})
}

// TestScaleUpWithinASecondOfTheReadKeepsTheBudget ensures a wave that would
// restart a Ready pod reads its owner's scale again when the read it has
// is older than its view: a ReplicaSet of 4 (MAX_UNAVAILABLE=1) scaled to
// 5 half a second after the read, its new pod not created yet, while the
// first restart's replacement becomes Ready, counts 5 expected and 4
// available, and restarts nothing until the new pod is Ready. The kept
// read (4) restarts a second pod. One read more, in that wave only.
func TestScaleUpWithinASecondOfTheReadKeepsTheBudget(t *testing.T) {
	api := newFakeAPI(t, owned("webapp", 4)...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		x := changedInBubble(t, api, 1)
		require.Equal(t, []string{"webapp-1"}, api.removedPods(), "the first wave")
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		reads := len(api.seen(http.MethodGet, "scale"))

		// Scaled to 5; the replacement becomes Ready before the new pod exists.
		api.mu.Lock()
		api.owners["webapp-rs"].replicas = 5
		p := api.pods["webapp-1r"]
		api.becomeReady(p)
		x.Handle(podEvent(t, watch.Modified, *p))
		api.mu.Unlock()
		synctest.Wait()
		assert.Equal(t, []string{"webapp-1"}, api.removedPods(), "5 expected, 4 available: no pod may go")
		assert.Len(t, api.seen(http.MethodGet, "scale"), reads+1, "the scale read again once")

		api.addReadyShown(t, x, "webapp-5", "webapp-rs", map[string]string{"app": "webapp"}) // the scale-up's pod
		synctest.Wait()
		assert.Equal(t, []string{"webapp-1", "webapp-2"}, api.removedPods(), "5 available: the next pod goes")
	})
}

// TestReadyPodIsChosenOnlyWithItsTokenDue ensures a Ready pod is chosen
// only while a token of MAX_RESTARTS_PER_SECOND is due now, so that its
// restart is sent on the count that chose it: of 12 pods (MAX_UNAVAILABLE
// 11, a burst of 10 tokens) the first wave restarts 10; the eleventh,
// whose token comes a second later, is counted again then. A pod gone
// unavailable meanwhile (simulator seed 124: a scale-down between the count
// and the send) leaves no budget for it until a replacement is Ready; with
// nothing changed, it goes when its token is due, with no pod event.
func TestReadyPodIsChosenOnlyWithItsTokenDue(t *testing.T) {
	for _, unready := range []bool{true, false} {
		t.Run(fmt.Sprintf("a pod unready meanwhile %v", unready), func(t *testing.T) {
			api := newFakeAPI(t, owned("webapp", 12)...) // its server, a socket, outside the bubble
			synctest.Test(t, func(t *testing.T) {
				x, _ := changedInBubbleWith(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Pods: 11}, MaxRestartsPerSecond: 1, ProgressDeadline: time.Hour})
				first := api.removedPods()
				require.Len(t, first, 10, "the first wave: the tokens due now")
				require.NotContains(t, first, "webapp-8")
				if !unready {
					time.Sleep(time.Second)
					synctest.Wait()
					assert.Contains(t, api.removedPods(), "webapp-8", "its token due, the count allows it")
					return
				}

				time.Sleep(500 * time.Millisecond)
				api.mu.Lock()
				p := api.pods["webapp-9"]
				api.revision++
				p.ready, p.version, p.readySince = false, api.revision, time.Now()
				x.Handle(podEvent(t, watch.Modified, *p))
				api.mu.Unlock()
				time.Sleep(2 * time.Second)
				synctest.Wait()
				assert.Equal(t, first, api.removedPods(), "12 expected, webapp-8 the only one available: it may not go")

				api.mu.Lock()
				p = api.pods["webapp-1r"]
				api.becomeReady(p)
				x.Handle(podEvent(t, watch.Modified, *p))
				api.mu.Unlock()
				synctest.Wait()
				assert.Contains(t, api.removedPods(), "webapp-8", "a replacement Ready: one more may go")
			})
		})
	}
}

// TestRoundsWaitingForATokenGetThemInTurn ensures rounds whose Ready pods
// wait for tokens of MAX_RESTARTS_PER_SECOND get them in the order they
// asked, not in the order their keys wake (one worker: keys due together
// go in key order): b's round (11 pods, a burst of 10) waits for the token
// due a second later; a's, whose change came half a second after, waits
// for the one after it (simulator seed 549: a's key woke first at every
// token and held b's Ready pods for seconds).
func TestRoundsWaitingForATokenGetThemInTurn(t *testing.T) {
	api := newFakeAPI(t, append(owned("api", 11), owned("web", 2)...)...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		x := mirror(t, api, api.replacement)
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, Workers: 1, MaxUnavailable: Budget{Pods: 11}, MaxRestartsPerSecond: 1, ProgressDeadline: time.Hour, Pods: oneIndex{x: x}})
		c.wavePoll = time.Hour
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{name: "b", uid: "uid-b", selector: ptr("app=api"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait()
		require.Len(t, api.removedPods(), 10, "b's first wave: the tokens due now")
		time.Sleep(500 * time.Millisecond)
		handle(t, c, watch.Modified, cmSpec{name: "a", uid: "uid-a", selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait()
		require.Len(t, api.removedPods(), 10, "no token due for a")

		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		assert.Contains(t, api.removedPods(), "api-9", "b asked first: the token goes to it")
		assert.NotContains(t, api.removedPods(), "web-1")
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Contains(t, api.removedPods(), "web-1", "a's turn, a second later")
	})
}

// TestScaleReadWithoutAnAnswerRestartsNoReadyPod ensures a wave whose read
// of an owner's scale gets no answer that tells (a 500) restarts no Ready
// pod on an estimate, as the disruption controller allows no disruption
// while it cannot count, says so once (a Warning Event, the metric), and
// reads it again a second later: a ReplicaSet of 4 (MAX_UNAVAILABLE=1)
// scaled to 5, its new pod not created yet, while the first restart's
// replacement becomes Ready, is 5 expected and 4 available, which the
// estimate from its pods (4) cannot tell (simulator seeds 1683, 1716,
// 2229). A read that never answers halts the round at PROGRESS_DEADLINE,
// its RolloutHalted naming the scale.
func TestScaleReadWithoutAnAnswerRestartsNoReadyPod(t *testing.T) {
	for _, answers := range []bool{true, false} {
		t.Run(fmt.Sprintf("answers again %v", answers), func(t *testing.T) {
			api := newFakeAPI(t, owned("webapp", 4)...) // its server, a socket, outside the bubble
			synctest.Test(t, func(t *testing.T) {
				rec := &fakeRecorder{}
				x, m := changedInBubbleWith(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: 5 * time.Second, Events: rec})
				require.Equal(t, []string{"webapp-1"}, api.removedPods(), "the first wave")
				time.Sleep(500 * time.Millisecond)
				synctest.Wait()

				// Scaled to 5; the replacement becomes Ready, and the wave's
				// read of the scale is answered 500.
				var failing atomic.Bool
				failing.Store(true)
				api.mu.Lock()
				api.fault = func(r request) (int, string, bool) {
					if strings.HasSuffix(r.path, "/scale") && failing.Load() {
						return 500, `{"kind":"Status","code":500,"reason":"InternalError","message":"etcdserver: request timed out"}`, true
					}
					return 0, "", false
				}
				api.owners["webapp-rs"].replicas = 5
				p := api.pods["webapp-1r"]
				api.becomeReady(p)
				x.Handle(podEvent(t, watch.Modified, *p))
				api.mu.Unlock()
				synctest.Wait()
				assert.Equal(t, []string{"webapp-1"}, api.removedPods(), "no answer: no Ready pod goes")
				assert.Contains(t, eventText(rec, "ExpectedPodsUnknown"), "Warning: Cannot read the desired replicas of ReplicaSet webapp-rs")
				assert.Empty(t, eventText(rec, "ExpectedPodsEstimated"), "nothing estimated")
				reads := len(api.seen(http.MethodGet, "scale"))

				if !answers {
					time.Sleep(6 * time.Second)
					synctest.Wait()
					assert.Equal(t, []string{"webapp-1"}, api.removedPods(), "never answered: no Ready pod goes")
					assert.GreaterOrEqual(t, len(api.seen(http.MethodGet, "scale")), reads+5, "read again every second")
					assert.Contains(t, eventText(rec, "RolloutHalted"), "the scale of ReplicaSet webapp-rs got no answer that tells")
					assert.Len(t, slices.DeleteFunc(rec.all(), func(e emittedEvent) bool { return e.reason != "ExpectedPodsUnknown" }), 1, "said once per round")
					assert.Equal(t, uint64(1), m.OwnerReadsFailed.Value("unanswered"))
					return
				}
				failing.Store(false)
				time.Sleep(time.Second)
				synctest.Wait()
				assert.Greater(t, len(api.seen(http.MethodGet, "scale")), reads, "read again a second later, with no pod event")
				assert.Equal(t, []string{"webapp-1"}, api.removedPods(), "5 expected, 4 available: no pod may go")

				api.addReadyShown(t, x, "webapp-5", "webapp-rs", map[string]string{"app": "webapp"}) // the scale-up's pod
				synctest.Wait()
				assert.Equal(t, []string{"webapp-1", "webapp-2"}, api.removedPods(), "5 available: the next pod goes")
				assert.Equal(t, uint64(1), m.OwnerReadsFailed.Value("unanswered"))
			})
		})
	}
}

// memAPI serves the controller's requests from the fake in memory, so that
// a test runs on synctest's clock: a socket would keep it from moving.
type memAPI struct{ f *fakeAPI }

func (m memAPI) do(ctx context.Context, method, path string, query url.Values, contentType string, body []byte) ([]byte, error) {
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	req := httptest.NewRequestWithContext(ctx, method, path, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	m.f.serve(rec, req)
	if rec.Code >= 300 {
		e := apiclient.StatusFromJSON(rec.Body.Bytes())
		if e == nil {
			e = &apiclient.StatusError{Message: rec.Body.String()}
		}
		e.Code = rec.Code
		return nil, e
	}
	return rec.Body.Bytes(), nil
}

func (m memAPI) GetBody(ctx context.Context, path string, query url.Values, _ string) (io.ReadCloser, error) {
	b, err := m.do(ctx, http.MethodGet, path, query, "", nil)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m memAPI) Delete(ctx context.Context, path string, body []byte) ([]byte, error) {
	return m.do(ctx, http.MethodDelete, path, nil, "application/json", body)
}

func (m memAPI) Create(ctx context.Context, path string, body []byte) ([]byte, error) {
	return m.do(ctx, http.MethodPost, path, nil, "application/json", body)
}

func (m memAPI) MergePatch(ctx context.Context, path string, patch []byte) ([]byte, error) {
	return m.do(ctx, http.MethodPatch, path, nil, "application/merge-patch+json", patch)
}

var _ API = memAPI{}

// TestEstimateKeepsAPodDrainedUntilItIsGone ensures a pod that others
// delete mid-round still counts in its estimated owner's expected pods
// while it terminates: its owner replaces it (a drain), and until then it
// is a pod down, so no Ready pod goes in its place. Only a pod gone since
// the last count lowers the estimate (a DaemonSet's node removed).
func TestEstimateKeepsAPodDrainedUntilItIsGone(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	api.graceful = true
	api.replaceNotReady()
	api.readyOnceListed()
	listed := api.fault
	api.fault = func(r request) (int, string, bool) {
		if strings.HasSuffix(r.path, "/scale") {
			return 403, `{"kind":"Status","code":403,"reason":"Forbidden","message":"cannot get resource \"replicasets/scale\""}`, true
		}
		api.mu.Lock()
		if len(api.removed) == 1 && !api.pods["web-4"].terminating {
			api.revision++
			api.pods["web-4"].terminating, api.pods["web-4"].version = true, api.revision // drained: its replacement comes later
		}
		api.mu.Unlock()
		return listed(r)
	}
	rec := &fakeRecorder{}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: 200 * time.Millisecond, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return hasReason(rec, "RolloutHalted")() || len(api.removedPods()) > 1 }, waitFor, time.Millisecond)
	assert.Equal(t, []string{"web-1"}, api.removedPods(), "web-4 terminating: 3 of 4 expected available, none more may go")
}

// TestViewNeverGoesBackToAnIndexBehindAList ensures a round's view, once a
// LIST showed a pod the index has not shown yet (its watch resumed, the
// events since not in), comes from a LIST until the index has caught up:
// the index's older view would count that pod gone by other hands.
func TestViewNeverGoesBackToAnIndexBehindAList(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	x := mirror(t, api, nil)
	c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	ctx := context.Background()
	_, from, err := c.viewOf(ctx, "default", &round{})
	require.NoError(t, err)
	require.NotNil(t, from, "the index is caught up: its view is taken")

	created := api.addPod("webapp-4", map[string]string{"app": "webapp"}) // not shown by the index yet
	r := &round{pods: []podRef{{name: created.name, uid: created.uid}}, state: []podState{podPending}}
	view, from, err := c.viewOf(ctx, "default", r) // the index does not show a pending pod: a LIST
	require.NoError(t, err)
	require.Nil(t, from)
	require.True(t, slices.ContainsFunc(view, func(p livePod) bool { return p.name == "webapp-4" }))

	view, from, err = c.viewOf(ctx, "default", &round{})
	require.NoError(t, err)
	assert.Nil(t, from, "the index has not shown what the LIST showed")
	assert.True(t, slices.ContainsFunc(view, func(p livePod) bool { return p.name == "webapp-4" }))

	x.Handle(podEvent(t, watch.Added, created))
	_, from, err = c.viewOf(ctx, "default", &round{})
	require.NoError(t, err)
	assert.NotNil(t, from, "caught up: the index again")
}

// TestLastLookReportsOnlyPodsLongNotReady ensures the look PROGRESS_DEADLINE
// after a round's last restart reports a replacement only if it has not
// been Ready for at least half that deadline: one created half a second
// before the look (another round's replacement, a scale-up) has had no
// time to be, and is no ReplacementsNotReady (simulator seed 247); the
// round's own replacement, not Ready since its restart, is, on synctest's
// clock.
func TestLastLookReportsOnlyPodsLongNotReady(t *testing.T) {
	for _, tt := range []struct {
		name string
		// ownReady: the round's replacements are Ready by the look.
		ownReady bool
		want     string
	}{
		{"PodCreatedJustBeforeTheLookIsNoReport", true, ""},
		{"ReplacementNotReadySinceTheRoundIsReported", false, "2 replacement(s) not Ready 10s after the last restart"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, owned("webapp", 2)...) // its server, a socket, outside the bubble
			synctest.Test(t, func(t *testing.T) {
				rec := &fakeRecorder{}
				x, m := changedInBubbleWith(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, ProgressDeadline: 10 * time.Second, Events: rec})
				require.Equal(t, []string{"webapp-1", "webapp-2"}, api.removedPods())
				require.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
				time.Sleep(9500 * time.Millisecond)

				api.mu.Lock()
				if tt.ownReady {
					for _, name := range []string{"webapp-1r", "webapp-2r"} {
						p := api.pods[name]
						api.becomeReady(p)
						x.Handle(podEvent(t, watch.Modified, *p))
					}
				}
				p := api.pods[api.addPodLocked("webapp-new", map[string]string{"app": "webapp"}).name]
				p.owner, p.readySince = "webapp-rs", time.Now()
				x.Handle(podEvent(t, watch.Added, *p))
				api.mu.Unlock()

				time.Sleep(time.Second)
				synctest.Wait()
				require.GreaterOrEqual(t, m.Reconciles.Value(resultUnchanged), uint64(1), "the look was taken")
				if tt.want == "" {
					assert.Empty(t, eventText(rec, "ReplacementsNotReady"))
					assert.Zero(t, m.ReplacementsNotReady.Value())
					return
				}
				assert.Contains(t, eventText(rec, "ReplacementsNotReady"), tt.want)
				assert.Equal(t, uint64(1), m.ReplacementsNotReady.Value())
			})
		})
	}
}

// waveWithScaleReadMeanwhile runs the waves of one change over api's pods
// on index x (MAX_UNAVAILABLE=1), calling meanwhile, api.mu held, during
// the first scale read, and returns once the round waits or restarted.
func waveWithScaleReadMeanwhile(t *testing.T, api *fakeAPI, x *podindex.Index, meanwhile func()) {
	var read atomic.Bool
	api.fault = func(r request) (int, string, bool) {
		if strings.HasSuffix(r.path, "/scale") && read.CompareAndSwap(false, true) {
			api.mu.Lock()
			meanwhile()
			api.mu.Unlock()
		}
		return 0, "", false
	}
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: time.Hour}
	c, m := startWaves(t, api.client(), cfg, x)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultWaiting) >= 1 || len(api.removedPods()) > 0 }, waitFor, time.Millisecond)
	require.True(t, read.Load(), "the scale was read")
}
