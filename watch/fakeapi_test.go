package watch

// Test helpers: a scripted fake API server that answers the LIST and WATCH
// requests of one collection, the real apiclient.Client talking to it, a
// Handler that records what it is given, and the injected backoff, clock and
// After that make the loop fast and its delays observable.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/testlog"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/metrics"
)

const (
	testPath = "/api/v1/namespaces/default/configmaps"
	// waitLimit bounds every wait for the loop to reach a state; it is a
	// deadline for a failing test, never a pause.
	waitLimit = 10 * time.Second
)

// --- the fake API server --------------------------------------------------------

// reply answers one request of the fake API server.
type reply func(w http.ResponseWriter, r *http.Request)

// apiRequest is what the fake API server recorded of one request.
type apiRequest struct {
	Watch bool
	Query url.Values
}

// fakeAPI answers LIST requests (no watch parameter) and WATCH requests
// (watch=true) of testPath from two scripts, one reply per request in order.
// Past the end of its script a LIST hangs and a WATCH stays open without an
// event, both until the client goes away: the loop then waits quietly where
// the test can look at it.
type fakeAPI struct {
	t       testing.TB
	closing chan struct{}

	mu      sync.Mutex
	lists   []reply
	watches []reply
	reqs    []apiRequest
}

func newFakeAPI(t testing.TB) *fakeAPI {
	return &fakeAPI{t: t, closing: make(chan struct{})}
}

// onList appends replies to the LIST script.
func (f *fakeAPI) onList(rs ...reply) *fakeAPI {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists = append(f.lists, rs...)
	return f
}

// onWatch appends replies to the WATCH script.
func (f *fakeAPI) onWatch(rs ...reply) *fakeAPI {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watches = append(f.watches, rs...)
	return f
}

// start serves f on a new httptest server, closed when the test ends.
func (f *fakeAPI) start() *httptest.Server {
	srv := httptest.NewServer(f)
	f.t.Cleanup(func() {
		f.stopHolding()
		srv.Close()
	})
	return srv
}

// stopHolding ends the replies that hang until the client goes away.
func (f *fakeAPI) stopHolding() {
	select {
	case <-f.closing:
	default:
		close(f.closing)
	}
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.URL.Path != testPath {
		f.t.Errorf("fake API: unexpected request %s %s", r.Method, r.URL)
		http.Error(w, "unexpected request", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	isWatch := q.Get("watch") == "true"
	f.mu.Lock()
	f.reqs = append(f.reqs, apiRequest{Watch: isWatch, Query: q})
	script, next := &f.lists, f.hangList
	if isWatch {
		script, next = &f.watches, f.holdWatch
	}
	if len(*script) > 0 {
		next, *script = (*script)[0], (*script)[1:]
	}
	f.mu.Unlock()
	next(w, r)
}

// hangList never answers: a LIST still in progress.
func (f *fakeAPI) hangList(_ http.ResponseWriter, r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-f.closing:
	}
}

// holdWatch opens the stream and sends nothing: a quiet, healthy watch.
func (f *fakeAPI) holdWatch(w http.ResponseWriter, r *http.Request) {
	serveLines(w)
	select {
	case <-r.Context().Done():
	case <-f.closing:
	}
}

func (f *fakeAPI) requests(watch bool) []apiRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []apiRequest
	for _, r := range f.reqs {
		if r.Watch == watch {
			out = append(out, r)
		}
	}
	return out
}

func (f *fakeAPI) listRequests() []apiRequest  { return f.requests(false) }
func (f *fakeAPI) watchRequests() []apiRequest { return f.requests(true) }

// watchRVs is the resourceVersion of every watch request, in order.
func (f *fakeAPI) watchRVs() []string {
	var rvs []string
	for _, r := range f.watchRequests() {
		rvs = append(rvs, r.Query.Get("resourceVersion"))
	}
	return rvs
}

// waitWatches waits until the server has received n watch requests.
func (f *fakeAPI) waitWatches(t testing.TB, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(f.watchRequests()) >= n }, waitLimit, time.Millisecond,
		"waiting for watch request #%d", n)
}

// waitLists waits until the server has received n list requests.
func (f *fakeAPI) waitLists(t testing.TB, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(f.listRequests()) >= n }, waitLimit, time.Millisecond,
		"waiting for list request #%d", n)
}

// --- replies --------------------------------------------------------------------

// serveLines answers 200 and writes each line as the API server does: the
// line, a newline, a flush.
func serveLines(w http.ResponseWriter, lines ...string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	flusher.Flush()
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		flusher.Flush()
	}
}

// stream answers a watch with lines, then ends the stream cleanly.
func stream(lines ...string) reply {
	return func(w http.ResponseWriter, _ *http.Request) { serveLines(w, lines...) }
}

// streamCut answers a watch with lines, then tail without its newline, then
// ends: a disconnect in the middle of an event.
func streamCut(tail string, lines ...string) reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		serveLines(w, lines...)
		io.WriteString(w, tail)
	}
}

