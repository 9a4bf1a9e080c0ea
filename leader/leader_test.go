package leader

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/testlog"
)

// leaseServer is an API server holding one Lease with kube-apiserver's
// optimistic locking: create answers 409 if it exists, update answers 409
// unless the resourceVersion matches. failing makes it answer 500.
//
// It is the candidates' API in memory: the election tests run in a synctest
// bubble, whose clock moves only while every goroutine waits, so a renewal
// is never late because the machine was busy (on a real clock, a leader
// starved for RenewDeadline stepped down mid-test). A loopback connection
// would keep that clock from moving.
type leaseServer struct {
	mu       sync.Mutex
	lease    map[string]any // nil: absent
	rv       int
	updates  int
	releases int // updates that left the Lease without a holder
	failing  atomic.Bool
	// forbidden makes it answer 403, as RBAC does to a Role without leases.
	forbidden atomic.Bool
	// Lead functions running, of all candidates, and how often one
	// started while another ran.
	leading, overlaps atomic.Int32
}

var _ API = (*leaseServer)(nil)

func (s *leaseServer) Get(ctx context.Context, path string, _ url.Values, _ string) ([]byte, error) {
	return s.call(ctx, http.MethodGet, path, nil)
}

func (s *leaseServer) Create(ctx context.Context, path string, body []byte) ([]byte, error) {
	return s.call(ctx, http.MethodPost, path, body)
}

func (s *leaseServer) Update(ctx context.Context, path string, body []byte) ([]byte, error) {
	return s.call(ctx, http.MethodPut, path, body)
}

// call answers as apiclient would: a non-2xx answer is a *StatusError.
func (s *leaseServer) call(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.forbidden.Load() {
		verb := map[string]string{http.MethodGet: "get", http.MethodPost: "create", http.MethodPut: "update"}[method]
		return nil, &apiclient.StatusError{Code: 403, Reason: "Forbidden", Message: "leases is forbidden",
			Access: apiclient.Access{Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Namespace: "ns"}}
	}
	rec := httptest.NewRecorder()
	s.serve(rec, httptest.NewRequest(method, path, bytes.NewReader(body)))
	if rec.Code/100 != 2 {
		e := apiclient.StatusFromJSON(rec.Body.Bytes())
		e.Code = rec.Code
		return nil, e
	}
	return rec.Body.Bytes(), nil
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

// runCandidate runs an elector on s, inside the test's bubble.
func runCandidate(t *testing.T, s *leaseServer, cfg Config) *candidate {
	return runLogged(t, s, cfg, io.Discard)
}

// runLogged is runCandidate logging to log.
func runLogged(t *testing.T, s *leaseServer, cfg Config, log io.Writer) *candidate {
	e, err := New(cfg, s, slog.New(slog.NewTextHandler(log, nil)), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{e: e, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		e.Run(ctx, func(ctx context.Context) {
			if s.leading.Add(1) > 1 {
				s.overlaps.Add(1)
			}
			c.leading.Add(1)
			c.terms.Add(1)
			<-ctx.Done()
			c.leading.Add(-1)
			s.leading.Add(-1)
		})
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *candidate) stop() { c.cancel(); <-c.done }

// after lets d of the bubble's time pass and every candidate act on it.
func after(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// TestSingleCandidateLeads ensures a lone replica creates the Lease, leads,
// keeps renewing it, and releases the Lease when it stops.
func TestSingleCandidateLeads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leaseServer{}
		cfg := testConfig("a")
		c := runCandidate(t, s, cfg)
		synctest.Wait()
		require.True(t, c.e.Leading(), "leads at once")
		assert.Equal(t, "a", s.holder())
		after(10 * cfg.LeaseDuration)
		s.mu.Lock()
		assert.GreaterOrEqual(t, s.updates, 100, "the leader renews every RetryPeriod")
		s.mu.Unlock()
		assert.True(t, c.e.Leading())
		assert.Equal(t, int32(1), c.terms.Load(), "one term all along")

		c.stop()
		assert.False(t, c.e.Leading())
		assert.Equal(t, "", s.holder(), "a stopping leader releases the Lease")
		assert.Equal(t, int32(0), c.leading.Load())
	})
}

// TestForbiddenLeaseLoggedOnceWithTheFix ensures a candidate the API server
// refuses the Lease (403) says so once, as an error naming the rule that
// grants it, not at every RetryPeriod, and says when it reaches it again.
func TestForbiddenLeaseLoggedOnceWithTheFix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leaseServer{}
		s.forbidden.Store(true)
		cfg := testConfig("a")
		var logs testlog.Buffer
		c := runLogged(t, s, cfg, &logs)
		after(20 * cfg.RetryPeriod)
		assert.False(t, c.e.Leading())
		s.forbidden.Store(false)
		after(2 * cfg.RetryPeriod)
		assert.True(t, c.e.Leading(), "leads once the Lease may be read")

		out := logs.String()
		assert.Equal(t, 1, strings.Count(out, "cannot acquire lease"), out)
		assert.Contains(t, out, `level=ERROR msg="cannot acquire lease" lease=ns/cw identity=a fix="RBAC: the controller may not get leases in namespace ns; grant it with the rule {apiGroups: [\"coordination.k8s.io\"], resources: [\"leases\"], verbs: [\"get\"]}`)
		assert.Contains(t, out, `msg="lease reachable again" lease=ns/cw identity=a failures=`)
	})
}

