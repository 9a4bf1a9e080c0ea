package watch

// The watch half of the bad-input matrix (issue 7): what the loop does with
// every kind of ERROR event and with resourceVersions that repeat or go
// backwards. The decoder's own matrix (garbage, unknown types, missing
// fields, truncated lines, other kinds) is TestListWatcherWatchStream.

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errorEvent is an ERROR watch line carrying a Status with code and reason;
// retryAfter > 0 adds details.retryAfterSeconds.
func errorEvent(code int, reason string, retryAfter int) string {
	details := ""
	if retryAfter > 0 {
		details = fmt.Sprintf(`"details":{"retryAfterSeconds":%d},`, retryAfter)
	}
	return fmt.Sprintf(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",`+
		`"message":"injected %d","reason":%q,%s"code":%d}}`, code, reason, details, code)
}

// TestBadInputErrorEventEveryCode ensures an ERROR event of any code ends the
// watch without reaching the handler: 410 (Expired or Gone) relists and never
// watches the expired resourceVersion again; every other code, and ERROR
// objects that are not a Status, watch again from the same resourceVersion
// after a backoff that honours retryAfterSeconds. None of them stops the loop.
func TestBadInputErrorEventEveryCode(t *testing.T) {
	tests := []struct {
		name         string
		line         string
		wantRelist   bool
		wantMinDelay time.Duration
	}{
		{name: "400BadRequest", line: errorEvent(400, "BadRequest", 0)},
		{name: "401Unauthorized", line: errorEvent(401, "Unauthorized", 0)},
		{name: "403Forbidden", line: errorEvent(403, "Forbidden", 0)},
		{name: "404NotFound", line: errorEvent(404, "NotFound", 0)},
		{name: "405MethodNotAllowed", line: errorEvent(405, "MethodNotAllowed", 0)},
		{name: "409Conflict", line: errorEvent(409, "Conflict", 0)},
		{name: "410Expired", line: errorEvent(410, "Expired", 0), wantRelist: true},
		{name: "410Gone", line: errorEvent(410, "Gone", 0), wantRelist: true},
		{name: "410WithRetryAfterStillRelists", line: errorEvent(410, "Expired", 7), wantRelist: true},
		{name: "422Invalid", line: errorEvent(422, "Invalid", 0)},
		{name: "429TooManyRequestsRetryAfter", line: errorEvent(429, "TooManyRequests", 4), wantMinDelay: 4 * time.Second},
		{name: "500InternalError", line: errorEvent(500, "InternalError", 0)},
		{name: "503ServiceUnavailableRetryAfter", line: errorEvent(503, "ServiceUnavailable", 2), wantMinDelay: 2 * time.Second},
		{name: "504TimeoutRetryAfter", line: errorEvent(504, "Timeout", 1), wantMinDelay: time.Second},
		{name: "UnknownCode599", line: errorEvent(599, "Whatever", 0)},
		{name: "CodeZero", line: errorEvent(0, "", 0)},
		{name: "ObjectNotAStatus", line: `{"type":"ERROR","object":{"kind":"ConfigMap","metadata":{"name":"x","resourceVersion":"150"}}}`},
		{name: "EmptyObject", line: `{"type":"ERROR","object":{}}`},
		// A code sent as a JSON string is read leniently: "410" still relists,
		// which is the safe reading (a relist loses nothing).
		{name: "CodeAsStringRelists", line: `{"type":"ERROR","object":{"kind":"Status","code":"410","reason":"Expired"}}`, wantRelist: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).
				onList(oneItemList(), list("200", "", item("a", "150"))).
				onWatch(stream(modified("a", "101"), tt.line, modified("a", "999")))
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 2)
			l.stop(t)

			want := append(append([]string(nil), listed...), "MODIFIED a@101")
			if tt.wantRelist {
				want = append(want, "BeginList", "SYNCED a@150", "EndList")
				assert.Equal(t, []string{"100", "200"}, api.watchRVs(), "the expired resourceVersion is never watched again")
				assert.Equal(t, uint64(1), l.m.Relists.Value())
				assert.Equal(t, uint64(1), l.m.WatchStarts.Value("gone"))
				require.Len(t, api.listRequests(), 2)
				assert.Equal(t, url.Values{"limit": {"500"}}, api.listRequests()[1].Query, "relist from scratch")
			} else {
				assert.Equal(t, []string{"100", "101"}, api.watchRVs(), "watch again from the last event before the ERROR")
				assert.Zero(t, l.m.Relists.Value())
				assert.Equal(t, uint64(1), l.m.WatchStarts.Value("error"))
				delays := l.after.requested()
				require.Len(t, delays, 1, "one backoff before watching again")
				assert.GreaterOrEqual(t, delays[0], max(tt.wantMinDelay, time.Millisecond))
			}
			assert.Equal(t, want, l.h.seen(), "the ERROR ends the stream: the event after it is not handled")
			assert.Equal(t, uint64(1), l.m.Events.Value("ERROR"))
		})
	}
}

// TestBadInputDuplicateAndOutOfOrderRVs ensures the loop passes events with
// repeated or decreasing resourceVersions to the handler in stream order
// (deciding what is stale is the handler's job, by content) and resumes from
// the resourceVersion of the last line it read, as client-go does:
// resourceVersions are opaque to clients.
func TestBadInputDuplicateAndOutOfOrderRVs(t *testing.T) {
	tests := []struct {
		name        string
		lines       []string
		wantHandled []string
		wantResume  string
	}{
		{
			name:        "DuplicateRV",
			lines:       []string{modified("a", "101"), modified("a", "101")},
			wantHandled: []string{"MODIFIED a@101", "MODIFIED a@101"},
			wantResume:  "101",
		},
		{
			name:        "RVGoesBackwards",
			lines:       []string{modified("a", "105"), modified("a", "103")},
			wantHandled: []string{"MODIFIED a@105", "MODIFIED a@103"},
			wantResume:  "103",
		},
		{
			name:        "RVOlderThanTheList",
			lines:       []string{modified("a", "50")},
			wantHandled: []string{"MODIFIED a@50"},
			wantResume:  "50",
		},
		{
			name:        "BookmarkBackwards",
			lines:       []string{modified("a", "105"), bookmark("102")},
			wantHandled: []string{"MODIFIED a@105"},
			wantResume:  "102",
		},
		{
			name:        "NonNumericRV",
			lines:       []string{modified("a", "x-17"), modified("a", "102")},
			wantHandled: []string{"MODIFIED a@x-17", "MODIFIED a@102"},
			wantResume:  "102",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t).onList(oneItemList()).onWatch(stream(tt.lines...))
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 2)
			l.stop(t)
			assert.Equal(t, append(append([]string(nil), listed...), tt.wantHandled...), l.h.seen())
			assert.Equal(t, []string{"100", tt.wantResume}, api.watchRVs())
			assert.Zero(t, l.m.Malformed.Value())
		})
	}
}
