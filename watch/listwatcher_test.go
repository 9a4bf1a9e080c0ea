package watch

import (
	"crypto/sha256"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/fixture"
)

// listed is what the handler sees of the standard one-item list at RV 100.
var listed = []string{"BeginList", "SYNCED a@90", "EndList"}

// oneItemList is the standard initial list: one ConfigMap, resourceVersion 100.
func oneItemList() reply { return list("100", "", item("a", "90")) }

// TestListWatcherListsPagesThenWatches ensures the initial list follows its
// continue token, hands every item to the handler as Synced between BeginList
// and EndList, then watches from the list's resourceVersion with bookmarks and
// a server timeout in [300 s, 600 s).
func TestListWatcherListsPagesThenWatches(t *testing.T) {
	api := newFakeAPI(t).
		onList(list("100", "tok-page-2", item("a", "90"), item("b", "91")), list("100", "", item("c", "95"))).
		onWatch(stream(modified("a", "101")))
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", PageSize: 2}).run(t)
	api.waitWatches(t, 2)
	l.stop(t)

	assert.Equal(t, []string{"BeginList", "SYNCED a@90", "SYNCED b@91", "SYNCED c@95", "EndList", "MODIFIED a@101"}, l.h.seen())
	lists := api.listRequests()
	require.Len(t, lists, 2)
	assert.Equal(t, url.Values{"limit": {"2"}}, lists[0].Query, "first page: no continue, no resourceVersion (most recent)")
	assert.Equal(t, url.Values{"limit": {"2"}, "continue": {"tok-page-2"}}, lists[1].Query)
	assert.Equal(t, []string{"100", "101"}, api.watchRVs())
	for i, w := range api.watchRequests() {
		assert.Equal(t, "true", w.Query.Get("allowWatchBookmarks"), "watch #%d", i+1)
		secs, err := strconv.Atoi(w.Query.Get("timeoutSeconds"))
		require.NoError(t, err, "watch #%d timeoutSeconds", i+1)
		assert.GreaterOrEqual(t, secs, 300, "watch #%d timeoutSeconds", i+1)
		assert.Less(t, secs, 600, "watch #%d timeoutSeconds", i+1)
		assert.Len(t, w.Query, 4, "watch #%d: only watch, resourceVersion, allowWatchBookmarks, timeoutSeconds: %v", i+1, w.Query)
	}
	assert.Equal(t, uint64(1), l.m.WatchStarts.Value("initial"))
	assert.Equal(t, uint64(1), l.m.WatchStarts.Value("eof"))
	assert.Empty(t, l.after.requested(), "a watch that delivered events is resumed at once")
}

// TestListWatcherSelectorsNarrowListAndWatch ensures a field selector (the
// Secrets not Helm's) and a label selector (the Namespaces that opted in) go
// with every list page and every watch, so the server never sends what they
// exclude.
func TestListWatcherSelectorsNarrowListAndWatch(t *testing.T) {
	for _, tt := range []struct{ name, param, value string }{
		{"FieldSelector", "fieldSelector", "type!=helm.sh/release.v1"},
		{"LabelSelector", "labelSelector", "config-watcher.k8spatterns.io/enabled=true"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).
				onList(list("100", "tok-page-2", item("a", "90")), list("100", "", item("c", "95"))).
				onWatch(stream(modified("a", "101")))
			srv := api.start()
			cfg := Config{PageSize: 1, FieldSelector: tt.value}
			if tt.param == "labelSelector" {
				cfg = Config{PageSize: 1, LabelSelector: tt.value}
			}
			l := newLoop(t, srv.URL, cfg).run(t)
			api.waitWatches(t, 2)
			l.stop(t)

			lists := api.listRequests()
			require.Len(t, lists, 2)
			for i, r := range append(lists, api.watchRequests()...) {
				assert.Equal(t, tt.value, r.Query.Get(tt.param), "request #%d: %v", i+1, r.Query)
			}
		})
	}
}