// status answers code with body; headers are name, value pairs.
func status(code int, body string, headers ...string) reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		ct := "text/plain; charset=utf-8"
		if strings.HasPrefix(body, "{") {
			ct = "application/json"
		}
		w.Header().Set("Content-Type", ct)
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

// ok answers 200 with a JSON body.
func ok(body string) reply { return status(http.StatusOK, body) }

// hangUp drops the connection in the middle of the answer's headers. (A
// connection closed before any byte of an answer is not enough: Go's
// transport then sends an idempotent request again by itself.)
func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
	buf.Flush()
	conn.Close()
}

// gated waits until gate is closed (or the client goes away), then answers with r.
func gated(gate <-chan struct{}, r reply) reply {
	return func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-gate:
			r(w, req)
		case <-req.Context().Done():
		}
	}
}

// --- objects, as the API server writes them --------------------------------------

// configMap is a ConfigMap as found in a watch event.
func configMap(name, rv string, data map[string]string) string {
	return configMapOfKind("ConfigMap", name, rv, data)
}

func configMapOfKind(kind, name, rv string, data map[string]string) string {
	d, err := json.Marshal(data)
	if err != nil {
		panic(err)
	}
	uid := fmt.Sprintf("%x", sha256.Sum256([]byte(name)))[:32]
	uid = uid[:8] + "-" + uid[8:12] + "-" + uid[12:16] + "-" + uid[16:20] + "-" + uid[20:]
	return fmt.Sprintf(`{"kind":%q,"apiVersion":"v1","metadata":{"name":%q,"namespace":"default","uid":%q,"resourceVersion":%q,`+
		`"creationTimestamp":"2025-06-01T10:00:00Z","annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"}},"data":%s}`,
		kind, name, uid, rv, d)
}

// item is a ConfigMap as found in a list's items: no kind, no apiVersion.
func item(name, rv string) string {
	return `{` + strings.TrimPrefix(configMap(name, rv, map[string]string{"message": "Hello"}), `{"kind":"ConfigMap","apiVersion":"v1",`)
}

// event is one watch line.
func event(typ EventType, object string) string {
	return fmt.Sprintf(`{"type":%q,"object":%s}`, typ, object)
}

func modified(name, rv string) string {
	return event(Modified, configMap(name, rv, map[string]string{"message": "Hello, " + rv}))
}

func bookmark(rv string) string {
	return fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":%q,`+
		`"creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}`, rv)
}

const (
	goneStatus = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}`
	goneEvent  = `{"type":"ERROR","object":` + goneStatus + `}`
	tooLarge   = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too large resource version: 200, current: 100",` +
		`"reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}}`
	internalStatus = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcdserver: leader changed","reason":"InternalError","code":500}`
)

// list is a LIST answer: items, the collection's resourceVersion and, unless
// empty, a continue token for the next page.
func list(rv, cont string, items ...string) reply {
	meta := fmt.Sprintf(`{"resourceVersion":%q}`, rv)
	if cont != "" {
		meta = fmt.Sprintf(`{"resourceVersion":%q,"continue":%q,"remainingItemCount":1}`, rv, cont)
	}
	return ok(fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":%s,"items":[%s]}`, meta, strings.Join(items, ",")))
}

// readLines reads an NDJSON file as its lines, without their newlines.
func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.HasSuffix(b, []byte("\n")), "%s: the last line has no newline", path)
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// --- the handler ---------------------------------------------------------------------

// handlerCall is one call the loop made to its Handler.
type handlerCall struct {
	Op   string // BeginList, Handle, EndList
	Type EventType
	Name string
	RV   string
	Len  int
	Sum  [sha256.Size]byte
}

// String renders a call compactly for comparisons: "BeginList",
// "MODIFIED webapp-config@101".
func (c handlerCall) String() string {
	if c.Op != "Handle" {
		return c.Op
	}
	return fmt.Sprintf("%s %s@%s", c.Type, c.Name, c.RV)
}

// recordingHandler records every call; it reads what it needs of an event
// during the call, as a Handler must.
type recordingHandler struct {
	mu    sync.Mutex
	calls []handlerCall
}

var _ Handler = (*recordingHandler)(nil)

func (h *recordingHandler) BeginList() { h.add(handlerCall{Op: "BeginList"}) }
func (h *recordingHandler) EndList()   { h.add(handlerCall{Op: "EndList"}) }

func (h *recordingHandler) Handle(ev Event) {
	var obj struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(ev.Object, &obj) // an undecodable object shows as an empty name
	h.add(handlerCall{Op: "Handle", Type: ev.Type, Name: obj.Metadata.Name, RV: ev.ResourceVersion,
		Len: len(ev.Object), Sum: sha256.Sum256(ev.Object)})
}

func (h *recordingHandler) add(c handlerCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, c)
}

