package watch

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/fixture"
)

// Replay tests serve files byte for byte: the real recordings of
// ../testdata/recorded/ (hack/record.sh) when they have been made, and the
// hand-made ones of testdata/ in the same shapes always. Expectations are read
// from the files themselves with encoding/json, independently of the decoder.

// wireEvent is one watch line as encoding/json reads it.
type wireEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

type wireMeta struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
}

func wireDecode(t *testing.T, line string) (wireEvent, wireMeta) {
	t.Helper()
	var ev wireEvent
	require.NoError(t, json.Unmarshal([]byte(line), &ev), "line %.80s", line)
	var m wireMeta
	require.NoError(t, json.Unmarshal(ev.Object, &m))
	return ev, m
}

// expectedList is what the handler must see of a LIST body, and its RV.
func expectedList(t *testing.T, body string) ([]string, wireMeta) {
	t.Helper()
	var l struct {
		wireMeta
		Items []wireMeta `json:"items"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &l))
	var seen []string
	for _, it := range l.Items {
		seen = append(seen, "SYNCED "+it.Metadata.Name+"@"+it.Metadata.ResourceVersion)
	}
	return seen, l.wireMeta
}

// TestReplayWatchEvents ensures a real watch stream (create, change data,
// change labels, delete, bookmark) reaches the handler event by event in
// order, bookmark excepted, after the list, and that the next watch resumes
// from the last line's resourceVersion without a relist.
func TestReplayWatchEvents(t *testing.T) {
	for _, src := range fixture.Dirs {
		t.Run(src.Name, func(t *testing.T) {
			listBody := fixture.Read(t, src.Path(t, "list.json"))
			lines := readLines(t, src.Path(t, "watch-events.ndjson"))
			want, ListMeta := expectedList(t, listBody)
			want = append([]string{"BeginList"}, append(want, "EndList")...)
			var lastRV string
			for _, line := range lines {
				ev, m := wireDecode(t, line)
				if ev.Type != string(Bookmark) {
					want = append(want, ev.Type+" "+m.Metadata.Name+"@"+m.Metadata.ResourceVersion)
				}
				lastRV = m.Metadata.ResourceVersion
			}
			require.NotEmpty(t, lastRV)

			api := newFakeAPI(t).onList(ok(listBody)).onWatch(stream(lines...))
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 2)
			l.stop(t)

			assert.Equal(t, want, l.h.seen())
			assert.Equal(t, []string{ListMeta.Metadata.ResourceVersion, lastRV}, api.watchRVs())
			assert.Len(t, api.listRequests(), 1, "no relist")
			assert.Zero(t, l.m.Malformed.Value())
		})
	}
}

// TestReplayPagedList ensures a real two-page LIST is followed through its
// continue token and handed over whole, then watched from its resourceVersion.
func TestReplayPagedList(t *testing.T) {
	for _, src := range fixture.Dirs {
		t.Run(src.Name, func(t *testing.T) {
			page1 := fixture.Read(t, src.Path(t, "list-page-1.json"))
			page2 := fixture.Read(t, src.Path(t, "list-page-2.json"))
			seen1, meta1 := expectedList(t, page1)
			seen2, meta2 := expectedList(t, page2)
			require.NotEmpty(t, meta1.Metadata.Continue, "page 1 has a continue token")

			api := newFakeAPI(t).onList(ok(page1), ok(page2))
			srv := api.start()
			l := startLoop(t, srv.URL)
			api.waitWatches(t, 1)
			l.stop(t)

			want := append(append(append([]string{"BeginList"}, seen1...), seen2...), "EndList")
			assert.Equal(t, want, l.h.seen())
			lists := api.listRequests()
			require.Len(t, lists, 2)
			assert.Equal(t, meta1.Metadata.Continue, lists[1].Query.Get("continue"), "the token reaches the server intact")
			assert.Equal(t, []string{meta2.Metadata.ResourceVersion}, api.watchRVs())
		})
	}
}

// TestReplayGone ensures every recorded form of an expired resourceVersion
// (the watch refused with 410, an ERROR event carrying 410, an expired continue
// token) leads to a complete fresh list and never to a retry of the old RV.
func TestReplayGone(t *testing.T) {
	for _, src := range fixture.Dirs {
		t.Run(src.Name, func(t *testing.T) {
			t.Run("WatchRefused410Relists", func(t *testing.T) {
				body := fixture.Read(t, src.Path(t, "gone-410-status.json"))
				replayWatchGone(t, status(http.StatusGone, body))
			})
			t.Run("ErrorEvent410Relists", func(t *testing.T) {
				lines := readLines(t, src.Path(t, "watch-410.ndjson"))
				replayWatchGone(t, stream(lines...))
			})
			t.Run("ContinueExpired410RestartsList", func(t *testing.T) {
				body := fixture.Read(t, src.Path(t, "list-continue-410-status.json"))
				api := newFakeAPI(t).onList(
					list("100", "tok-1", item("a", "90")),
					status(http.StatusGone, body),
					list("110", "tok-2", item("a", "90")),
					list("110", "", item("b", "105")),
				)
				srv := api.start()
				l := startLoop(t, srv.URL)
				api.waitWatches(t, 1)
				l.stop(t)

				assert.Equal(t, []string{"BeginList", "SYNCED a@90", "BeginList", "SYNCED a@90", "SYNCED b@105", "EndList"}, l.h.seen())
				assert.Equal(t, []string{"110"}, api.watchRVs())
			})
		})
	}
}

func replayWatchGone(t *testing.T, gone reply) {
	t.Helper()
	api := newFakeAPI(t).onList(oneItemList(), list("200", "", item("a", "150"))).onWatch(gone)
	srv := api.start()
	l := startLoop(t, srv.URL)
	api.waitWatches(t, 2)
	l.stop(t)

	assert.Equal(t, append(append([]string(nil), listed...), "BeginList", "SYNCED a@150", "EndList"), l.h.seen())
	assert.Equal(t, []string{"100", "200"}, api.watchRVs())
	assert.Equal(t, uint64(1), l.m.Relists.Value())
}

// TestReplayModifiedLarge ensures MODIFIED events of about 1 KiB, 100 KiB and
// 1 MiB of data reach the handler with their object byte for byte.
func TestReplayModifiedLarge(t *testing.T) {
	files := []struct {
		file string
		size int
	}{
		{"modified-1kib.ndjson", 1 << 10},
		{"modified-100kib.ndjson", 100 << 10},
		{"modified-1mib.ndjson", 1<<20 - 1<<10},
	}
	for _, src := range fixture.Dirs {
		for _, f := range files {
			t.Run(src.Name+"/"+f.file, func(t *testing.T) {
				var lines []string
				if src.Recorded {
					lines = readLines(t, src.Path(t, f.file))
				} else {
					lines = []string{generatedModified(f.size)}
				}
				var want []handlerCall
				for _, line := range lines {
					ev, m := wireDecode(t, line)
					if ev.Type == string(Bookmark) {
						continue
					}
					want = append(want, handlerCall{Op: "Handle", Type: EventType(ev.Type), Name: m.Metadata.Name,
						RV: m.Metadata.ResourceVersion, Len: len(ev.Object), Sum: sha256.Sum256(ev.Object)})
				}
				require.NotEmpty(t, want)

				api := newFakeAPI(t).onList(oneItemList()).onWatch(stream(lines...))
				srv := api.start()
				l := startLoop(t, srv.URL)
				api.waitWatches(t, 2)
				l.stop(t)

				calls := l.h.all()
				require.Len(t, calls, len(listed)+len(want))
				assert.Equal(t, want, calls[len(listed):])
			})
		}
	}
}