// TestListWatcherWatchTimeoutWithinBounds ensures timeoutSeconds of every
// watch lies within the configured [MinWatchTimeout, MaxWatchTimeout).
func TestListWatcherWatchTimeoutWithinBounds(t *testing.T) {
	var watches []reply
	for i := range 20 {
		watches = append(watches, stream(modified("a", strconv.Itoa(101+i))))
	}
	api := newFakeAPI(t).onList(oneItemList()).onWatch(watches...)
	srv := api.start()
	l := newLoop(t, srv.URL, Config{MinWatchTimeout: 10 * time.Second, MaxWatchTimeout: 13 * time.Second}).run(t)
	api.waitWatches(t, 21)
	l.stop(t)

	seen := map[int]bool{}
	for i, w := range api.watchRequests() {
		secs, err := strconv.Atoi(w.Query.Get("timeoutSeconds"))
		require.NoError(t, err, "watch #%d timeoutSeconds", i+1)
		assert.GreaterOrEqual(t, secs, 10, "watch #%d", i+1)
		assert.Less(t, secs, 13, "watch #%d", i+1)
		seen[secs] = true
	}
	assert.Greater(t, len(seen), 1, "21 watches all asked for the same timeout: no spread")
}

// TestListWatcherWatchStream ensures each kind of watch line is handled,
// skipped or counted as it should, that the resourceVersion advances only on
// complete events, and that the next watch resumes from it without a relist.
func TestListWatcherWatchStream(t *testing.T) {
	secret := event(Modified, configMapOfKind("Secret", "s", "101", map[string]string{"token": "c2VjcmV0"}))
	tests := []struct {
		name          string
		anyKind       bool // Config.Kind empty
		watch         reply
		wantHandled   []string
		wantResumeRV  string
		wantMalformed uint64
		wantStart     string // reason counted for the second watch
		wantDelays    int    // waits requested before the second watch
	}{
		{
			name:         "EventsHandledInOrderThenResumeFromLast",
			watch:        stream(event(Added, configMap("b", "101", nil)), modified("a", "102"), event(Deleted, configMap("b", "103", nil))),
			wantHandled:  []string{"ADDED b@101", "MODIFIED a@102", "DELETED b@103"},
			wantResumeRV: "103", wantStart: "eof",
		},
		{
			name:         "BookmarkAdvancesRVOnly",
			watch:        stream(modified("a", "101"), bookmark("150")),
			wantHandled:  []string{"MODIFIED a@101"},
			wantResumeRV: "150", wantStart: "eof",
		},
		{
			name:         "BookmarkAloneCountsAsHealthy",
			watch:        stream(bookmark("150")),
			wantResumeRV: "150", wantStart: "eof",
		},
		{
			name:         "CleanEndWithoutEventsResumesSameRVAfterBackoff",
			watch:        stream(),
			wantResumeRV: "100", wantStart: "eof", wantDelays: 1,
		},
		{
			name:         "GarbageLineSkipped",
			watch:        stream("this is not JSON", modified("a", "102")),
			wantHandled:  []string{"MODIFIED a@102"},
			wantResumeRV: "102", wantMalformed: 1, wantStart: "eof",
		},
		{
			name:         "UnknownEventTypeSkipped",
			watch:        stream(event("UPSERTED", configMap("a", "101", nil)), modified("a", "102")),
			wantHandled:  []string{"MODIFIED a@102"},
			wantResumeRV: "102", wantMalformed: 1, wantStart: "eof",
		},
		{
			name:         "JSONNotAnObjectSkipped",
			watch:        stream(`["MODIFIED",{"metadata":{"resourceVersion":"101"}}]`, `"MODIFIED"`, modified("a", "102")),
			wantHandled:  []string{"MODIFIED a@102"},
			wantResumeRV: "102", wantMalformed: 2, wantStart: "eof",
		},
		{
			name:         "EventWithoutObjectSkipped",
			watch:        stream(`{"type":"MODIFIED"}`, `{"type":"MODIFIED","object":null}`, modified("a", "102")),
			wantHandled:  []string{"MODIFIED a@102"},
			wantResumeRV: "102", wantMalformed: 2, wantStart: "eof",
		},
		{
			name: "EventWithoutRVSkipped",
			watch: stream(strings.Replace(modified("a", "101"), `"resourceVersion":"101",`, "", 1),
				`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"creationTimestamp":null}}}`,
				modified("a", "102")),
			wantHandled:  []string{"MODIFIED a@102"},
			wantResumeRV: "102", wantMalformed: 2, wantStart: "eof",
		},
		{
			name:         "TruncatedLastLineResumesFromRVBeforeIt",
			watch:        streamCut(modified("a", "102")[:60], modified("a", "101")),
			wantHandled:  []string{"MODIFIED a@101"},
			wantResumeRV: "101", wantStart: "error", wantDelays: 1,
		},
		{
			name:         "CompleteEventWithoutNewlineNotHandled",
			watch:        streamCut(modified("a", "102"), modified("a", "101")),
			wantHandled:  []string{"MODIFIED a@101"},
			wantResumeRV: "101", wantStart: "error", wantDelays: 1,
		},
		{
			name:         "OtherKindSkippedRVAdvances",
			watch:        stream(secret),
			wantResumeRV: "101", wantStart: "eof",
		},
		{
			name:         "EmptyKindAcceptsAnyKind",
			anyKind:      true,
			watch:        stream(secret),
			wantHandled:  []string{"MODIFIED s@101"},
			wantResumeRV: "101", wantStart: "eof",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).onList(oneItemList()).onWatch(tt.watch)
			srv := api.start()
			cfg := Config{Kind: "ConfigMap"}
			if tt.anyKind {
				cfg.Kind = ""
			}
			l := newLoop(t, srv.URL, cfg).run(t)
			api.waitWatches(t, 2)
			l.stop(t)

			assert.Equal(t, append(append([]string(nil), listed...), tt.wantHandled...), l.h.seen())
			assert.Equal(t, []string{"100", tt.wantResumeRV}, api.watchRVs())
			assert.Equal(t, tt.wantResumeRV, l.lw.rv)
			require.Len(t, api.listRequests(), 1, "no relist")
			assert.Equal(t, url.Values{"limit": {"500"}}, api.listRequests()[0].Query)
			assert.Zero(t, l.m.Relists.Value())
			assert.Equal(t, tt.wantMalformed, l.m.Malformed.Value(), "malformed lines")
			assert.Equal(t, uint64(1), l.m.WatchStarts.Value(tt.wantStart), "second watch started for %q", tt.wantStart)
			assert.Len(t, l.after.requested(), tt.wantDelays, "waits before the second watch")
		})
	}
}