func (h *recordingHandler) all() []handlerCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]handlerCall(nil), h.calls...)
}

// seen renders every call, in order.
func (h *recordingHandler) seen() []string {
	var out []string
	for _, c := range h.all() {
		out = append(out, c.String())
	}
	return out
}

// --- injected backoff, After and clock -------------------------------------------------

// stubBackOff returns step, 2×step, 3×step… and starts again at step after
// Reset, so a test can tell a fresh backoff from a growing one.
type stubBackOff struct {
	step time.Duration

	mu     sync.Mutex
	n      int
	resets int
}

var _ backoff.BackOff = (*stubBackOff)(nil)

func (b *stubBackOff) NextBackOff() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	return time.Duration(b.n) * b.step
}

func (b *stubBackOff) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n = 0
	b.resets++
}

// afterRecorder stands in for time.After: it records the delay asked for and
// returns a channel that is ready at once. hook, if set, runs first with the
// number of the call (from 1).
type afterRecorder struct {
	mu     sync.Mutex
	delays []time.Duration
	hook   func(n int)
}

func (a *afterRecorder) After(d time.Duration) <-chan time.Time {
	a.mu.Lock()
	a.delays = append(a.delays, d)
	n, hook := len(a.delays), a.hook
	a.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func (a *afterRecorder) requested() []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Duration(nil), a.delays...)
}

// fakeClock only moves when told to, so that no test depends on how fast the
// machine runs.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// --- the loop under test -----------------------------------------------------------------

// loop is a ListWatcher running against a fake API server through the real
// client, with its handler, metrics, backoff, delays, clock and log at hand.
type loop struct {
	lw      *ListWatcher
	h       *recordingHandler
	m       *Metrics
	bo      *stubBackOff
	after   *afterRecorder
	clock   *fakeClock
	logs    *testlog.Buffer
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
	err     error
}

// newLoop builds a ListWatcher for baseURL. Unset seams in cfg get the test
// versions: a stub backoff of 1 ms steps, the recording After, a fake clock.
func newLoop(t testing.TB, baseURL string, cfg Config) *loop {
	t.Helper()
	client, err := apiclient.New(baseURL, "watch-test")
	require.NoError(t, err)
	l := &loop{
		h:     &recordingHandler{},
		m:     NewMetrics(metrics.NewRegistry()),
		bo:    &stubBackOff{step: time.Millisecond},
		after: &afterRecorder{},
		clock: newFakeClock(),
		logs:  &testlog.Buffer{},
		done:  make(chan error, 1),
	}
	if cfg.Path == "" {
		cfg.Path = testPath
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = func() backoff.BackOff { return l.bo }
	}
	if cfg.After == nil {
		cfg.After = l.after.After
	}
	if cfg.Now == nil {
		cfg.Now = l.clock.Now
	}
	log := slog.New(slog.NewTextHandler(l.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l.lw = New(cfg, client, l.h, log, l.m)
	return l
}

// run starts the loop; it is stopped when the test ends, before the server.
func (l *loop) run(t testing.TB) *loop {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go func() { l.done <- l.lw.Run(ctx) }()
	t.Cleanup(func() { l.stop(t) })
	return l
}

// startLoop is newLoop + run with Kind ConfigMap.
func startLoop(t testing.TB, baseURL string) *loop {
	t.Helper()
	return newLoop(t, baseURL, Config{Kind: "ConfigMap"}).run(t)
}

// stop cancels the loop's context and waits for Run to return, which must
// then report the cancellation.
func (l *loop) stop(t testing.TB) {
	t.Helper()
	l.stopped.Do(func() {
		l.cancel()
		select {
		case l.err = <-l.done:
		case <-time.After(waitLimit):
			l.err = fmt.Errorf("Run did not return within %s of its context being cancelled", waitLimit)
		}
		require.ErrorIs(t, l.err, context.Canceled)
	})
}

// waitHandled waits until the handler has received n calls in all.
func (l *loop) waitHandled(t testing.TB, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(l.h.all()) >= n }, waitLimit, time.Millisecond,
		"waiting for %d handler calls", n)
}

// restartableServer serves a handler on one fixed address that can be taken
// down (connections are then refused) and brought back.
type restartableServer struct {
	t    testing.TB
	h    http.Handler
	addr string
	mu   sync.Mutex
	srv  *httptest.Server
}

func newRestartableServer(t testing.TB, h http.Handler) *restartableServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s := &restartableServer{t: t, h: h, addr: addr}
	t.Cleanup(s.down)
	return s
}

func (s *restartableServer) URL() string { return "http://" + s.addr }

func (s *restartableServer) up() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		// Called from the loop's goroutine (an After hook): report, do not FailNow.
		s.t.Errorf("listen again on %s: %v", s.addr, err)
		return
	}
	s.srv = httptest.NewUnstartedServer(s.h)
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Start()
}

func (s *restartableServer) down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}