// TestOneLeaderAtATime ensures that of several candidates exactly one
// leads, never two at once, and a standby takes over within a RetryPeriod
// when the leader releases the Lease on shutdown, not after LeaseDuration.
func TestOneLeaderAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leaseServer{}
		cfg := testConfig("a")
		cs := []*candidate{runCandidate(t, s, cfg), runCandidate(t, s, testConfig("b")), runCandidate(t, s, testConfig("c"))}
		after(10 * cfg.LeaseDuration)
		require.Equal(t, int32(1), s.leading.Load(), "exactly one leads")
		var first *candidate
		var terms int32
		for _, c := range cs {
			if c.leading.Load() == 1 {
				first = c
			}
			terms += c.terms.Load()
		}
		assert.Equal(t, int32(1), terms, "no standby took over from a leader that kept renewing")

		first.stop()
		s.mu.Lock()
		assert.Equal(t, 1, s.releases, "the stopping leader released the Lease, so no standby waits for it to expire")
		s.mu.Unlock()
		after(cfg.RetryPeriod * 6 / 5) // the longest retry with its jitter
		assert.Equal(t, int32(1), s.leading.Load(), "a standby leads")
		assert.Zero(t, s.overlaps.Load(), "two leaders at once")
	})
}

// TestLeaderStopsBeforeLeaseCanBeTaken ensures a leader that cannot renew
// stops leading within RenewDeadline, before a standby may take the Lease
// (LeaseDuration after the last renewal it saw).
func TestLeaderStopsBeforeLeaseCanBeTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leaseServer{}
		cfg := testConfig("a")
		c := runCandidate(t, s, cfg)
		synctest.Wait()
		require.Equal(t, int32(1), c.leading.Load())
		s.failing.Store(true)
		failedAt := time.Now()
		after(cfg.RenewDeadline)
		assert.Equal(t, int32(0), c.leading.Load(), "still leading RenewDeadline after the last renewal")
		assert.True(t, c.e.validUntilTime().Before(failedAt.Add(cfg.LeaseDuration)),
			"Leading() turned false before a standby could take the Lease")
		assert.False(t, c.e.Leading())

		s.failing.Store(false)
		after(cfg.RetryPeriod * 6 / 5)
		assert.Equal(t, int32(1), c.leading.Load(), "it leads again once the API answers")
		assert.Equal(t, int32(2), c.terms.Load())
	})
}

// TestExpiredLeaseIsTaken ensures a Lease whose holder stopped renewing
// without releasing it (a crash) is taken over after LeaseDuration, judged
// on the standby's own clock, and not before.
func TestExpiredLeaseIsTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leaseServer{}
		s.store(map[string]any{
			"metadata": map[string]any{"name": "cw", "namespace": "ns"},
			// A renewTime far in the future: a skewed clock must not matter.
			"spec": map[string]any{"holderIdentity": "crashed", "leaseDurationSeconds": 0, "renewTime": "2999-01-01T00:00:00.000000Z"},
		})
		cfg := testConfig("b")
		c := runCandidate(t, s, cfg)
		after(cfg.LeaseDuration - cfg.RetryPeriod)
		assert.False(t, c.e.Leading(), "taken before LeaseDuration")
		assert.Equal(t, "crashed", s.holder())
		after(cfg.RetryPeriod + cfg.RetryPeriod*6/5)
		assert.True(t, c.e.Leading())
		assert.Equal(t, "b", s.holder())
	})
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