// TestListWatcherBookmarkCountedNotHandled ensures bookmarks show in the
// events metric by type while never reaching the handler.
func TestListWatcherBookmarkCountedNotHandled(t *testing.T) {
	api := newFakeAPI(t).onList(oneItemList()).onWatch(stream(bookmark("110"), modified("a", "111"), bookmark("120")))
	srv := api.start()
	l := startLoop(t, srv.URL)
	api.waitWatches(t, 2)
	l.stop(t)

	assert.Equal(t, append(append([]string(nil), listed...), "MODIFIED a@111"), l.h.seen())
	assert.Equal(t, uint64(2), l.m.Events.Value(string(Bookmark)))
	assert.Equal(t, uint64(1), l.m.Events.Value(string(Modified)))
	assert.Equal(t, []string{"100", "120"}, api.watchRVs())
}

// TestListWatcherRelistsWhenGone ensures a 410, as the watch's HTTP status or
// as an ERROR event, makes the loop list again from scratch and watch from the
// new list's resourceVersion, counting one relist.
func TestListWatcherRelistsWhenGone(t *testing.T) {
	tests := []struct {
		name        string
		watch       reply
		wantHandled []string
	}{
		{name: "Gone410StatusRelists", watch: status(http.StatusGone, goneStatus)},
		{name: "Gone410ErrorEventRelists", watch: stream(modified("a", "101"), goneEvent), wantHandled: []string{"MODIFIED a@101"}},
		{
			name:  "GoneReasonErrorEventRelists",
			watch: stream(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Gone","code":410}}`),
		},
		{name: "Gone410PlainTextRelists", watch: status(http.StatusGone, "too old resource version\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).
				onList(oneItemList(), list("200", "", item("a", "150"), item("b", "160"))).
				onWatch(tt.watch)
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 2)
			l.stop(t)

			want := append(append([]string(nil), listed...), tt.wantHandled...)
			want = append(want, "BeginList", "SYNCED a@150", "SYNCED b@160", "EndList")
			assert.Equal(t, want, l.h.seen())
			assert.Equal(t, []string{"100", "200"}, api.watchRVs(), "the expired RV is never watched again")
			lists := api.listRequests()
			require.Len(t, lists, 2)
			assert.Equal(t, url.Values{"limit": {"500"}}, lists[1].Query, "relist from scratch")
			assert.Equal(t, uint64(1), l.m.Relists.Value())
			assert.Equal(t, uint64(1), l.m.WatchStarts.Value("gone"))
		})
	}
}

