package leader

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// leaseServer is an API server holding one Lease with kube-apiserver's
// optimistic locking: create answers 409 if it exists, update answers 409
// unless the resourceVersion matches. failing makes it answer 500.
type leaseServer struct {
	mu       sync.Mutex
	lease    map[string]any // nil: absent
	rv       int
	updates  int
	releases int // updates that left the Lease without a holder
	failing  atomic.Bool
	srv      *httptest.Server
}

func newLeaseServer(t *testing.T) *leaseServer {
	s := &leaseServer{}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func status(w http.ResponseWriter, code int, reason string) {
	w.WriteHeader(code)
	io.WriteString(w, `{"kind":"Status","code":`+strconv.Itoa(code)+`,"reason":"`+reason+`"}`)
}

func (s *leaseServer) serve(w http.ResponseWriter, r *http.Request) {
	if s.failing.Load() {
		status(w, 500, "InternalError")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	const base = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
	var body map[string]any
	if r.Body != nil {
		_ = json.NewDecoder(r.Body).Decode(&body)
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base+"/cw":
		if s.lease == nil {
			status(w, 404, "NotFound")
			return
		}
		json.NewEncoder(w).Encode(s.lease)
	case r.Method == http.MethodPost && r.URL.Path == base:
		if s.lease != nil {
			status(w, 409, "AlreadyExists")
			return
		}
		s.store(body)
		json.NewEncoder(w).Encode(s.lease)
	case r.Method == http.MethodPut && r.URL.Path == base+"/cw":
		meta, _ := body["metadata"].(map[string]any)
		if s.lease == nil || meta["resourceVersion"] != strconv.Itoa(s.rv) {
			status(w, 409, "Conflict")
			return
		}
		s.updates++
		if spec, _ := body["spec"].(map[string]any); spec["holderIdentity"] == nil {
			s.releases++
		}
		s.store(body)
		json.NewEncoder(w).Encode(s.lease)
	default:
		status(w, 405, "MethodNotAllowed")
	}
}

func (s *leaseServer) store(obj map[string]any) {
	s.rv++
	obj["metadata"].(map[string]any)["resourceVersion"] = strconv.Itoa(s.rv)
	s.lease = obj
}

func (s *leaseServer) holder() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease == nil {
		return ""
	}
	h, _ := s.lease["spec"].(map[string]any)["holderIdentity"].(string)
	return h
}

func testConfig(identity string) Config {
	return Config{Namespace: "ns", Name: "cw", Identity: identity,
		LeaseDuration: 400 * time.Millisecond, RenewDeadline: 200 * time.Millisecond, RetryPeriod: 20 * time.Millisecond}
}

// candidate runs an elector until the test ends or stop is called.
type candidate struct {
	e       *Elector
	cancel  context.CancelFunc
	done    chan struct{}
	leading atomic.Int32 // lead functions currently running
	terms   atomic.Int32
}

func runCandidate(t *testing.T, s *leaseServer, cfg Config) *candidate {
	api, err := apiclient.New(s.srv.URL, "test")
	require.NoError(t, err)
	e, err := New(cfg, api, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{e: e, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		e.Run(ctx, func(ctx context.Context) {
			c.leading.Add(1)
			c.terms.Add(1)
			<-ctx.Done()
			c.leading.Add(-1)
		})
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *candidate) stop() { c.cancel(); <-c.done }

const waitFor = 5 * time.Second

// TestSingleCandidateLeads ensures a lone replica creates the Lease, leads,
// and releases the Lease when it stops.
func TestSingleCandidateLeads(t *testing.T) {
	s := newLeaseServer(t)
	c := runCandidate(t, s, testConfig("a"))
	require.Eventually(t, c.e.Leading, waitFor, time.Millisecond)
	assert.Equal(t, "a", s.holder())
	require.Eventually(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.updates >= 2 }, waitFor, time.Millisecond, "the leader renews")
	assert.True(t, c.e.Leading())

	c.stop()
	assert.False(t, c.e.Leading())
	assert.Equal(t, "", s.holder(), "a stopping leader releases the Lease")
	assert.Equal(t, int32(0), c.leading.Load())
}

// TestOneLeaderAtATime ensures that of several candidates exactly one
// leads, never two at once, and a standby takes over at once when the
// leader releases the Lease on shutdown.
func TestOneLeaderAtATime(t *testing.T) {
	s := newLeaseServer(t)
	cs := []*candidate{runCandidate(t, s, testConfig("a")), runCandidate(t, s, testConfig("b")), runCandidate(t, s, testConfig("c"))}
	leaders := func() (n int32, who *candidate) {
		for _, c := range cs {
			if c.leading.Load() > 0 {
				n += c.leading.Load()
				who = c
			}
		}
		return n, who
	}
	require.Eventually(t, func() bool { n, _ := leaders(); return n == 1 }, waitFor, time.Millisecond)
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		n, _ := leaders()
		require.LessOrEqual(t, n, int32(1), "two leaders at once")
	}
	_, first := leaders()
	first.stop()
	s.mu.Lock()
	assert.Equal(t, 1, s.releases, "the stopping leader released the Lease, so no standby waits for it to expire")
	s.mu.Unlock()
	require.Eventually(t, func() bool { n, _ := leaders(); return n == 1 }, waitFor, time.Millisecond)
}

// TestLeaderStopsBeforeLeaseCanBeTaken ensures a leader that cannot renew
// stops leading within RenewDeadline, before a standby may take the Lease
// (LeaseDuration after the last renewal it saw).
func TestLeaderStopsBeforeLeaseCanBeTaken(t *testing.T) {
	s := newLeaseServer(t)
	cfg := testConfig("a")
	c := runCandidate(t, s, cfg)
	require.Eventually(t, func() bool { return c.leading.Load() == 1 }, waitFor, time.Millisecond)
	s.failing.Store(true)
	failedAt := time.Now()
	require.Eventually(t, func() bool { return c.leading.Load() == 0 }, waitFor, time.Millisecond)
	assert.True(t, c.e.validUntilTime().Before(failedAt.Add(cfg.LeaseDuration)),
		"Leading() turned false before a standby could take the Lease")
	assert.False(t, c.e.Leading())

	s.failing.Store(false)
	require.Eventually(t, func() bool { return c.leading.Load() == 1 }, waitFor, time.Millisecond, "it leads again once the API answers")
	assert.Equal(t, int32(2), c.terms.Load())
}

// TestExpiredLeaseIsTaken ensures a Lease whose holder stopped renewing
// without releasing it (a crash) is taken over after LeaseDuration, judged
// on the standby's own clock.
func TestExpiredLeaseIsTaken(t *testing.T) {
	s := newLeaseServer(t)
	s.store(map[string]any{
		"metadata": map[string]any{"name": "cw", "namespace": "ns"},
		// A renewTime far in the future: a skewed clock must not matter.
		"spec": map[string]any{"holderIdentity": "crashed", "leaseDurationSeconds": 0, "renewTime": "2999-01-01T00:00:00.000000Z"},
	})
	c := runCandidate(t, s, testConfig("b"))
	require.Eventually(t, c.e.Leading, waitFor, time.Millisecond)
	assert.Equal(t, "b", s.holder())
}

// TestUnsafeTimingsRefused ensures the timing relations that make the election
// safe are enforced.
func TestUnsafeTimingsRefused(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"NoIdentity", func(c *Config) { c.Identity = "" }, "identity"},
		{"NoName", func(c *Config) { c.Name = "" }, "lease namespace and name"},
		{"RenewNotLongerThanRetry", func(c *Config) { c.RenewDeadline = c.RetryPeriod }, "RENEW_DEADLINE must be longer than RETRY_PERIOD"},
		{"LeaseNotLongerThanRenew", func(c *Config) { c.LeaseDuration = c.RenewDeadline }, "LEASE_DURATION must be longer than RENEW_DEADLINE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig("a")
			tt.mutate(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			assert.True(t, strings.Contains(err.Error(), tt.want), err.Error())
		})
	}
	assert.NoError(t, testConfig("a").Validate())
}

// TestMalformedLeaseIsNotTaken ensures a Lease the server answers with a body
// that is not a Lease is an error, never read as a free Lease and taken.
func TestMalformedLeaseIsNotTaken(t *testing.T) {
	var puts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			puts.Add(1)
		}
		io.WriteString(w, `{"metadata":{"resourceVersion":"1"},"spec":{"leaseDurationSeconds":"fifteen"}}`)
	}))
	t.Cleanup(srv.Close)
	api, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	e, err := New(testConfig("a"), api, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)

	ok, err := e.tryAcquireOrRenew(context.Background())
	assert.False(t, ok)
	assert.ErrorContains(t, err, "get lease")
	assert.Zero(t, puts.Load(), "nothing written")
}
