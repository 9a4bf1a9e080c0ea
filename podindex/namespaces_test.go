package podindex_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// nsAPI serves the metadata-only pods of any namespace: "default" answers
// with the recorded LIST, every other namespace with one hand-made pod named
// after it. A watch stays open, without events, until endWatch. Requests of
// a held namespace wait until it is released.
type nsAPI struct {
	listBody string

	mu      sync.Mutex
	lists   map[string]int
	watches map[string]int
	open    map[string]chan struct{} // namespace → closed to end its open watch
	held    map[string]chan struct{} // namespace → closed to release it
	ended   map[string]int           // watches whose client went away
}

func newNSAPI(t *testing.T) (*nsAPI, *apiclient.Client) {
	t.Helper()
	a := &nsAPI{listBody: readFile(t, "pods-metadata-list.json"), lists: map[string]int{}, watches: map[string]int{},
		open: map[string]chan struct{}{}, held: map[string]chan struct{}{}, ended: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods", a.serve)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client, err := apiclient.New(srv.URL, "podindex-test")
	require.NoError(t, err)
	return a, client
}

func (a *nsAPI) serve(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("ns")
	a.mu.Lock()
	held := a.held[ns]
	a.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-r.Context().Done():
			return
		}
	}
	if r.URL.Query().Get("watch") != "true" {
		a.mu.Lock()
		a.lists[ns]++
		a.mu.Unlock()
		body := a.listBody
		if ns != "default" {
			body = fmt.Sprintf(`{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"100"},"items":[`+
				`{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"pod-%[1]s","namespace":%[1]q,"uid":"uid-%[1]s","resourceVersion":"90","labels":{"app":"webapp"}}}]}`, ns)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
		return
	}
	end := make(chan struct{})
	a.mu.Lock()
	a.watches[ns]++
	a.open[ns] = end
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	select {
	case <-end:
	case <-r.Context().Done():
		a.mu.Lock()
		a.ended[ns]++
		a.mu.Unlock()
	}
}

// hold makes the requests of ns wait; the returned func releases them.
func (a *nsAPI) hold(ns string) (release func()) {
	ch := make(chan struct{})
	a.mu.Lock()
	a.held[ns] = ch
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		delete(a.held, ns)
		a.mu.Unlock()
		close(ch)
	}
}

// endWatch ends the open watch of ns cleanly.
func (a *nsAPI) endWatch(ns string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ch := a.open[ns]; ch != nil {
		close(ch)
		delete(a.open, ns)
	}
}

func (a *nsAPI) count(m map[string]int, ns string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return m[ns]
}

// fakeTimers records AfterFunc calls; the test fires them.
type fakeTimers struct {
	mu     sync.Mutex
	timers []*fakeTimer
}

type fakeTimer struct {
	d       time.Duration
	f       func()
	stopped atomic.Bool
}

func (t *fakeTimer) Stop() bool { return !t.stopped.Swap(true) }

func (ft *fakeTimers) AfterFunc(d time.Duration, f func()) podindex.Timer {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	t := &fakeTimer{d: d, f: f}
	ft.timers = append(ft.timers, t)
	return t
}

// fire runs the i-th timer's func as time.AfterFunc would, stopped or
// not: a timer can fire while it is being stopped.
func (ft *fakeTimers) fire(t *testing.T, i int) {
	t.Helper()
	ft.mu.Lock()
	require.Greater(t, len(ft.timers), i, "timer %d was scheduled", i)
	f := ft.timers[i].f
	ft.mu.Unlock()
	f()
}

func (ft *fakeTimers) len() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return len(ft.timers)
}

// nsFixture is a Namespaces over an nsAPI, with fake timers.
type nsFixture struct {
	api     *nsAPI
	n       *podindex.Namespaces
	timers  *fakeTimers
	indexed atomic.Int64
	freed   atomic.Int64
	run     func() // starts Run; Cleanup stops it
}