// TestListWatcherRestartsIncompleteList ensures a list that fails on its
// second page (an expired continue token, or any error) starts again from the
// first page, and that EndList closes only the complete list.
func TestListWatcherRestartsIncompleteList(t *testing.T) {
	tests := []struct {
		name  string
		page2 reply
	}{
		{name: "ContinueExpired410RestartsFromFirstPage", page2: status(http.StatusGone, fixture.Read(t, fixture.HandMade.Path(t, "list-continue-410-status.json")))},
		{name: "SecondPage500RestartsFromFirstPage", page2: status(http.StatusInternalServerError, internalStatus)},
		{name: "SecondPageHangUpRestartsFromFirstPage", page2: hangUp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).onList(
				list("100", "tok-1", item("a", "90")),
				tt.page2,
				list("110", "tok-2", item("a", "90")),
				list("110", "", item("b", "105")),
			)
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 1)
			l.stop(t)

			assert.Equal(t, []string{"BeginList", "SYNCED a@90", "BeginList", "SYNCED a@90", "SYNCED b@105", "EndList"}, l.h.seen())
			var queries []url.Values
			for _, r := range api.listRequests() {
				queries = append(queries, r.Query)
			}
			assert.Equal(t, []url.Values{
				{"limit": {"500"}},
				{"limit": {"500"}, "continue": {"tok-1"}},
				{"limit": {"500"}},
				{"limit": {"500"}, "continue": {"tok-2"}},
			}, queries)
			assert.Equal(t, []string{"110"}, api.watchRVs())
			assert.Len(t, l.after.requested(), 1, "one wait before listing again")
		})
	}
}

// TestListWatcherListFailuresRetry ensures a failed or unusable first list is
// retried with backoff, honouring Retry-After, and never ended.
func TestListWatcherListFailuresRetry(t *testing.T) {
	tests := []struct {
		name         string
		fail         reply
		wantMinDelay time.Duration
	}{
		{name: "Status500Retried", fail: status(http.StatusInternalServerError, internalStatus), wantMinDelay: time.Millisecond},
		{name: "NotJSONRetried", fail: ok("<html>proxy error</html>"), wantMinDelay: time.Millisecond},
		{name: "NoResourceVersionRetried", fail: ok(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}`), wantMinDelay: time.Millisecond},
		{name: "ForbiddenRetried", fail: status(http.StatusForbidden, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden","reason":"Forbidden","code":403}`), wantMinDelay: time.Millisecond},
		{name: "Status429RetryAfterHonoured", fail: status(http.StatusTooManyRequests, "Too many requests, please try again later.\n", "Retry-After", "2"), wantMinDelay: 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).onList(tt.fail, oneItemList())
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 1)
			l.stop(t)

			assert.Equal(t, []string{"BeginList", "BeginList", "SYNCED a@90", "EndList"}, l.h.seen())
			delays := l.after.requested()
			require.Len(t, delays, 1)
			assert.GreaterOrEqual(t, delays[0], tt.wantMinDelay)
			assert.Equal(t, []string{"100"}, api.watchRVs())
		})
	}
}

