package policy

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// podEvent is a pod as the index's watch carries it: whole, as the fake
// server shows it.
func podEvent(t *testing.T, typ watch.EventType, p fakePod) watch.Event {
	raw, err := json.Marshal(p.object())
	require.NoError(t, err)
	return watch.Event{Type: typ, Object: raw, ResourceVersion: strconv.FormatUint(p.version, 10)}
}

// indexOf returns a pod index that listed pods.
func indexOf(t *testing.T, pods ...*fakePod) *podindex.Index {
	x := podindex.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	x.BeginList()
	for _, p := range pods {
		x.Handle(podEvent(t, watch.Synced, *p))
	}
	x.EndList()
	return x
}

// oneIndex is x for every namespace; annotated, if set, hears Annotated.
type oneIndex struct {
	x         *podindex.Index
	annotated func(namespace string, annotated bool)
}

func (o oneIndex) Annotated(namespace string, annotated bool) {
	if o.annotated != nil {
		o.annotated(namespace, annotated)
	}
}

func (o oneIndex) Cover(string) *podindex.Index { return o.x }

func (o oneIndex) OnChange(f func(namespace string, labels map[string]string)) {
	if o.x != nil {
		o.x.OnChange(f)
	}
}

// withIndex sets cfg.Pods to x for every namespace.
func withIndex(cfg Config, x *podindex.Index) Config {
	cfg.Pods = oneIndex{x: x}
	cfg.MaxUnavailable = Budget{Percent: 100} // only all at once begins from the index
	return cfg
}

// TestIndexedRoundDeletesBeforeListing ensures a round with a synced index
// sends its deletions before any LIST, and confirms with one sweep after.
func TestIndexedRoundDeletesBeforeListing(t *testing.T) {
	pods := webPods()
	api := newFakeAPI(t, pods...)
	c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, indexOf(t, pods...)))
	start(t, c)

	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)

	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())
	var order []string
	for _, r := range api.seen("", "pods") {
		order = append(order, r.method)
	}
	assert.Equal(t, http.MethodDelete, order[0], "the first pod request is a deletion: %v", order)
	assert.Equal(t, []string{http.MethodGet}, order[3:], "then one sweep LIST (one page: only the terminating pod is left)")
	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
}