func newNSFixture(t *testing.T) *nsFixture {
	t.Helper()
	api, client := newNSAPI(t)
	f := &nsFixture{api: api, timers: &fakeTimers{}}
	m := watch.NewMetrics(metrics.NewRegistry())
	f.n = podindex.NewNamespaces(podindex.NamespacesConfig{
		Watch: func(ns string, h watch.Handler) *watch.ListWatcher {
			return watch.New(watch.Config{Path: apiclient.CorePath(ns, "pods", ""), MetadataOnly: true,
				NewBackOff: func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }}, client, h, discard, m)
		},
		AfterFunc:    f.timers.AfterFunc,
		Indexed:      func(n int) { f.indexed.Store(int64(n)) },
		FreeOSMemory: func() { f.freed.Add(1) },
	}, discard)
	f.run = func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { f.n.Run(ctx); close(done) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(waitLimit):
				t.Error("Run did not return after its context was cancelled")
			}
		})
	}
	return f
}

func (f *nsFixture) covered(ns string) func() bool {
	return func() bool { return f.n.Cover(ns) != nil }
}

// TestNamespacesIndexOnlyAnnotatedNamespaces ensures only a namespace told
// annotated gets an index (a list and a watch of its pods, and nothing for
// the others), that the index holds that namespace's pods as the recorded
// list has them, and that Cover answers for no other namespace.
func TestNamespacesIndexOnlyAnnotatedNamespaces(t *testing.T) {
	rec := readRecording(t)
	f := newNSFixture(t)
	f.run()
	f.n.Annotated(ns, true)
	require.Eventually(t, f.covered(ns), waitLimit, time.Millisecond)

	pods, ok := selectPods(f.n.Cover(ns), ns, all)
	require.True(t, ok)
	var want []string
	for _, p := range rec.items {
		if p.Metadata.DeletionTimestamp == nil {
			want = append(want, p.Metadata.Name)
		}
	}
	assert.ElementsMatch(t, want, names(pods), "the recorded list's pods")
	assert.Equal(t, 1, f.api.count(f.api.lists, ns))
	assert.Equal(t, 1, f.api.count(f.api.watches, ns))
	assert.Nil(t, f.n.Cover("other"), "no index for a namespace never annotated")
	assert.Zero(t, f.api.count(f.api.lists, "other"), "and no request for its pods")
	assert.Equal(t, int64(1), f.indexed.Load(), "one namespace indexed")
	assert.Equal(t, len(rec.items), f.n.Len())
}

// TestNamespacesAnnotatedBeforeRun ensures namespaces announced before Run
// (the ConfigMap list may run first) are indexed once Run starts, and not
// before.
func TestNamespacesAnnotatedBeforeRun(t *testing.T) {
	f := newNSFixture(t)
	f.n.Annotated("a", true)
	f.n.Annotated("b", true)
	assert.Nil(t, f.n.Cover("a"))
	assert.Zero(t, f.api.count(f.api.lists, "a"), "nothing runs before Run")
	f.run()
	require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond)
	require.Eventually(t, f.covered("b"), waitLimit, time.Millisecond)
	pods, ok := selectPods(f.n.Cover("b"), "b", all)
	require.True(t, ok)
	assert.Equal(t, []string{"pod-b"}, names(pods), "each index holds its namespace's pods")
}

// TestNamespacesCoverOnlyWhileSyncedAndWatching ensures Cover answers only
// once the first list has ended and while the watch stream is open: not
// while the list is held, not after the stream closed and before the next
// one opens.
func TestNamespacesCoverOnlyWhileSyncedAndWatching(t *testing.T) {
	f := newNSFixture(t)
	f.run()
	release := f.api.hold("a")
	f.n.Annotated("a", true)
	require.Eventually(t, func() bool { return f.n.Len() == 0 && f.indexed.Load() == 1 }, waitLimit, time.Millisecond)
	assert.Never(t, f.covered("a"), 50*time.Millisecond, time.Millisecond, "not before the first list")
	release()
	require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond, "listed and watching")

	release = f.api.hold("a")
	f.api.endWatch("a")
	require.Eventually(t, func() bool { return f.n.Cover("a") == nil }, waitLimit, time.Millisecond, "stream closed, next one held")
	release()
	require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond, "watching again")
	assert.Equal(t, 1, f.api.count(f.api.lists, "a"), "a clean end resumes without a relist")
	assert.GreaterOrEqual(t, f.api.count(f.api.watches, "a"), 2)
}