// TestListWatcherRetriesWatchFromSameRV ensures failures of a watch that are
// not 410 are retried from the same resourceVersion without a relist, after a
// delay from the backoff or, when longer, the server's Retry-After hint
// (bounded to 5 minutes).
func TestListWatcherRetriesWatchFromSameRV(t *testing.T) {
	tooMany := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":3},"code":429}`
	tests := []struct {
		name         string
		watch        reply
		wantMinDelay time.Duration
		wantMaxDelay time.Duration // 0: no bound
	}{
		{name: "TooLargeRVErrorEventHonoursRetryAfterSeconds", watch: stream(tooLarge), wantMinDelay: time.Second},
		{name: "TooLargeRVRecordedShapeHonoursRetryAfterSeconds", watch: stream(readLines(t, "testdata/watch-504.ndjson")...), wantMinDelay: time.Second},
		{name: "Status500BacksOff", watch: status(http.StatusInternalServerError, internalStatus), wantMinDelay: time.Millisecond},
		{name: "Status429RetryAfterHeaderHonoured", watch: status(http.StatusTooManyRequests, tooMany, "Retry-After", "3"), wantMinDelay: 3 * time.Second},
		{name: "Status503PlainTextRetryAfterHonoured", watch: status(http.StatusServiceUnavailable, "Error trying to reach service: 'dial tcp 10.0.0.1:6443: connect: connection refused'\n", "Retry-After", "2"), wantMinDelay: 2 * time.Second},
		{name: "RetryAfterBoundedToFiveMinutes", watch: status(http.StatusTooManyRequests, "Too many requests, please try again later.\n", "Retry-After", "86400"), wantMinDelay: 5 * time.Minute, wantMaxDelay: 5 * time.Minute},
		{name: "HangUpBacksOff", watch: hangUp, wantMinDelay: time.Millisecond},
		{name: "ErrorEventWithoutStatusBacksOff", watch: stream(`{"type":"ERROR","object":{"message":"something odd"}}`), wantMinDelay: time.Millisecond},
		{name: "NotFound404BacksOff", watch: status(http.StatusNotFound, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \"default\" not found","reason":"NotFound","details":{"name":"default","kind":"namespaces"},"code":404}`), wantMinDelay: time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).onList(oneItemList()).onWatch(tt.watch)
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 2)
			l.stop(t)

			assert.Equal(t, listed, l.h.seen())
			assert.Equal(t, []string{"100", "100"}, api.watchRVs())
			assert.Len(t, api.listRequests(), 1, "no relist")
			assert.Zero(t, l.m.Relists.Value())
			assert.Equal(t, uint64(1), l.m.WatchStarts.Value("error"))
			delays := l.after.requested()
			require.Len(t, delays, 1)
			assert.GreaterOrEqual(t, delays[0], tt.wantMinDelay)
			if tt.wantMaxDelay > 0 {
				assert.LessOrEqual(t, delays[0], tt.wantMaxDelay)
			}
		})
	}
}

// TestListWatcherConnectionRefused ensures that while nothing listens at the
// API server's address the loop retries with a growing backoff, and carries on
// where it was once the server is back: the list if it had none, the watch
// from the same resourceVersion if it had one.
func TestListWatcherConnectionRefused(t *testing.T) {
	t.Run("DuringListRetriedUntilServerIsBack", func(t *testing.T) {
		api := newFakeAPI(t).onList(oneItemList())
		rs := newRestartableServer(t, api)
		l := newLoop(t, rs.URL(), Config{Kind: "ConfigMap"})
		l.after.hook = func(n int) {
			if n == 3 {
				rs.up()
			}
		}
		l.run(t)
		api.waitWatches(t, 1)
		// The server sees the watch before its answer reaches the loop,
		// which logs the recovery then.
		waitLog(t, l, `msg="watching again" path=/api/v1/namespaces/default/configmaps failures=3`)
		l.stop(t)

		assert.Equal(t, []time.Duration{1 * time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}, l.after.requested(),
			"a growing backoff between refused connections")
		assert.Equal(t, []string{"BeginList", "BeginList", "BeginList", "BeginList", "SYNCED a@90", "EndList"}, l.h.seen())
		assert.Equal(t, []string{"100"}, api.watchRVs())
		assert.Equal(t, 1, strings.Count(l.logs.String(), "connection refused"), "three refusals logged once:\n%s", l.logs)
		assert.Contains(t, l.logs.String(), `fix="nothing answers at API_URL: start the ambassador (kubectl proxy) there`)
		assert.Contains(t, l.logs.String(), `msg="watching again" path=/api/v1/namespaces/default/configmaps failures=3`)
	})
	t.Run("DuringWatchRetriedFromSameRV", func(t *testing.T) {
		api := newFakeAPI(t).onList(oneItemList()).onWatch(status(http.StatusInternalServerError, internalStatus))
		rs := newRestartableServer(t, api)
		rs.up()
		l := newLoop(t, rs.URL(), Config{Kind: "ConfigMap"})
		l.after.hook = func(n int) {
			switch n {
			case 1:
				rs.down()
			case 2:
				rs.up()
			}
		}
		l.run(t)
		api.waitWatches(t, 2)
		l.stop(t)

		assert.Equal(t, []time.Duration{1 * time.Millisecond, 2 * time.Millisecond}, l.after.requested())
		assert.Equal(t, listed, l.h.seen())
		assert.Equal(t, []string{"100", "100"}, api.watchRVs(), "the refused watch is not seen by the server")
		assert.Len(t, api.listRequests(), 1, "no relist")
		assert.Contains(t, l.logs.String(), "connection refused")
	})
}

// waitLog waits until the loop's log holds line.
func waitLog(t *testing.T, l *loop, line string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(l.logs.String(), line) }, waitLimit, time.Millisecond, "log line %s", line)
}

