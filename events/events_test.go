package events

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/metrics"
)

type eventServer struct {
	mu     sync.Mutex
	posted []map[string]any
	paths  []string
	hold   chan struct{} // if not nil, every request waits for it
}

func (s *eventServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.hold != nil {
		<-s.hold
	}
	var ev map[string]any
	_ = json.NewDecoder(r.Body).Decode(&ev)
	s.mu.Lock()
	s.posted = append(s.posted, ev)
	s.paths = append(s.paths, r.Method+" "+r.URL.Path)
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"kind":"Event"}`)
}

func (s *eventServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.posted)
}

var cm = Object{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "webapp-config", UID: "u1"}

func newRecorder(t *testing.T, s *eventServer, cfg Config) *Recorder {
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	api, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	r := New(cfg, api, slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// TestEventShape ensures an event is posted to the object's namespace as a
// core/v1 Event naming the object, its uid, the type, reason and message.
func TestEventShape(t *testing.T) {
	s := &eventServer{}
	r := newRecorder(t, s, Config{Instance: "cw-0"})
	r.Event(cm, Normal, "PodsRestarted", "Restarted 2 pod(s)")
	require.Eventually(t, func() bool { return s.count() == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, "POST /api/v1/namespaces/ns/events", s.paths[0])
	ev := s.posted[0]
	assert.Equal(t, "Event", ev["kind"])
	assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "namespace": "ns", "name": "webapp-config", "uid": "u1"}, ev["involvedObject"])
	assert.Equal(t, "Normal", ev["type"])
	assert.Equal(t, "PodsRestarted", ev["reason"])
	assert.Equal(t, "Restarted 2 pod(s)", ev["message"])
	assert.Equal(t, "config-watcher", ev["reportingComponent"])
	assert.Equal(t, "cw-0", ev["reportingInstance"])
	assert.Equal(t, "webapp-config.", ev["metadata"].(map[string]any)["generateName"])
}

// TestRateLimits ensures identical events within the dedupe window are sent
// once, and a burst beyond the bucket is dropped and counted.
func TestRateLimits(t *testing.T) {
	s := &eventServer{}
	var now atomic.Int64
	now.Store(1000)
	r := newRecorder(t, s, Config{Burst: 3, Every: time.Hour, Now: func() time.Time { return time.Unix(now.Load(), 0) }})
	for range 5 {
		r.Event(cm, Warning, "InvalidSelector", "same message")
	}
	for i := range 5 {
		r.Event(cm, Warning, "RestartFailed", "attempt "+string(rune('a'+i)))
	}
	require.Eventually(t, func() bool { return s.count() == 3 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, uint64(7), r.sent.Value("dropped"))

	now.Add(600) // the dedupe window passed, but the bucket refills only hourly
	r.Event(cm, Warning, "InvalidSelector", "same message")
	assert.Equal(t, uint64(8), r.sent.Value("dropped"))
}

// TestEventNeverBlocks ensures a hanging API cannot block the caller: the
// buffer fills and further events are dropped.
func TestEventNeverBlocks(t *testing.T) {
	s := &eventServer{hold: make(chan struct{})}
	r := newRecorder(t, s, Config{Burst: 1000})
	t.Cleanup(func() { close(s.hold) }) // runs before the server's Close (cleanups run last-in first-out)
	done := make(chan struct{})
	go func() {
		for i := range 300 {
			r.Event(cm, Normal, "PodsRestarted", "n"+string(rune(i)))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Event blocked on a hanging API")
	}
	assert.Positive(t, r.sent.Value("dropped"))
}

// TestDisabledRecorderIsSafeToCall ensures a disabled recorder is safe to call.
func TestDisabledRecorderIsSafeToCall(t *testing.T) {
	var r *Recorder
	assert.NotPanics(t, func() { r.Event(cm, Normal, "X", "y") })
}