// TestNamespacesLinger ensures a namespace that loses its last annotated
// ConfigMap keeps its index for Linger, stops it afterwards (its watch ends,
// Cover says nil), and that gaining one again meanwhile cancels the end.
func TestNamespacesLinger(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps after "a" is indexed
		steps      func(t *testing.T, f *nsFixture)
		wantCover  bool
		wantLists  int
		wantTimers int
	}{
		{"StopsAfterLinger", func(t *testing.T, f *nsFixture) {
			f.n.Annotated("a", false)
			f.timers.fire(t, 0)
		}, false, 1, 1},
		{"StillCoveredWhileLingering", func(t *testing.T, f *nsFixture) {
			f.n.Annotated("a", false)
		}, true, 1, 1},
		{"ReannotatedWhileLingeringKeepsIndex", func(t *testing.T, f *nsFixture) {
			f.n.Annotated("a", false)
			f.n.Annotated("a", true)
			f.timers.fire(t, 0) // too late: it was stopped
		}, true, 1, 1},
		{"RepeatedLossSchedulesOneEnd", func(t *testing.T, f *nsFixture) {
			f.n.Annotated("a", false)
			f.n.Annotated("a", false)
		}, true, 1, 1},
		{"StaleTimerDoesNotEndANewerLinger", func(t *testing.T, f *nsFixture) {
			f.n.Annotated("a", false)
			f.n.Annotated("a", true)
			f.n.Annotated("a", false)
			f.timers.fire(t, 0)
		}, true, 1, 2},
		{"AnnotatedAgainAfterStopRelists", func(t *testing.T, f *nsFixture) {
			f.n.Annotated("a", false)
			f.timers.fire(t, 0)
			f.n.Annotated("a", true)
		}, true, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newNSFixture(t)
			f.run()
			f.n.Annotated("a", true)
			require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond)
			tc.steps(t, f)
			if tc.wantCover {
				require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond)
				assert.Equal(t, int64(1), f.indexed.Load())
			} else {
				assert.Nil(t, f.n.Cover("a"))
				assert.Zero(t, f.n.Len(), "the stopped index is dropped")
				assert.Zero(t, f.indexed.Load())
				require.Eventually(t, func() bool { return f.api.count(f.api.ended, "a") == 1 }, waitLimit, time.Millisecond,
					"its watch ends")
			}
			assert.Equal(t, tc.wantLists, f.api.count(f.api.lists, "a"), "lists of the namespace's pods")
			assert.Equal(t, tc.wantTimers, f.timers.len(), "ends scheduled")
			for _, tm := range f.timers.timers {
				assert.Equal(t, podindex.Linger, tm.d)
			}
		})
	}
}

// TestNamespacesFreeMemoryOnceListsSettle ensures the memory of the first
// lists goes back to the OS once every index started so far has listed,
// not while one is still listing.
func TestNamespacesFreeMemoryOnceListsSettle(t *testing.T) {
	f := newNSFixture(t)
	f.run()
	release := f.api.hold("b")
	// b first: a's list may end before a later Annotated("b") starts b.
	f.n.Annotated("b", true)
	f.n.Annotated("a", true)
	require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond)
	assert.Zero(t, f.freed.Load(), "b is still listing")
	release()
	require.Eventually(t, f.covered("b"), waitLimit, time.Millisecond)
	assert.Equal(t, int64(1), f.freed.Load())

	f.api.endWatch("a") // a resumed watch is no new list
	f.n.Annotated("c", true)
	require.Eventually(t, f.covered("c"), waitLimit, time.Millisecond)
	assert.Equal(t, int64(2), f.freed.Load(), "once more after a new namespace's first list")
}

// TestNamespacesStartNothingAfterRunStops ensures Run returns while
// namespaces are still being announced, and that one announced after it
// returned gets no loop: none may outlive Run.
func TestNamespacesStartNothingAfterRunStops(t *testing.T) {
	f := newNSFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.n.Run(ctx); close(done) }()
	f.n.Annotated("a", true)
	require.Eventually(t, f.covered("a"), waitLimit, time.Millisecond)
	announced := make(chan struct{})
	go func() { // announced while Run stops, ordered with it by nothing else
		defer close(announced)
		for i := range 200 {
			f.n.Annotated(fmt.Sprintf("during-%d", i), true)
		}
	}()
	cancel()
	<-announced
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after its context was cancelled")
	}
	f.n.Annotated("after", true)
	assert.Nil(t, f.n.Cover("after"))
	assert.Zero(t, f.api.count(f.api.lists, "after"), "no request once Run returned")
}