// TestSweep ensures the sweep restarts the pods that started before the
// round but that the index had not seen, and leaves those created after
// the round's first deletion.
func TestSweep(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	tests := []struct {
		name string
		// deleting runs as webapp-1 (the only indexed pod) is deleted,
		// before the server answers; during runs before the sweep lists.
		// Either may add pods and tell the index of them.
		deleting    func(api *fakeAPI, x *podindex.Index)
		during      func(api *fakeAPI, x *podindex.Index)
		wantDeleted []string
		wantIntent  []string // uids in the last intent written
	}{{
		name: "a pod created before the change but not yet indexed is restarted",
		during: func(api *fakeAPI, x *podindex.Index) {
			api.mu.Lock()
			api.pods["straggler"] = &fakePod{name: "straggler", uid: "uid-s", labels: web, version: 5}
			api.mu.Unlock()
		},
		wantDeleted: []string{"webapp-1", "straggler"},
		wantIntent:  []string{"uid-1", "uid-s"},
	}, {
		name: "a replacement created after the first deletion is left alone",
		during: func(api *fakeAPI, x *podindex.Index) {
			p := api.addPod("webapp-1b", web)
			x.Handle(podEvent(t, watch.Added, p))
		},
		wantDeleted: []string{"webapp-1"},
		wantIntent:  []string{"uid-1"},
	}, {
		name: "a replacement created before the deletion's answer is left alone",
		deleting: func(api *fakeAPI, x *podindex.Index) {
			// A pod never scheduled is marked terminating, then removed, in
			// one DELETE; its ReplicaSet may replace it in between.
			api.mu.Lock()
			api.revision++
			terminating := fakePod{name: "webapp-1", uid: "uid-1", labels: web, version: api.revision, terminating: true}
			api.mu.Unlock()
			x.Handle(podEvent(t, watch.Modified, terminating))
			x.Handle(podEvent(t, watch.Added, api.addPod("webapp-1b", web)))
		},
		wantDeleted: []string{"webapp-1"},
		wantIntent:  []string{"uid-1"},
	}, {
		name: "a pod created before, modified after the first deletion, is restarted",
		during: func(api *fakeAPI, x *podindex.Index) {
			p := fakePod{name: "late", uid: "uid-l", labels: web, version: 6}
			x.Handle(podEvent(t, watch.Added, p)) // created at 6 ...
			api.mu.Lock()
			api.revision += 5
			p.version = api.revision // ... and updated since
			api.pods["late"] = &p
			api.mu.Unlock()
		},
		wantDeleted: []string{"webapp-1", "late"},
		wantIntent:  []string{"uid-1", "uid-l"},
	}, {
		name: "a pod the index never shows is restarted: the guarantee first",
		during: func(api *fakeAPI, x *podindex.Index) {
			api.addPod("unseen", web)
		},
		wantDeleted: []string{"webapp-1", "unseen"},
		wantIntent:  []string{"uid-1", "uid-new-1"},
	}, {
		name: "after a relist of the index, creation revisions are not trusted",
		during: func(api *fakeAPI, x *podindex.Index) {
			p := api.addPod("webapp-1b", web)
			x.BeginList()
			x.Handle(podEvent(t, watch.Synced, p))
			x.EndList()
		},
		wantDeleted: []string{"webapp-1", "webapp-1b"},
		wantIntent:  []string{"uid-1", "uid-new-1"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := &fakePod{name: "webapp-1", uid: "uid-1", labels: web}
			api := newFakeAPI(t, first)
			x := indexOf(t, first)
			var deleting, listing sync.Once
			api.fault = func(r request) (int, string, bool) {
				switch {
				case r.method == http.MethodDelete && tt.deleting != nil:
					deleting.Do(func() { tt.deleting(api, x) })
				case r.method == http.MethodGet && strings.HasSuffix(r.path, "/pods") && tt.during != nil:
					listing.Do(func() { tt.during(api, x) })
				}
				return 0, "", false
			}
			c, m := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
			c.sweepWait = 50 * time.Millisecond
			start(t, c)

			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			settle(t, c)

			assert.Equal(t, tt.wantDeleted, api.deletedPods())
			intents := api.intents()
			require.GreaterOrEqual(t, len(intents), 2)
			assert.Empty(t, intents[len(intents)-1], "the record ends the round")
			for _, uid := range tt.wantIntent {
				assert.Contains(t, intents[len(intents)-2], uid, "the intent names every pod before it goes")
			}
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
		})
	}
}

// TestIndexNotSyncedListsFirst ensures a round lists its pods when the
// index has not synced yet: it cannot answer, and the round does not wait
// for it. (Evictions decide from the index: TestMembershipBoundOfEvictions.)
func TestIndexNotSyncedListsFirst(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), withIndex(Config{}, podindex.New(slog.Default())))
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	reqs := api.seen("", "pods")
	require.NotEmpty(t, reqs)
	assert.Equal(t, http.MethodGet, reqs[0].method, "listed first")
	assert.NotEqual(t, []string{"1"}, reqs[0].query["limit"], "a whole list, not a membership bound")
	assert.Len(t, api.deletedPods(), 3)
}

