package podindex_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

const (
	ns       = "default"
	podsPath = "/api/v1/namespaces/default/pods"
	recorded = "../testdata/recorded"
	// waitLimit bounds every wait for the index to reach a state; it is a
	// deadline for a failing test, never a pause.
	waitLimit = 10 * time.Second
)

var discard = slog.New(slog.DiscardHandler)

// --- what the files say, read with encoding/json ---------------------------------------

// wirePod is what the index keeps of a pod, as encoding/json reads it.
type wirePod struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Namespace         string            `json:"namespace"`
		Name              string            `json:"name"`
		UID               string            `json:"uid"`
		ResourceVersion   string            `json:"resourceVersion"`
		Labels            map[string]string `json:"labels"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
	} `json:"metadata"`
}

func (p wirePod) rv(t testing.TB) uint64 {
	t.Helper()
	rv, err := strconv.ParseUint(p.Metadata.ResourceVersion, 10, 64)
	require.NoError(t, err, "resourceVersion of %s", p.Metadata.Name)
	return rv
}

type wireEvent struct {
	Type   string  `json:"type"`
	Object wirePod `json:"object"`
}

type wireList struct {
	Kind     string `json:"kind"`
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// recording is the metadata-only pod LIST and WATCH of testdata/recorded.
type recording struct {
	listBody string
	list     wireList
	items    []wirePod
	lines    []string
	events   []wireEvent
}

func readRecording(t testing.TB) recording {
	t.Helper()
	var rec recording
	rec.listBody = readFile(t, "pods-metadata-list.json")
	require.NoError(t, json.Unmarshal([]byte(rec.listBody), &rec.list))
	for _, raw := range rec.list.Items {
		var p wirePod
		require.NoError(t, json.Unmarshal(raw, &p))
		rec.items = append(rec.items, p)
	}
	body := readFile(t, "pods-metadata-watch.ndjson")
	require.True(t, strings.HasSuffix(body, "\n"), "the last line has a newline")
	rec.lines = strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	for _, l := range rec.lines {
		var ev wireEvent
		require.NoError(t, json.Unmarshal([]byte(l), &ev), "line %.80s", l)
		rec.events = append(rec.events, ev)
	}
	return rec
}

func readFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(recorded, name))
	require.NoError(t, err, "make record writes it")
	return string(b)
}

// model is what the index must hold, computed from the files independently
// of podindex.
type model struct {
	pods  map[string]modelPod // uid → pod
	ended map[string]uint64   // uid of a deleted pod → revision it began to terminate at
}

type modelPod struct {
	name    string
	labels  map[string]string
	created uint64
	// terminating is the revision of the first event showing a
	// deletionTimestamp, 0 without one.
	terminating uint64
}

func newModel() model { return model{pods: map[string]modelPod{}, ended: map[string]uint64{}} }

func (m model) clone() model { return model{pods: maps.Clone(m.pods), ended: maps.Clone(m.ended)} }

func (m model) apply(t testing.TB, typ string, p wirePod) {
	t.Helper()
	uid := p.Metadata.UID
	switch typ {
	case "BOOKMARK":
		return
	case "DELETED":
		if _, ok := m.ended[uid]; !ok {
			m.ended[uid] = p.rv(t)
			if mp := m.pods[uid]; mp.terminating != 0 {
				m.ended[uid] = mp.terminating
			}
		}
		delete(m.pods, uid)
		return
	}
	mp, known := m.pods[uid]
	if !known {
		mp.name = p.Metadata.Name
		if typ == "ADDED" {
			mp.created = p.rv(t) // a pod first seen listed or MODIFIED: 0
		}
	}
	mp.labels = p.Metadata.Labels
	switch {
	case p.Metadata.DeletionTimestamp == nil:
		mp.terminating = 0
	case mp.terminating == 0:
		mp.terminating = p.rv(t)
	}
	m.pods[uid] = mp
}

// selectable is the pods Select must return: those not terminating.
func (m model) selectable() []Pod {
	var out []Pod
	for uid, p := range m.pods {
		if p.terminating == 0 {
			out = append(out, Pod{Name: p.name, UID: uid})
		}
	}
	return sortPods(out)
}

func sortPods(ps []Pod) []Pod {
	slices.SortFunc(ps, func(a, b Pod) int { return strings.Compare(a.UID, b.UID) })
	return ps
}

// --- what the index says ----------------------------------------------------------------

// view is everything the index tells about namespace ns: the pods Select
// returns with the labels it matched them on, and Created and Terminated of
// each uid asked.
type view struct {
	ok         bool
	pods       []Pod
	labels     map[string]map[string]string // uid → labels, selected pods only
	created    map[string]uint64            // uid → created, known pods only
	terminated map[string]uint64            // uid → since, known only
	len        int
}

func newView() view {
	return view{labels: map[string]map[string]string{}, created: map[string]uint64{}, terminated: map[string]uint64{}}
}

func look(x *podindex.Index, uids ...string) view {
	v := newView()
	v.len = x.Len()
	var seen []map[string]string
	pods, ok := selectWithoutRV(x, ns, func(l map[string]string) bool { seen = append(seen, l); return true })
	v.ok, v.pods = ok, sortPods(slices.Clone(pods))
	// Select calls matches once per candidate, in the order it returns them.
	for i, p := range pods {
		if i < len(seen) {
			v.labels[p.UID] = maps.Clone(seen[i])
		}
	}
	for _, uid := range uids {
		if c, known := x.Created(context.Background(), ns, uid, 0); known {
			v.created[uid] = c
		}
		if since, known := x.Terminated(context.Background(), ns, uid, 0); known {
			v.terminated[uid] = since
		}
	}
	return v
}

// want is the view the model calls for.
func (m model) want(uids ...string) view {
	v := newView()
	v.ok, v.pods, v.len = true, m.selectable(), len(m.pods)
	for uid, p := range m.pods {
		if p.terminating == 0 {
			v.labels[uid] = p.labels
		}
	}
	for _, uid := range uids {
		if p, ok := m.pods[uid]; ok {
			v.created[uid] = p.created
			if p.terminating != 0 {
				v.terminated[uid] = p.terminating
			}
		} else if since, ok := m.ended[uid]; ok {
			v.terminated[uid] = since
		}
	}
	return v
}

// --- the fake API server ----------------------------------------------------------------

// podsAPI serves the recorded LIST, then the recorded WATCH one line at a
// time, each flushed, each only once the test releases it; later watches
// stay open and quiet until the client goes away.
type podsAPI struct {
	t        testing.TB
	listBody string
	lines    []string
	release  chan struct{} // one receive per line the first watch may send
	closing  chan struct{}

	mu   sync.Mutex
	reqs []apiRequest
}

type apiRequest struct {
	watch  bool
	query  string
	rv     string
	accept string
}

func (a *podsAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.URL.Path != podsPath {
		a.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		http.Error(w, "unexpected", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	isWatch := q.Get("watch") == "true"
	a.mu.Lock()
	a.reqs = append(a.reqs, apiRequest{watch: isWatch, query: r.URL.RawQuery, rv: q.Get("resourceVersion"), accept: r.Header.Get("Accept")})
	watches := 0
	for _, rq := range a.reqs {
		if rq.watch {
			watches++
		}
	}
	a.mu.Unlock()
	// The server answers metadata requests with this Content-Type (see the README).
	w.Header().Set("Content-Type", "application/json")
	if !isWatch {
		io.WriteString(w, a.listBody)
		return
	}
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	flusher.Flush()
	if watches == 1 {
		for _, l := range a.lines {
			select {
			case <-a.release:
			case <-r.Context().Done():
				return
			case <-a.closing:
				return
			}
			io.WriteString(w, l+"\n")
			flusher.Flush()
		}
		return // the server's timeoutSeconds: a clean end
	}
	select {
	case <-r.Context().Done():
	case <-a.closing:
	}
}

func (a *podsAPI) requests() []apiRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.reqs)
}

// runIndex runs a real ListWatcher with a real apiclient.Client against srv
// into a new Index, until the test ends.
func runIndex(t *testing.T, srv *httptest.Server) *podindex.Index {
	t.Helper()
	client, err := apiclient.New(srv.URL, "podindex-test")
	require.NoError(t, err)
	x := podindex.New(discard)
	lw := watch.New(watch.Config{Path: podsPath, Kind: "PartialObjectMetadata", MetadataOnly: true},
		client, x, discard, watch.NewMetrics(metrics.NewRegistry()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(waitLimit):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	return x
}

// TestReplayMetadataListWatch ensures the index built from a real
// metadata-only LIST and WATCH (a pod created, relabelled and deleted, a
// Deployment's pod deleted and replaced) holds, after the list and after
// every line of the stream, exactly the pods, labels, terminating states and
// creation revisions the files call for, and that both requests asked for
// metadata only.
func TestReplayMetadataListWatch(t *testing.T) {
	rec := readRecording(t)
	require.Equal(t, "PartialObjectMetadataList", rec.list.Kind, "the server honoured the list's Accept header")
	require.NotEmpty(t, rec.items)

	// Expectations, from the files.
	m := newModel()
	var uids []string
	for _, p := range rec.items {
		m.apply(t, string(watch.Synced), p)
		uids = append(uids, p.Metadata.UID)
	}
	afterList := m.want(uids...)
	listed := maps.Clone(m.pods)
	var (
		deleted         []string              // uids of DELETED events
		addedRV         = map[string]uint64{} // uid → revision of its ADDED event
		relabelled      = -1                  // line of the first MODIFIED that changed labels
		terminatingLine = -1                  // line of the first MODIFIED that set deletionTimestamp
		steps           []model               // model after each line
		lastRV          string
		replacement     string
	)
	for i, ev := range rec.events {
		p, uid := ev.Object, ev.Object.Metadata.UID
		if ev.Type != "BOOKMARK" {
			require.Equal(t, "PartialObjectMetadata", p.Kind, "line %d: metadata only", i+1)
			if !slices.Contains(uids, uid) {
				uids = append(uids, uid)
			}
		}
		switch ev.Type {
		case "ADDED":
			addedRV[uid] = p.rv(t)
			if _, wasListed := listed[uid]; !wasListed && p.Metadata.Labels["app"] == "webapp" {
				replacement = uid
			}
		case "MODIFIED":
			if prev, ok := m.pods[uid]; ok && relabelled < 0 && !maps.Equal(prev.labels, p.Metadata.Labels) {
				relabelled = i
			}
			if p.Metadata.DeletionTimestamp != nil && terminatingLine < 0 {
				terminatingLine = i
			}
		case "DELETED":
			deleted = append(deleted, uid)
		}
		m.apply(t, ev.Type, p)
		steps = append(steps, m.clone())
		lastRV = p.Metadata.ResourceVersion
	}
	require.NotEmpty(t, replacement, "the recording has the ReplicaSet's replacement")
	require.GreaterOrEqual(t, relabelled, 0, "the recording has the label patch")
	require.GreaterOrEqual(t, terminatingLine, 0, "the recording has a terminating pod")
	require.Len(t, deleted, 2, "indexed-pod and the webapp pod")

	api := &podsAPI{t: t, listBody: rec.listBody, lines: rec.lines, release: make(chan struct{}), closing: make(chan struct{})}
	srv := httptest.NewServer(api)
	t.Cleanup(func() { close(api.closing); srv.Close() })
	x := runIndex(t, srv)

	t.Run("AfterList", func(t *testing.T) {
		require.Eventually(t, func() bool { _, ok := selectPods(x, ns, all); return ok }, waitLimit, time.Millisecond)
		assert.Equal(t, afterList, look(x, uids...))
	})
	for i := range rec.lines {
		api.release <- struct{}{}
		want := steps[i].want(uids...)
		if !assert.Eventually(t, func() bool { return reflect.DeepEqual(want, look(x, uids...)) }, waitLimit, time.Millisecond,
			"after line %d (%s %s)", i+1, rec.events[i].Type, rec.events[i].Object.Metadata.Name) {
			assert.Equal(t, want, look(x, uids...), "after line %d", i+1)
			return
		}
		switch i {
		case relabelled:
			uid := rec.events[i].Object.Metadata.UID
			v := look(x, uid)
			assert.Equal(t, rec.events[i].Object.Metadata.Labels, v.labels[uid], "labels reflect the patch")
			assert.Equal(t, addedRV[uid], v.created[uid], "a label change leaves the creation revision")
		case terminatingLine:
			uid := rec.events[i].Object.Metadata.UID
			v := look(x, uid)
			assert.NotContains(t, v.labels, uid, "a terminating pod is not selected")
			assert.Contains(t, v.created, uid, "but still indexed")
			assert.Equal(t, rec.events[i].Object.rv(t), v.terminated[uid], "terminating since this event")
		}
	}
	// The second watch, from the last line's revision, proves the whole
	// stream has been handled.
	require.Eventually(t, func() bool { return len(api.requests()) >= 3 }, waitLimit, time.Millisecond)

	t.Run("AfterStream", func(t *testing.T) {
		v := look(x, uids...)
		for _, uid := range deleted {
			assert.NotContains(t, v.created, uid, "deleted pods are gone")
		}
		assert.Equal(t, addedRV[replacement], v.created[replacement], "the replacement's creation is its ADDED event's revision")
		assert.Contains(t, v.labels, replacement, "the replacement is selected")
		assert.Equal(t, m.want(uids...), v)
	})
	t.Run("MetadataRequests", func(t *testing.T) {
		reqs := api.requests()
		require.GreaterOrEqual(t, len(reqs), 3)
		assert.False(t, reqs[0].watch)
		assert.Equal(t, apiclient.MetadataListAccept, reqs[0].accept, "LIST %s", reqs[0].query)
		for _, r := range reqs[1:] {
			assert.True(t, r.watch, "no relist")
			assert.Equal(t, apiclient.MetadataAccept, r.accept, "WATCH %s", r.query)
		}
		assert.Equal(t, rec.list.Metadata.ResourceVersion, reqs[1].rv, "the watch starts at the list's revision")
		assert.Equal(t, lastRV, reqs[2].rv, "and resumes from the last line's")
	})
}

func all(map[string]string) bool { return true }

// --- hand-made edge cases -----------------------------------------------------------------

// pod is a PartialObjectMetadata as the API server writes one.
type pod struct {
	ns, name, uid, rv string
	labels            map[string]string
	terminating       bool
}

func (p pod) json() []byte {
	if p.ns == "" {
		p.ns = ns
	}
	meta := map[string]any{"namespace": p.ns, "name": p.name, "uid": p.uid, "resourceVersion": p.rv,
		"creationTimestamp": "2026-01-01T00:00:00Z"}
	if p.labels != nil {
		meta["labels"] = p.labels
	}
	if p.terminating {
		meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
		meta["deletionGracePeriodSeconds"] = 0
	}
	b, err := json.Marshal(map[string]any{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
	if err != nil {
		panic(err)
	}
	return b
}

func event(typ watch.EventType, p pod) watch.Event {
	return watch.Event{Type: typ, Object: p.json(), ResourceVersion: p.rv}
}

func webapp(name, rv string) pod {
	return pod{name: name, uid: "uid-" + name, rv: rv, labels: map[string]string{"app": "webapp"}}
}

// relist feeds a complete list of pods.
func relist(x *podindex.Index, pods ...pod) {
	x.BeginList()
	for _, p := range pods {
		x.Handle(event(watch.Synced, p))
	}
	x.EndList()
}

func names(pods []Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// TestSelectReadiness ensures Select answers only when the index holds a
// complete list: not before the first, not during a relist, not after a
// list that failed half-way.
func TestSelectReadiness(t *testing.T) {
	for _, tc := range []struct {
		name   string
		feed   func(x *podindex.Index)
		wantOK bool
	}{
		{"BeforeFirstList", func(*podindex.Index) {}, false},
		{"WatchEventsBeforeFirstList", func(x *podindex.Index) { x.Handle(event(watch.Added, webapp("a", "5"))) }, false},
		{"FirstListInProgress", func(x *podindex.Index) { x.BeginList(); x.Handle(event(watch.Synced, webapp("a", "5"))) }, false},
		{"AfterFirstList", func(x *podindex.Index) { relist(x, webapp("a", "5")) }, true},
		{"AfterEmptyList", func(x *podindex.Index) { relist(x) }, true},
		{"DuringRelist", func(x *podindex.Index) {
			relist(x, webapp("a", "5"))
			x.BeginList()
			x.Handle(event(watch.Synced, webapp("a", "5")))
		}, false},
		{"RelistFailedHalfWayThenRetried", func(x *podindex.Index) {
			relist(x, webapp("a", "5"))
			x.BeginList()
			x.Handle(event(watch.Synced, webapp("a", "5")))
			relist(x, webapp("a", "5"))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := podindex.New(discard)
			tc.feed(x)
			pods, ok := selectWithoutRV(x, ns, all)
			assert.Equal(t, tc.wantOK, ok)
			if !tc.wantOK {
				assert.Empty(t, pods, "no partial answer")
			}
		})
	}
}

// TestEndList ensures a completed list leaves exactly the pods it showed:
// pods known before and not listed are dropped, whether they came from an
// earlier list or from the watch, and a pod listed again keeps what the
// index knew of it.
func TestEndList(t *testing.T) {
	for _, tc := range []struct {
		name       string
		before     func(x *podindex.Index)
		relist     []pod
		wantNames  []string
		wantLen    int
		wantCreate map[string]uint64 // uid → created
	}{
		{
			name:      "DropsPodsTheListDidNotShow",
			before:    func(x *podindex.Index) { relist(x, webapp("a", "5"), webapp("b", "6")) },
			relist:    []pod{webapp("b", "9")},
			wantNames: []string{"b"}, wantLen: 1,
			wantCreate: map[string]uint64{"uid-b": 0},
		},
		{
			name: "DropsWatchAddedPodsTheListDidNotShow",
			before: func(x *podindex.Index) {
				relist(x, webapp("a", "5"))
				x.Handle(event(watch.Added, webapp("c", "7")))
			},
			relist:    []pod{webapp("a", "8")},
			wantNames: []string{"a"}, wantLen: 1,
			wantCreate: map[string]uint64{"uid-a": 0},
		},
		{
			name: "KeepsCreationOfPodsListedAgain",
			before: func(x *podindex.Index) {
				relist(x, webapp("a", "5"))
				x.Handle(event(watch.Added, webapp("c", "7")))
			},
			relist:    []pod{webapp("a", "8"), webapp("c", "9"), webapp("d", "10")},
			wantNames: []string{"a", "c", "d"}, wantLen: 3,
			wantCreate: map[string]uint64{"uid-a": 0, "uid-c": 7, "uid-d": 0},
		},
		{
			name: "EmptyListDropsEverything",
			before: func(x *podindex.Index) {
				relist(x, webapp("a", "5"), pod{ns: "other", name: "o", uid: "uid-o", rv: "6"})
			},
			relist:    nil,
			wantNames: nil, wantLen: 0,
		},
		{
			name: "FailedListThenCompleteList",
			before: func(x *podindex.Index) {
				relist(x, webapp("a", "5"), webapp("b", "6"))
				x.BeginList() // a list that fails after one page
				x.Handle(event(watch.Synced, webapp("a", "5")))
			},
			relist:    []pod{webapp("b", "6")},
			wantNames: []string{"b"}, wantLen: 1,
			wantCreate: map[string]uint64{"uid-b": 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := podindex.New(discard)
			tc.before(x)
			relist(x, tc.relist...)
			pods, ok := selectWithoutRV(x, ns, all)
			require.True(t, ok)
			assert.Equal(t, tc.wantNames, names(pods))
			assert.Equal(t, tc.wantLen, x.Len())
			for uid, want := range tc.wantCreate {
				got, known := x.Created(context.Background(), ns, uid, 0)
				assert.True(t, known, uid)
				assert.Equal(t, want, got, uid)
			}
		})
	}
}

// TestSelect ensures Select returns the namespace's pods whose labels match
// and that are not terminating, and nothing of other namespaces.
func TestSelect(t *testing.T) {
	x := podindex.New(discard)
	relist(x,
		webapp("a", "5"),
		pod{name: "db", uid: "uid-db", rv: "6", labels: map[string]string{"app": "db"}},
		pod{name: "bare", uid: "uid-bare", rv: "7"},
		pod{name: "going", uid: "uid-going", rv: "8", labels: map[string]string{"app": "webapp"}, terminating: true},
		pod{ns: "other", name: "elsewhere", uid: "uid-elsewhere", rv: "9", labels: map[string]string{"app": "webapp"}},
	)
	app := func(v string) func(map[string]string) bool {
		return func(l map[string]string) bool { return l["app"] == v }
	}
	for _, tc := range []struct {
		name    string
		ns      string
		matches func(map[string]string) bool
		want    []string
	}{
		{"MatchingLabels", ns, app("webapp"), []string{"a"}},
		{"TerminatingPodsAreNotSelected", ns, all, []string{"a", "bare", "db"}},
		{"PodWithoutLabelsSeesEmptyLabels", ns, func(l map[string]string) bool { return len(l) == 0 }, []string{"bare"}},
		{"OtherNamespace", "other", app("webapp"), []string{"elsewhere"}},
		{"UnknownNamespace", "nowhere", all, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods, ok := selectWithoutRV(x, tc.ns, tc.matches)
			require.True(t, ok)
			assert.Equal(t, tc.want, names(pods))
		})
	}

	t.Run("PodBecomingTerminatingIsDropped", func(t *testing.T) {
		p := webapp("a", "10")
		p.terminating = true
		x.Handle(event(watch.Modified, p))
		pods, _ := selectWithoutRV(x, ns, app("webapp"))
		assert.Empty(t, pods)
		_, known := x.Created(context.Background(), ns, "uid-a", 0)
		assert.True(t, known, "a terminating pod is still indexed until DELETED")
	})
}

// TestCreatedRevision ensures the creation revision comes from a pod's ADDED
// event; 0 (unknown: older than any change) for a pod first seen in a list,
// whose revision there is its last update's, or modified; later events and
// lists never change it.
func TestCreatedRevision(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []watch.Event
		want   uint64
	}{
		{"AddedEvent", []watch.Event{event(watch.Added, webapp("a", "42"))}, 42},
		{"ListEntryIsZero", []watch.Event{event(watch.Synced, webapp("a", "42"))}, 0},
		{"ModifiedForUnknownPodIsZero", []watch.Event{event(watch.Modified, webapp("a", "42"))}, 0},
		{"LaterModifiedKeepsIt", []watch.Event{event(watch.Added, webapp("a", "42")), event(watch.Modified, webapp("a", "50"))}, 42},
		{"LaterListEntryKeepsIt", []watch.Event{event(watch.Added, webapp("a", "42")), event(watch.Synced, webapp("a", "60"))}, 42},
		{"ZeroStaysZero", []watch.Event{event(watch.Modified, webapp("a", "42")), event(watch.Modified, webapp("a", "43"))}, 0},
		{"UnparsableRevisionIsZero", []watch.Event{event(watch.Added, webapp("a", "not-a-number"))}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x)
			for _, ev := range tc.events {
				x.Handle(ev)
			}
			got, known := x.Created(context.Background(), ns, "uid-a", 0)
			require.True(t, known)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestDeletedRemovesByUID ensures DELETED removes the pod with that uid, and
// only it: a same-named replacement (a StatefulSet's) stays.
func TestDeletedRemovesByUID(t *testing.T) {
	x := podindex.New(discard)
	old := pod{name: "web-0", uid: "uid-old", rv: "5", labels: map[string]string{"app": "web"}}
	repl := pod{name: "web-0", uid: "uid-new", rv: "9", labels: map[string]string{"app": "web"}}
	relist(x, old)
	x.Handle(event(watch.Added, repl))
	old.rv = "10"
	x.Handle(event(watch.Deleted, old))
	pods, _ := selectWithoutRV(x, ns, all)
	assert.Equal(t, []Pod{{Name: "web-0", UID: "uid-new"}}, pods)
	assert.Equal(t, 1, x.Len())

	x.Handle(event(watch.Deleted, pod{name: "ghost", uid: "uid-ghost", rv: "11"}))
	assert.Equal(t, 1, x.Len(), "deleting an unknown pod changes nothing")
}

// TestSkipsObjectsWithoutIdentity ensures objects without namespace, name
// or uid are skipped without a panic and without touching the index, for
// every event type.
func TestSkipsObjectsWithoutIdentity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		object string
	}{
		{"NoNamespace", `{"metadata":{"name":"uid-a","uid":"uid-a","resourceVersion":"5"}}`},
		{"NoName", `{"metadata":{"namespace":"default","uid":"uid-a","resourceVersion":"5"}}`},
		{"NoUID", `{"metadata":{"namespace":"default","name":"a","resourceVersion":"5"}}`},
		{"EmptyStrings", `{"metadata":{"namespace":"","name":"","uid":""}}`},
		{"NoMetadata", `{"kind":"PartialObjectMetadata"}`},
		{"MetadataNotAnObject", `{"metadata":"default/a"}`},
		{"EmptyObject", `{}`},
		{"Null", `null`},
		{"Array", `[1,2,3]`},
		{"Empty", ``},
		{"BookmarkShape", `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"251"}}`},
	} {
		for _, typ := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted, watch.Synced} {
			t.Run(tc.name+"/"+string(typ), func(t *testing.T) {
				x := podindex.New(discard)
				relist(x, webapp("a", "5"))
				assert.NotPanics(t, func() {
					x.Handle(watch.Event{Type: typ, Object: []byte(tc.object), ResourceVersion: "5"})
				})
				pods, ok := selectWithoutRV(x, ns, all)
				assert.True(t, ok)
				assert.Equal(t, []string{"a"}, names(pods), "the index is unchanged")
				assert.Equal(t, 1, x.Len())
			})
		}
	}
}

// TestMalformedJSONDoesNotPanic ensures a malformed object (which the watch
// decoder refuses before it gets here, but a handler must not trust that)
// neither panics nor disturbs the index beyond the one pod it may name.
func TestMalformedJSONDoesNotPanic(t *testing.T) {
	for _, tc := range []struct {
		name   string
		object string
	}{
		{"Garbage", `}{not json at all`},
		{"Truncated", `{"metadata":{"namespace":"default","name":"b","uid":"uid-b","resourceVers`},
		{"TruncatedInString", `{"metadata":{"namespace":"def`},
		{"TruncatedInLabels", `{"metadata":{"namespace":"default","name":"b","uid":"uid-b","labels":{"app":"web`},
		{"UnclosedEscape", `{"metadata":{"namespace":"default","name":"b\`},
		{"BinaryNoise", "\x00\xff\xfe{\"metadata\x00"},
		{"InvalidUTF8", "{\"metadata\":{\"namespace\":\"default\",\"name\":\"\xff\xfe\",\"uid\":\"uid-b\"}}"},
		{"DeepNesting", strings.Repeat(`{"metadata":`, 10000)},
	} {
		for _, typ := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted, watch.Synced} {
			t.Run(tc.name+"/"+string(typ), func(t *testing.T) {
				x := podindex.New(discard)
				relist(x, webapp("a", "5"))
				assert.NotPanics(t, func() {
					x.Handle(watch.Event{Type: typ, Object: []byte(tc.object), ResourceVersion: "5"})
				})
				pods, ok := selectWithoutRV(x, ns, all)
				assert.True(t, ok)
				assert.Contains(t, names(pods), "a", "the listed pod is untouched")
				assert.LessOrEqual(t, x.Len(), 2)
			})
		}
	}
}

// TestOddButIdentifiedObjects ensures an object that names a pod but carries
// odd metadata (labels of the wrong shape, a huge revision) is indexed
// without a panic, with what can be read of it.
func TestOddButIdentifiedObjects(t *testing.T) {
	for _, tc := range []struct {
		name        string
		object      string
		wantCreated uint64
	}{
		{"LabelsArray", `{"metadata":{"namespace":"default","name":"a","uid":"u","resourceVersion":"5","labels":["x","y"]}}`, 5},
		{"LabelsString", `{"metadata":{"namespace":"default","name":"a","uid":"u","resourceVersion":"5","labels":"app=webapp"}}`, 5},
		{"LabelValuesNotStrings", `{"metadata":{"namespace":"default","name":"a","uid":"u","resourceVersion":"5","labels":{"n":1,"o":{"p":null}}}}`, 5},
		{"RevisionNumber", `{"metadata":{"namespace":"default","name":"a","uid":"u","resourceVersion":5}}`, 5},
		{"EscapedStrings", `{"metadata":{"namespace":"def\u0061ult","name":"\u0061","uid":"u","resourceVersion":"5","labels":{"\u0061pp":"w\"eb"}}}`, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x)
			obj := []byte(tc.object)
			assert.NotPanics(t, func() { x.Handle(watch.Event{Type: watch.Added, Object: obj, ResourceVersion: "5"}) })
			clear(obj) // the index keeps nothing of the buffer
			assert.Equal(t, 1, x.Len())
			got, known := x.Created(context.Background(), ns, "u", 0)
			assert.True(t, known)
			assert.Equal(t, tc.wantCreated, got)
			pods, _ := selectWithoutRV(x, ns, all)
			assert.Equal(t, []Pod{{Name: "a", UID: "u"}}, pods)
		})
	}
}

// TestKeepsNothingOfTheEventBuffer ensures names, uids and labels are copied
// out of the event, whose buffer the decoder reuses for the next line.
func TestKeepsNothingOfTheEventBuffer(t *testing.T) {
	x := podindex.New(discard)
	relist(x)
	ev := event(watch.Added, webapp("a", "5"))
	x.Handle(ev)
	for i := range ev.Object {
		ev.Object[i] = 'x'
	}
	var labels map[string]string
	pods, _ := selectWithoutRV(x, ns, func(l map[string]string) bool { labels = l; return true })
	assert.Equal(t, []Pod{{Name: "a", UID: "uid-a"}}, pods)
	assert.Equal(t, map[string]string{"app": "webapp"}, labels)
}

// TestCreatedWaits ensures Created waits for a pod the index does not hold
// yet, returns as soon as it appears, gives up after its wait, and at once
// when its context ends. (synctest: Wait proves Created is blocked before the
// pod is handed over, and the fake clock makes the waits exact.)
func TestCreatedWaits(t *testing.T) {
	type result struct {
		created uint64
		known   bool
		waited  time.Duration
	}
	created := func(ctx context.Context, x *podindex.Index, uid string, wait time.Duration) <-chan result {
		out := make(chan result, 1)
		go func() {
			start := time.Now()
			c, k := x.Created(ctx, ns, uid, wait)
			out <- result{c, k, time.Since(start)}
		}()
		return out
	}

	t.Run("PodThatAppearsLater", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x, webapp("a", "5"))
			res := created(t.Context(), x, "uid-late", time.Minute)
			synctest.Wait()
			select {
			case r := <-res:
				t.Fatalf("Created returned %+v before the pod appeared", r)
			default:
			}
			go x.Handle(event(watch.Modified, webapp("other", "6"))) // another pod: keep waiting
			synctest.Wait()
			require.Empty(t, res)
			go x.Handle(event(watch.Added, webapp("late", "7")))
			r := <-res
			assert.Equal(t, result{created: 7, known: true}, r, "at once, no time passed")
		})
	})
	t.Run("PodThatNeverAppears", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x, webapp("a", "5"))
			res := created(t.Context(), x, "uid-never", 5*time.Second)
			synctest.Wait()
			x.Handle(event(watch.Added, webapp("b", "6"))) // changes, none of them the pod
			relist(x, webapp("a", "5"), webapp("b", "6"))
			r := <-res
			assert.Equal(t, result{known: false, waited: 5 * time.Second}, r)
		})
	})
	t.Run("ContextCancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x, webapp("a", "5"))
			ctx, cancel := context.WithCancel(t.Context())
			res := created(ctx, x, "uid-never", time.Hour)
			synctest.Wait()
			cancel()
			r := <-res
			assert.Equal(t, result{known: false}, r, "at once, not after the hour")
		})
	})
	t.Run("KnownPodAtOnce", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x, webapp("a", "5"))
			r := <-created(t.Context(), x, "uid-a", time.Hour)
			assert.Equal(t, result{created: 0, known: true}, r, "listed: older than any change")
		})
	})
}

// TestTerminated ensures Terminated reports the revision of the first event
// that showed a pod with a deletionTimestamp, or of its deletion when none
// did, keeps it after the pod is gone, and knows nothing of a pod that is
// not terminating.
func TestTerminated(t *testing.T) {
	going := func(rv string) pod { p := webapp("a", rv); p.terminating = true; return p }
	for _, tc := range []struct {
		name      string
		events    []watch.Event
		wantSince uint64
		wantKnown bool
	}{
		{"NotTerminating", []watch.Event{event(watch.Modified, webapp("a", "6"))}, 0, false},
		{"FirstTerminatingEvent", []watch.Event{event(watch.Modified, going("6")), event(watch.Modified, going("7"))}, 6, true},
		{"DeletedAfterTerminating", []watch.Event{event(watch.Modified, going("6")), event(watch.Deleted, going("8"))}, 6, true},
		{"DeletedWithoutTerminatingEvent", []watch.Event{event(watch.Deleted, webapp("a", "8"))}, 8, true},
		{"DeletedUnknownPod", []watch.Event{event(watch.Deleted, webapp("z", "9"))}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x, webapp("a", "5"))
			for _, ev := range tc.events {
				x.Handle(ev)
			}
			since, known := x.Terminated(context.Background(), ns, "uid-a", 0)
			assert.Equal(t, tc.wantKnown, known)
			assert.Equal(t, tc.wantSince, since)
		})
	}
	t.Run("ListedTerminating", func(t *testing.T) {
		x := podindex.New(discard)
		relist(x, going("5"))
		since, known := x.Terminated(context.Background(), ns, "uid-a", 0)
		assert.True(t, known)
		assert.Equal(t, uint64(5), since)
	})
	// A pod a relist finds gone (its events lost with a 410) is not waited
	// for: no event will tell its termination, and a round that asked held
	// its worker for the whole wait (simulator seed 8913). One whose
	// termination an event told keeps it.
	for _, tc := range []struct {
		name      string
		events    []watch.Event
		wantSince uint64
		wantKnown bool
	}{
		{"GoneInARelist", nil, 0, false},
		{"TerminatingThenGoneInARelist", []watch.Event{event(watch.Modified, going("6"))}, 6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := podindex.New(discard)
			relist(x, webapp("a", "5"))
			for _, ev := range tc.events {
				x.Handle(ev)
			}
			relist(x)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			since, known := x.Terminated(ctx, ns, "uid-a", time.Hour)
			require.NoError(t, ctx.Err(), "waited for an event that will not come")
			assert.Equal(t, tc.wantKnown, known)
			assert.Equal(t, tc.wantSince, since)
		})
	}
}

// TestCreatedUnknownForPodFirstSeenInARelist ensures a pod the watch missed
// (its ADDED event lost with a 410), first seen in the relist, is reported
// created at 0, before any change, during the relist and after it: its
// revision there is that of its last update, which may follow a change
// its creation preceded.
func TestCreatedUnknownForPodFirstSeenInARelist(t *testing.T) {
	x := podindex.New(discard)
	relist(x, webapp("a", "5"))

	x.BeginList() // after a 410: pods missed by the watch show up here
	x.Handle(event(watch.Synced, webapp("missed", "90")))
	created, known := x.Created(context.Background(), ns, "uid-missed", 0)
	require.True(t, known)
	assert.Zero(t, created, "during the relist")

	x.EndList()
	created, known = x.Created(context.Background(), ns, "uid-missed", 0)
	require.True(t, known)
	assert.Zero(t, created, "after it")
}

// TestUnchangedLabelsKeepTheirMap ensures an update that leaves the labels
// as they were (a status update) keeps the same map and allocates nothing
// for it, and that a label change does make a new map.
func TestUnchangedLabelsKeepTheirMap(t *testing.T) {
	x := podindex.New(discard)
	p := pod{name: "a", uid: "uid-a", rv: "5", labels: map[string]string{"app": "webapp", "pod-template-hash": "7466656dc8"}}
	relist(x, p)
	labelsOf := func() map[string]string {
		var got map[string]string
		selectPods(x, ns, func(l map[string]string) bool { got = l; return true })
		return got
	}
	same := func(a, b map[string]string) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}

	before := labelsOf()
	p.rv = "6"
	statusOnly := event(watch.Modified, p)
	x.Handle(statusOnly)
	assert.True(t, same(before, labelsOf()), "a status-only update keeps the map")

	relabel := p
	relabel.labels = map[string]string{"app": "webapp", "pod-template-hash": "7466656dc8", "tier": "x"}
	x.Handle(event(watch.Modified, relabel))
	assert.False(t, same(before, labelsOf()), "a label change makes a new map")
	assert.Equal(t, relabel.labels, labelsOf())
	x.Handle(statusOnly)
	assert.Equal(t, p.labels, labelsOf(), "and a label removal too")

	// Allocations: a status-only update costs what handling a DELETED of an
	// unknown pod costs (the same parse, lock and wake-up), nothing more.
	unknown := event(watch.Deleted, pod{name: "ghost", uid: "uid-ghost", rv: "7"})
	base := testing.AllocsPerRun(100, func() { x.Handle(unknown) })
	update := testing.AllocsPerRun(100, func() { x.Handle(statusOnly) })
	relabelled := event(watch.Modified, relabel)
	flip := 0
	change := testing.AllocsPerRun(100, func() {
		if flip++; flip%2 == 0 {
			x.Handle(relabelled)
		} else {
			x.Handle(statusOnly)
		}
	})
	assert.LessOrEqual(t, update, base, "a status-only update allocates for its labels")
	assert.Greater(t, change, base, "the measure sees label allocations")
}

// --- fuzzing ----------------------------------------------------------------------------

// FuzzHandle ensures no event, however malformed, panics Handle; that one
// event changes the pod count by at most one in its direction; that the index
// keeps nothing of the event's buffer; and that a relist afterwards leaves
// exactly the listed pods.
func FuzzHandle(f *testing.F) {
	listItems, seeds := fuzzSeeds(f)
	for _, s := range seeds {
		f.Add(s.typ, s.object)
	}
	var listed []Pod
	for _, it := range listItems {
		var p wirePod
		if json.Unmarshal(it, &p) == nil && p.Metadata.DeletionTimestamp == nil && p.Metadata.Namespace == ns {
			listed = append(listed, Pod{Name: p.Metadata.Name, UID: p.Metadata.UID})
		}
	}
	sortPods(listed)
	doList := func(x *podindex.Index) {
		x.BeginList()
		for _, it := range listItems {
			x.Handle(watch.Event{Type: watch.Synced, Object: it})
		}
		x.EndList()
	}
	f.Fuzz(func(t *testing.T, typ string, object []byte) {
		x := podindex.New(discard)
		doList(x)
		before := x.Len()
		buf := bytes.Clone(object)
		x.Handle(watch.Event{Type: watch.EventType(typ), Object: buf, ResourceVersion: "1"})
		after := x.Len()
		if d := after - before; d < -1 || d > 1 {
			t.Fatalf("one %s event moved Len from %d to %d", typ, before, after)
		}
		if watch.EventType(typ) == watch.Deleted && after > before {
			t.Fatalf("DELETED grew Len from %d to %d", before, after)
		}
		if watch.EventType(typ) != watch.Deleted && after < before {
			t.Fatalf("%s shrank Len from %d to %d", typ, before, after)
		}

		// snapshot renders what Select shows: each pod with its labels.
		snapshot := func() string {
			var labels []string // one per candidate, in Select's order
			pods, _ := selectWithoutRV(x, ns, func(l map[string]string) bool {
				var b strings.Builder
				for _, k := range slices.Sorted(maps.Keys(l)) {
					fmt.Fprintf(&b, "%q=%q,", k, l[k])
				}
				labels = append(labels, b.String())
				return true
			})
			var out []string
			for i, p := range pods {
				out = append(out, fmt.Sprintf("%q/%q{%s}", p.Name, p.UID, labels[i]))
			}
			slices.Sort(out)
			return strings.Join(out, ";")
		}
		was := snapshot()
		for i := range buf {
			buf[i] = '#'
		}
		if now := snapshot(); now != was {
			t.Fatalf("the index changed with the event's buffer:\n%s\n%s", was, now)
		}

		x.Handle(watch.Event{Type: watch.Deleted, Object: object, ResourceVersion: "2"})
		if n := x.Len(); n > after || n < after-1 {
			t.Fatalf("DELETED of the same object moved Len from %d to %d", after, n)
		}

		doList(x)
		if n := x.Len(); n != len(listItems) {
			t.Fatalf("after a relist of %d pods Len is %d", len(listItems), n)
		}
		pods, ok := selectWithoutRV(x, ns, all)
		if !ok || !slices.Equal(sortPods(pods), listed) {
			t.Fatalf("after a relist Select gives %v (ok %v), want %v", pods, ok, listed)
		}
	})
}

type fuzzSeed struct {
	typ    string
	object []byte
}

// fuzzSeeds returns the recorded list's items (raw) and seeds: every recorded
// line's object with its type, every list item as SYNCED, and odd shapes.
func fuzzSeeds(f *testing.F) ([]json.RawMessage, []fuzzSeed) {
	var list wireList
	b, err := os.ReadFile(filepath.Join(recorded, "pods-metadata-list.json"))
	if err != nil {
		f.Fatalf("read the recorded list (make record writes it): %v", err)
	}
	if err := json.Unmarshal(b, &list); err != nil {
		f.Fatal(err)
	}
	var seeds []fuzzSeed
	for _, it := range list.Items {
		seeds = append(seeds, fuzzSeed{string(watch.Synced), it})
	}
	b, err = os.ReadFile(filepath.Join(recorded, "pods-metadata-watch.ndjson"))
	if err != nil {
		f.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, fuzzSeed{ev.Type, ev.Object})
	}
	for _, s := range []string{
		``, `{}`, `null`, `{"metadata":{"namespace":"default","name":"a","uid":"u","labels":["x"]}}`,
		`{"metadata":{"namespace":"default","name":"a","uid":"u","labels":{"a":"1","a":"2"}}}`,
		`{"metadata":{"namespace":"default","name":"a","uid":"u","resourceVersion":"18446744073709551616"}}`,
		`{"metadata":{"namespace":"default","name":"a","uid":"u","deletionTimestamp":null}}`,
		`{"metadata":{"namespace":"default","name":"a","uid":"u"`,
	} {
		seeds = append(seeds, fuzzSeed{string(watch.Added), []byte(s)}, fuzzSeed{string(watch.Modified), []byte(s)})
	}
	return list.Items, seeds
}

// Pod is a pod the index shows selected: what a deletion decided from it
// carries (name, uid, and its resourceVersion as a precondition).
type Pod struct {
	Name, UID, ResourceVersion string
}

// selectPods returns, from the index's View, the pods of namespace whose
// labels match and that are not terminating, as a round takes them.
func selectPods(x *podindex.Index, namespace string, matches func(map[string]string) bool) ([]Pod, bool) {
	recs, ok := x.View(namespace)
	if !ok {
		return nil, false
	}
	var pods []Pod
	for _, r := range recs {
		if !r.Terminating && matches(r.Labels) {
			pods = append(pods, Pod{Name: r.Name, UID: r.UID, ResourceVersion: r.ResourceVersion})
		}
	}
	return pods, true
}

// selectWithoutRV is selectPods with the resourceVersions left out, for the
// tests that compare names and uids (TestSelectReportsResourceVersion
// checks them).
func selectWithoutRV(x *podindex.Index, ns string, matches func(map[string]string) bool) ([]Pod, bool) {
	pods, ok := selectPods(x, ns, matches)
	for i := range pods {
		pods[i].ResourceVersion = ""
	}
	return pods, ok
}

// TestSelectReportsResourceVersion ensures the index gives each pod's
// resourceVersion as last seen: a deletion decided from the index carries
// it as a precondition.
func TestSelectReportsResourceVersion(t *testing.T) {
	x := podindex.New(nil)
	x.BeginList()
	x.Handle(watch.Event{Type: watch.Synced, Object: []byte(`{"metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"7","labels":{"app":"web"}}}`)})
	x.EndList()
	x.Handle(watch.Event{Type: watch.Modified, Object: []byte(`{"metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"9","labels":{"app":"web"}}}`)})
	pods, ok := selectPods(x, "ns", func(map[string]string) bool { return true })
	require.True(t, ok)
	assert.Equal(t, []Pod{{Name: "a", UID: "u", ResourceVersion: "9"}}, pods)
}
