package watch

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// added is an ADDED line of a WatchList's initial events.
func added(name, rv string) string {
	return event(Added, configMap(name, rv, map[string]string{"message": "Hello"}))
}

// plainBookmark is a periodic bookmark: no initial-events-end annotation.
func plainBookmark(rv string) string {
	return fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":%q}}}`, rv)
}

// watchListQuery is what a WatchList request must ask for.
func assertWatchListQuery(t *testing.T, q url.Values) {
	t.Helper()
	assert.Equal(t, "true", q.Get("sendInitialEvents"))
	assert.Equal(t, "NotOlderThan", q.Get("resourceVersionMatch"))
	assert.Equal(t, "true", q.Get("allowWatchBookmarks"))
	assert.True(t, q.Has("resourceVersion") && q.Get("resourceVersion") == "", "no resourceVersion: the most recent state, %v", q)
}

// TestWatchListStreamsTheInitialState ensures that with WatchList the initial
// state arrives on the watch (no LIST): its ADDED events are handed over as
// Synced between BeginList and EndList, the list ends at the
// initial-events-end bookmark, whose resourceVersion the next watch resumes
// from, and the same stream goes on as a plain watch.
func TestWatchListStreamsTheInitialState(t *testing.T) {
	api := newFakeAPI(t).onWatch(stream(added("a", "90"), plainBookmark("95"), added("b", "91"), bookmark("100"), modified("a", "101")))
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", WatchList: true}).run(t)
	api.waitWatches(t, 2)
	require.Eventually(t, l.lw.Ready, waitLimit, time.Millisecond)
	l.stop(t)

	assert.Equal(t, []string{"BeginList", "SYNCED a@90", "SYNCED b@91", "EndList", "MODIFIED a@101"}, l.h.seen())
	assert.Empty(t, api.listRequests(), "no LIST")
	watches := api.watchRequests()
	assertWatchListQuery(t, watches[0].Query)
	assert.Equal(t, "101", watches[1].Query.Get("resourceVersion"), "resumed from the last event, as a plain watch")
	assert.False(t, watches[1].Query.Has("sendInitialEvents"))
	assert.Equal(t, uint64(2), l.m.Events.Value("ADDED"))
}

// TestWatchListReplayRecorded ensures the WatchList streams a real API server
// sent, from etcd (watch cache off) and from the watch cache, are read as a
// complete list at the initial-events-end bookmark's resourceVersion, and
// that what follows on the stream moves it on as a plain watch.
func TestWatchListReplayRecorded(t *testing.T) {
	for _, file := range []string{"watchlist-initial-events.ndjson", "watchlist-cached.ndjson"} {
		t.Run(file, func(t *testing.T) {
			lines := readLines(t, fixture(t, "../testdata/recorded", true, file))
			want := []string{"BeginList"}
			var lastRV string
			ended := false
			for _, line := range lines {
				ev, m := wireDecode(t, line)
				switch {
				case !ended && ev.Type == string(Added):
					want = append(want, "SYNCED "+m.Metadata.Name+"@"+m.Metadata.ResourceVersion)
				case !ended && ev.Type == string(Bookmark):
					require.Contains(t, string(ev.Object), initialEventsEnd, "the first bookmark ends the initial events")
					want = append(want, "EndList")
					ended = true
				case ev.Type != string(Bookmark):
					want = append(want, ev.Type+" "+m.Metadata.Name+"@"+m.Metadata.ResourceVersion)
				}
				lastRV = m.Metadata.ResourceVersion
			}
			require.True(t, ended, "the recording has an initial-events-end bookmark")
			api := newFakeAPI(t).onWatch(stream(lines...))
			srv := api.start()
			l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", WatchList: true}).run(t)
			api.waitWatches(t, 2)
			l.stop(t)

			assert.Equal(t, want, l.h.seen())
			assert.Equal(t, []string{"", lastRV}, api.watchRVs())
			assert.Empty(t, api.listRequests())
			assert.Zero(t, l.m.Malformed.Value())
		})
	}
}