// TestListWatcherForbiddenSaysTheFixOnce ensures a list the API server
// refuses (403) is logged once however often it is retried, as an error
// naming the rule that grants it, that Unready gives the same fix while it
// lasts, and that the loop says when it watches again.
func TestListWatcherForbiddenSaysTheFixOnce(t *testing.T) {
	forbidden := status(http.StatusForbidden, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"configmaps is forbidden: User \"system:serviceaccount:default:config-watcher\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\"","reason":"Forbidden","code":403}`)
	api := newFakeAPI(t).onList(forbidden, forbidden, forbidden, oneItemList())
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap"})
	var unready []string
	l.after.hook = func(int) { unready = append(unready, l.lw.Unready()) }
	l.run(t)
	api.waitWatches(t, 1)
	require.Eventually(t, func() bool { return l.lw.Unready() == "" }, waitLimit, time.Millisecond)
	waitLog(t, l, `msg="watching again" path=/api/v1/namespaces/default/configmaps failures=3`)
	l.stop(t)

	const fix = `RBAC: the controller may not list configmaps in namespace default; grant it with the rule {apiGroups: [""], resources: ["configmaps"], verbs: ["list"]} in a Role in namespace default bound to the controller's ServiceAccount`
	logs := l.logs.String()
	assert.Equal(t, 1, strings.Count(logs, "list failed"), "three refusals logged once:\n%s", logs)
	assert.Contains(t, logs, `level=ERROR msg="list failed; retrying" path=/api/v1/namespaces/default/configmaps fix="`+strings.ReplaceAll(fix, `"`, `\"`)+`"`)
	assert.Contains(t, logs, `msg="watching again" path=/api/v1/namespaces/default/configmaps failures=3`)
	require.Len(t, unready, 3)
	for _, u := range unready {
		assert.True(t, strings.HasPrefix(u, "list /api/v1/namespaces/default/configmaps: 403 Forbidden: configmaps is forbidden"), u)
		assert.True(t, strings.HasSuffix(u, "; fix: "+fix), u)
	}
}

// TestListWatcherHugeEvent ensures a MODIFIED event carrying a 3 MiB data
// value (over 3 MiB on the wire once escaped) reaches the handler intact.
func TestListWatcherHugeEvent(t *testing.T) {
	var b strings.Builder
	for b.Len() < 3<<20 {
		b.WriteString("key = \"value\"\t# a back\\slash, über 東京\n")
	}
	obj := configMap("big", "101", map[string]string{"application.properties": b.String()[:3<<20]})
	line := event(Modified, obj)
	require.Greater(t, len(line), 3<<20+100<<10, "escaping makes the line longer than the value")

	api := newFakeAPI(t).onList(oneItemList()).onWatch(stream(line, modified("a", "102")))
	srv := api.start()
	l := startLoop(t, srv.URL)
	api.waitWatches(t, 2)
	l.stop(t)

	calls := l.h.all()
	require.Len(t, calls, 5)
	assert.Equal(t, "MODIFIED big@101", calls[3].String())
	assert.Equal(t, len(obj), calls[3].Len)
	assert.Equal(t, sha256.Sum256([]byte(obj)), calls[3].Sum, "object bytes changed on the way")
	assert.Equal(t, "MODIFIED a@102", calls[4].String(), "the event after the huge one")
	assert.Zero(t, l.m.Malformed.Value())
}

// TestListWatcherBackOffOnQuickEmptyWatches ensures a watch that ends at once
// without events counts as a failure, so repeated ones wait ever longer (no
// hot loop), while a watch with events, or one that lasted over a second,
// resets the backoff.
func TestListWatcherBackOffOnQuickEmptyWatches(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name       string
		watches    func(c *fakeClock) []reply
		wantDelays []time.Duration
	}{
		{
			name:       "InstantEmptyWatchesBackOffGrowing",
			watches:    func(*fakeClock) []reply { return []reply{stream(), stream(), stream(), stream()} },
			wantDelays: []time.Duration{1 * ms, 2 * ms, 3 * ms, 4 * ms},
		},
		{
			name: "WatchWithEventsResetsBackOff",
			watches: func(*fakeClock) []reply {
				return []reply{stream(), stream(), stream(modified("a", "101")), stream()}
			},
			wantDelays: []time.Duration{1 * ms, 2 * ms, 1 * ms},
		},
		{
			// Over a second is no failure (no wait), but too short to
			// reset: a server dropping every stream keeps backing off.
			name: "QuietWatchOverASecondNeitherWaitsNorResets",
			watches: func(c *fakeClock) []reply {
				long := func(w http.ResponseWriter, r *http.Request) {
					c.Advance(2 * time.Second)
					serveLines(w)
				}
				return []reply{stream(), stream(), long, stream()}
			},
			wantDelays: []time.Duration{1 * ms, 2 * ms, 3 * ms},
		},
		{
			name: "QuietWatchOverTwoMinutesResetsBackOff",
			watches: func(c *fakeClock) []reply {
				long := func(w http.ResponseWriter, r *http.Request) {
					c.Advance(3 * time.Minute)
					serveLines(w)
				}
				return []reply{stream(), stream(), long, stream()}
			},
			wantDelays: []time.Duration{1 * ms, 2 * ms, 1 * ms},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			api := newFakeAPI(t).onList(oneItemList()).onWatch(tt.watches(clock)...)
			srv := api.start()
			l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", Now: clock.Now}).run(t)
			api.waitWatches(t, 5)
			l.stop(t)

			assert.Equal(t, tt.wantDelays, l.after.requested())
			assert.Len(t, api.listRequests(), 1, "no relist")
		})
	}
}