// TestIndexNeverDeletesOnAStaleView ensures a pod deleted on the index's
// word carries its resourceVersion: a pod relabelled since the index saw
// it is refused by the server and, as the sweep's LIST no longer selects
// it, never deleted; a pod a third party began to delete is refused too,
// and its replacement, created before our first deletion, is restarted.
func TestIndexNeverDeletesOnAStaleView(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	tests := []struct {
		name        string
		change      func(api *fakeAPI) // between the index's view and the deletions
		wantDeleted []string           // successful deletions
	}{{
		name: "a relabelled pod is not deleted",
		change: func(api *fakeAPI) {
			api.revision++
			api.pods["webapp-1"].labels = map[string]string{"app": "quarantine"}
			api.pods["webapp-1"].version = api.revision
		},
		wantDeleted: []string{"webapp-2", "webapp-3"},
	}, {
		name: "the replacement of a pod a third party deleted is restarted",
		change: func(api *fakeAPI) {
			api.revision++
			api.pods["webapp-1"].terminating = true
			api.pods["webapp-1"].version = api.revision
			api.addPodLocked("webapp-1b", web)
		},
		wantDeleted: []string{"webapp-1b", "webapp-2", "webapp-3"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := []*fakePod{{name: "webapp-1", uid: "uid-1", labels: web}, {name: "webapp-2", uid: "uid-2", labels: web}, {name: "webapp-3", uid: "uid-3", labels: web}}
			api := newFakeAPI(t, pods...)
			x := indexOf(t, pods...) // the index's view, before the change
			api.mu.Lock()
			tt.change(api)
			api.mu.Unlock()
			c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			api.mu.Lock()
			removed := slices.Sorted(slices.Values(api.removed))
			api.mu.Unlock()
			assert.Equal(t, tt.wantDeleted, removed)
			assert.Contains(t, api.deletedPods(), "webapp-1", "tried with the index's resourceVersion, and refused")
		})
	}
}

// TestIndexWithOpaqueResourceVersionsListsFirst ensures a round lists
// first when the index's pods have resourceVersions that are not numbers:
// the sweep could not compare them.
func TestIndexWithOpaqueResourceVersionsListsFirst(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	x := podindex.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	x.BeginList()
	x.Handle(watch.Event{Type: watch.Synced, Object: []byte(`{"kind":"PartialObjectMetadata","metadata":{"name":"webapp-1","namespace":"ns","uid":"uid-1","resourceVersion":"opaque-7","labels":{"app":"webapp"}}}`)})
	x.EndList()
	c, _ := newTestController(t, api.client(), withIndex(Config{RecordHash: true}, x))
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	reqs := api.seen("", "pods")
	require.NotEmpty(t, reqs)
	assert.Equal(t, http.MethodGet, reqs[0].method, "listed first")
	assert.Len(t, api.deletedPods(), 3, "each pod once, the list's")
}

// TestPodMissingFromABehindIndexIsNotGone ensures a pod a round took from
// a LIST (the index relisting then) and has not restarted yet is not
// taken for gone when a later wave's index view, complete again but
// behind that LIST, does not show it: the round lists instead, and
// restarts it. Taken for gone, it was left on the old data.
func TestPodMissingFromABehindIndexIsNotGone(t *testing.T) {
	pods := podsOf("RR")
	api := newFakeAPI(t, pods...)
	api.replaceNotReady()
	x := podindex.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	x.BeginList() // relisting: no view, so the round takes its pods from a LIST
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, Pods: oneIndex{x: x}, MaxUnavailable: Budget{Pods: 1}})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.deletedPods()) == 1 }, waitFor, time.Millisecond)

	// The relist ends behind the LIST: it shows the first restart's
	// replacement, now Ready, and not the other pod the round took.
	first := api.deletedPods()[0]
	api.mu.Lock()
	var replacement *fakePod
	for _, p := range api.pods {
		if p.name != first && p.name != "web-1" && p.name != "web-2" {
			api.revision++
			p.ready, p.version, p.readySince = true, api.revision, time.Now().Add(-time.Minute)
			replacement = p
		}
	}
	require.NotNil(t, replacement)
	x.Handle(podEvent(t, watch.Synced, *replacement))
	x.EndList()
	x.Progress(strconv.FormatUint(api.revision, 10))
	api.mu.Unlock()

	other := map[string]string{"web-1": "web-2", "web-2": "web-1"}[first]
	require.Eventually(t, func() bool { return slices.Contains(api.deletedPods(), other) }, waitFor, time.Millisecond,
		"%s was taken by the round and never restarted: deleted %v", other, api.deletedPods())
}