// TestWatchListFallsBackToPagedList ensures a server that refuses a WatchList
// (400, 422) or does not honour it (an event other than ADDED before the
// initial-events-end bookmark, the stream ending or going silent before it)
// gets a paged LIST instead, and that every later relist is paged too.
func TestWatchListFallsBackToPagedList(t *testing.T) {
	invalid := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","reason":"Invalid","code":422}`
	tests := []struct {
		name        string
		first       reply
		wantHandled []string // before the fallback
	}{
		{name: "Invalid422FallsBack", first: status(http.StatusUnprocessableEntity, invalid)},
		{name: "BadRequest400FallsBack", first: status(http.StatusBadRequest, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`)},
		{name: "ModifiedBeforeEndFallsBack", first: stream(added("a", "90"), modified("a", "91")), wantHandled: []string{"BeginList", "SYNCED a@90"}},
		{name: "EndOfStreamBeforeEndFallsBack", first: stream(added("a", "90")), wantHandled: []string{"BeginList", "SYNCED a@90"}},
		{name: "SilenceBeforeEndFallsBack", first: func(w http.ResponseWriter, r *http.Request) {
			serveLines(w, added("a", "90")) // what a server ignoring sendInitialEvents sends, then nothing
			<-r.Context().Done()
		}, wantHandled: []string{"BeginList", "SYNCED a@90"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).
				onWatch(tt.first, stream(goneEvent)).
				onList(oneItemList(), list("200", "", item("b", "150")))
			srv := api.start()
			l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", WatchList: true, InitialEventsTimeout: 50 * time.Millisecond}).run(t)
			api.waitWatches(t, 3)
			l.stop(t)

			want := append(append([]string(nil), tt.wantHandled...), "BeginList", "SYNCED a@90", "EndList", "BeginList", "SYNCED b@150", "EndList")
			assert.Equal(t, want, l.h.seen())
			assert.Len(t, api.listRequests(), 2, "the first list and the relist after 410 are paged")
			watches := api.watchRequests()
			assertWatchListQuery(t, watches[0].Query)
			assert.Equal(t, []string{"100", "200"}, api.watchRVs()[1:])
			assert.Contains(t, l.logs.String(), "falling back to paged lists")
		})
	}
}

// TestWatchListFailuresRetryTheStream ensures a WatchList that fails for a
// reason other than the server's support (410 in the middle of the initial
// events, a stream cut in the middle of an event, 500) is never ended and
// is retried as a WatchList, and that a 410 after the list streams a relist.
func TestWatchListFailuresRetryTheStream(t *testing.T) {
	cut := added("b", "91")
	tests := []struct {
		name       string
		first      reply
		wantFirst  []string
		wantRelist uint64
	}{
		{name: "Gone410MidInitialEventsRelists", first: stream(added("a", "90"), goneEvent), wantFirst: []string{"BeginList", "SYNCED a@90"}, wantRelist: 1},
		{name: "CutMidEventRetries", first: streamCut(cut[:len(cut)/2], added("a", "90")), wantFirst: []string{"BeginList", "SYNCED a@90"}},
		{name: "InternalErrorRetries", first: status(http.StatusInternalServerError, internalStatus)},
		{name: "Gone410AfterTheListRelists", first: stream(added("a", "80"), bookmark("85"), goneEvent), wantFirst: []string{"BeginList", "SYNCED a@80", "EndList"}, wantRelist: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).onWatch(tt.first, stream(added("a", "90"), added("b", "91"), bookmark("100")))
			srv := api.start()
			l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", WatchList: true}).run(t)
			api.waitWatches(t, 3)
			l.stop(t)

			want := append(append([]string(nil), tt.wantFirst...), "BeginList", "SYNCED a@90", "SYNCED b@91", "EndList")
			assert.Equal(t, want, l.h.seen())
			assert.Empty(t, api.listRequests(), "never a paged LIST")
			watches := api.watchRequests()
			assertWatchListQuery(t, watches[0].Query)
			assertWatchListQuery(t, watches[1].Query)
			assert.Equal(t, "100", watches[2].Query.Get("resourceVersion"))
			assert.Equal(t, tt.wantRelist, l.m.Relists.Value())
			assert.NotContains(t, l.logs.String(), "falling back")
		})
	}
}

// TestWatchListNotReadyUntilTheEnd ensures the loop is neither ready nor
// watching while the initial events stream, and is both once they end.
func TestWatchListNotReadyUntilTheEnd(t *testing.T) {
	gate := make(chan struct{})
	api := newFakeAPI(t).onWatch(func(w http.ResponseWriter, r *http.Request) {
		serveLines(w, added("a", "90"))
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, bookmark("100")+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", WatchList: true}).run(t)
	l.waitHandled(t, 2)
	assert.False(t, l.lw.Ready(), "ready before the initial-events-end bookmark")
	assert.False(t, l.lw.Watching())
	close(gate)
	require.Eventually(t, func() bool { return l.lw.Ready() && l.lw.Watching() }, waitLimit, time.Millisecond)
	l.stop(t)
	assert.Equal(t, []string{"BeginList", "SYNCED a@90", "EndList"}, l.h.seen())
}

// TestPagedListCutMidItemRestarts ensures a list page cut in the middle of an
// item fails the list (never ended) and the list starts over from its first
// page.
func TestPagedListCutMidItemRestarts(t *testing.T) {
	full := fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"100"},"items":[%s,%s]}`, item("a", "90"), item("b", "91"))
	cutAt := strings.Index(full, `"name":"b"`) + 5
	api := newFakeAPI(t).onList(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(full[:cutAt]))
		w.(http.Flusher).Flush()
		// The handler returns: a chunked response ends without its last chunk.
		panic(http.ErrAbortHandler)
	}, ok(full))
	srv := api.start()
	l := startLoop(t, srv.URL)
	api.waitWatches(t, 1)
	l.stop(t)

	assert.Equal(t, []string{"BeginList", "SYNCED a@90", "BeginList", "SYNCED a@90", "SYNCED b@91", "EndList"}, l.h.seen())
	lists := api.listRequests()
	require.Len(t, lists, 2)
	assert.False(t, lists[1].Query.Has("continue"))
	assert.Equal(t, []string{"100"}, api.watchRVs())
	assert.Contains(t, l.logs.String(), "list failed")
}