// TestListWatcherBackOffStopStillWaits ensures a backoff policy that gives up
// (returns backoff.Stop) does not make the loop retry at once, nor stop it:
// it waits the default policy's longest delay.
func TestListWatcherBackOffStopStillWaits(t *testing.T) {
	api := newFakeAPI(t).onList(oneItemList()).onWatch(status(http.StatusInternalServerError, internalStatus))
	srv := api.start()
	l := newLoop(t, srv.URL, Config{
		Kind:       "ConfigMap",
		NewBackOff: func() backoff.BackOff { return &backoff.StopBackOff{} },
	}).run(t)
	api.waitWatches(t, 2)
	l.stop(t)

	assert.Equal(t, []time.Duration{30 * time.Second}, l.after.requested(), "a policy that gives up waits the 30 s cap (apiclient.RetryDelay)")
}

// TestListWatcherReadyAndAlive ensures Alive follows Run, and Ready is false
// until the first list is complete and true while a watch is open.
func TestListWatcherReadyAndAlive(t *testing.T) {
	gate := make(chan struct{})
	api := newFakeAPI(t).onList(gated(gate, oneItemList()))
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap"})
	assert.False(t, l.lw.Alive(), "before Run")
	assert.False(t, l.lw.Ready(), "before Run")

	l.run(t)
	api.waitLists(t, 1)
	assert.True(t, l.lw.Alive(), "while listing")
	assert.False(t, l.lw.Ready(), "while the first list is in progress")

	close(gate)
	api.waitWatches(t, 1)
	require.Eventually(t, l.lw.Ready, waitLimit, time.Millisecond, "ready once watching")
	assert.True(t, l.lw.Alive())

	l.stop(t)
	assert.False(t, l.lw.Alive(), "after Run returned")
}

// TestListWatcherReadyGrace ensures the loop stays ready for ReadyGrace after
// its last healthy moment while watches fail, then reports not ready until a
// watch is open again.
func TestListWatcherReadyGrace(t *testing.T) {
	fail := status(http.StatusInternalServerError, internalStatus)
	second, third := make(chan struct{}), make(chan struct{})
	api := newFakeAPI(t).onList(oneItemList())
	api.onWatch(fail, gated(second, fail), gated(third, api.holdWatch))
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap", ReadyGrace: time.Minute})
	l.after.hook = func(int) { l.clock.Advance(30 * time.Second) } // each failed watch takes 30 s
	l.run(t)

	api.waitWatches(t, 2) // one failure: 30 s since the list
	assert.True(t, l.lw.Ready(), "30 s into a 1 min grace")

	close(second)
	api.waitWatches(t, 3) // two failures: 60 s since the list
	assert.False(t, l.lw.Ready(), "grace used up while watches fail")

	close(third)
	require.Eventually(t, l.lw.Ready, waitLimit, time.Millisecond, "ready again once a watch is open")
}

// TestListWatcherTimeoutEndCounted ensures a watch the server ends at its
// timeoutSeconds is counted as a timeout, and one it ends sooner as eof.
func TestListWatcherTimeoutEndCounted(t *testing.T) {
	for _, tt := range []struct {
		name    string
		lasted  time.Duration
		wantEnd string
	}{
		{"AtTimeoutSeconds", 5 * time.Minute, "timeout"},
		{"Sooner", 2 * time.Minute, "eof"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var l *loop
			long := func(w http.ResponseWriter, r *http.Request) {
				l.clock.Advance(tt.lasted)
				serveLines(w)
			}
			api := newFakeAPI(t).onList(oneItemList()).onWatch(long)
			srv := api.start()
			l = newLoop(t, srv.URL, Config{Kind: "ConfigMap", MinWatchTimeout: 5 * time.Minute, MaxWatchTimeout: 5 * time.Minute})
			l.run(t)
			api.waitWatches(t, 2)
			l.stop(t)
			assert.Equal(t, uint64(1), l.m.WatchStarts.Value(tt.wantEnd))
		})
	}
}

// TestListWatcherRelistListsAgainAtOnce ensures Relist ends the open watch
// and lists again without a backoff, so the handler sees every object
// afresh, and the watch that follows is counted with the reason relist.
func TestListWatcherRelistListsAgainAtOnce(t *testing.T) {
	api := newFakeAPI(t).onList(oneItemList(), list("200", "", item("a", "150"), item("b", "160")))
	srv := api.start()
	l := startLoop(t, srv.URL)
	api.waitWatches(t, 1)
	l.lw.Relist()
	api.waitWatches(t, 2)
	l.stop(t)
	assert.Len(t, api.listRequests(), 2)
	assert.Equal(t, "200", api.watchRequests()[1].Query.Get("resourceVersion"), "the watch goes on from the new list")
	assert.Equal(t, uint64(1), l.m.WatchStarts.Value("relist"))
	assert.Empty(t, l.after.requested(), "no backoff")
	assert.Equal(t, []string{"BeginList", "SYNCED a@90", "EndList", "BeginList", "SYNCED a@150", "SYNCED b@160", "EndList"}, l.h.seen(),
		"the second list reached the handler whole")
}

// TestListWatcherRelistBeforeTheWatchIsNotLost ensures a Relist asked for
// while the loop lists (no watch open to end) still makes it list again.
func TestListWatcherRelistBeforeTheWatchIsNotLost(t *testing.T) {
	gate := make(chan struct{})
	api := newFakeAPI(t).onList(gated(gate, oneItemList()), oneItemList())
	srv := api.start()
	l := startLoop(t, srv.URL)
	api.waitLists(t, 1)
	l.lw.Relist()
	close(gate)
	api.waitLists(t, 2)
	api.waitWatches(t, 1)
	l.stop(t)
	assert.Len(t, api.watchRequests(), 1, "no watch of the first list's revision is kept open")
}

// TestListWatcherStartAfterHoldsTheFirstList ensures a loop with StartAfter
// runs (alive) but asks nothing until it is closed.
func TestListWatcherStartAfterHoldsTheFirstList(t *testing.T) {
	api := newFakeAPI(t).onList(oneItemList())
	srv := api.start()
	gate := make(chan struct{})
	l := newLoop(t, srv.URL, Config{StartAfter: gate}).run(t)
	require.Eventually(t, l.lw.Alive, waitLimit, time.Millisecond)
	assert.Empty(t, api.listRequests(), "nothing asked before the gate opens")
	assert.Equal(t, "initial list not done", l.lw.Unready())
	close(gate)
	api.waitWatches(t, 1)
	l.stop(t)
}

// streamingHandler records, besides every call, each time it is told a
// stream opened or ended.
type streamingHandler struct{ *recordingHandler }

var _ Streamer = streamingHandler{}

func (h streamingHandler) Streaming(open bool) {
	h.add(handlerCall{Op: map[bool]string{true: "open", false: "closed"}[open]})
}

// TestListWatcherTellsAStreamerWhileAStreamIsOpen ensures a Streamer
// handler is told when each watch stream opens and ends, so that a cache
// fed by it knows when it may be behind: between the two a 410 relists,
// and nothing says it is open before the next stream is.
func TestListWatcherTellsAStreamerWhileAStreamIsOpen(t *testing.T) {
	api := newFakeAPI(t).
		onList(oneItemList(), list("200", "", item("a", "150"))).
		onWatch(stream(modified("a", "101"), goneEvent), status(http.StatusInternalServerError, "down\n"))
	srv := api.start()
	l := newLoop(t, srv.URL, Config{Kind: "ConfigMap"})
	l.lw = New(l.lw.cfg, l.lw.client, streamingHandler{l.h}, l.lw.log, l.m)
	l.run(t)
	api.waitWatches(t, 3)
	want := append(append([]string(nil), listed...), "open", "MODIFIED a@101", "closed",
		"BeginList", "SYNCED a@150", "EndList", "open")
	require.Eventually(t, func() bool { return len(l.h.seen()) >= len(want) }, waitLimit, time.Millisecond)
	assert.Equal(t, want, l.h.seen()[:len(want)], "no stream opened for the failed watch")
}
