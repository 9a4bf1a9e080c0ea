// Package leader elects one active replica with a coordination.k8s.io/v1
// Lease, over the same raw API client as the rest of the controller, by
// client-go's algorithm: docs/design.md#leader-election says how, and why a
// leader always stops acting before anyone else may take over.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/jitter"
	"github.com/k8spatterns/config-watcher/internal/retrylog"
)

// Config of an election; the durations are LEASE_DURATION, RENEW_DEADLINE
// and RETRY_PERIOD of docs/settings.md.
type Config struct {
	Namespace, Name string // the Lease
	Identity        string // this replica (POD_NAME)
	LeaseDuration   time.Duration
	RenewDeadline   time.Duration
	RetryPeriod     time.Duration
}

// Validate checks the timing relations the safety argument relies on.
func (c Config) Validate() error {
	switch {
	case c.Namespace == "" || c.Name == "":
		return errors.New("lease namespace and name are required")
	case c.Identity == "":
		return errors.New("an identity (POD_NAME) is required")
	case c.RetryPeriod <= 0:
		return errors.New("RETRY_PERIOD must be positive")
	case c.RenewDeadline <= c.RetryPeriod:
		return errors.New("RENEW_DEADLINE must be longer than RETRY_PERIOD")
	case c.LeaseDuration <= c.RenewDeadline:
		return errors.New("LEASE_DURATION must be longer than RENEW_DEADLINE: a leader must stop acting before its lease can be taken")
	}
	return nil
}

// API is what the election needs of *apiclient.Client. Its tests put an
// in-memory Lease behind it: a loopback connection would keep a fake clock
// from moving, and on a real clock a busy machine can make any renewal late.
type API interface {
	Get(ctx context.Context, path string, query url.Values, accept string) ([]byte, error)
	Create(ctx context.Context, path string, body []byte) ([]byte, error)
	Update(ctx context.Context, path string, body []byte) ([]byte, error)
}

var _ API = (*apiclient.Client)(nil)

// Elector campaigns for the Lease and runs the leader's work while it holds it.
type Elector struct {
	cfg Config
	api API
	log *slog.Logger
	// failures logs a failure to reach the Lease once per cause, not at
	// every try (one per RETRY_PERIOD).
	failures *retrylog.Log

	// The last Lease record seen and when (our clock) it last changed:
	// expiry is judged from that, never from the holder's clock.
	observed     record
	observedTime time.Time

	mu         sync.Mutex
	leading    bool
	validUntil time.Time // our last successful write's send time + RenewDeadline
	onChange   func(leading bool)
}

// New returns an elector. onChange, if not nil, is called with true when
// leadership starts and false when it ends (for a metric).
func New(cfg Config, api API, log *slog.Logger, onChange func(bool)) (*Elector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log = log.With("lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
	return &Elector{cfg: cfg, api: api, log: log, failures: retrylog.New(log, 0, nil), onChange: onChange}, nil
}

// Leading reports whether this replica surely holds the lease now.
func (e *Elector) Leading() bool { return e.ValidFor() > 0 }

// ValidFor is how much longer the lease is surely ours (zero if not leading).
func (e *Elector) ValidFor() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading {
		return 0
	}
	return max(e.validUntil.Sub(time.Now()), 0)
}

// Run campaigns until ctx is done. Each time it becomes leader it calls lead
// with a context that is cancelled when leadership ends; lead must return
// promptly then. On ctx's end it waits for lead and releases the Lease.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) {
	for ctx.Err() == nil {
		if !e.acquire(ctx) {
			break
		}
		e.setLeading(true)
		e.log.Info("became leader")
		leadCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); lead(leadCtx) }()
		e.renew(leadCtx)
		stop()
		<-done
		e.setLeading(false)
		if ctx.Err() != nil {
			e.release()
			return
		}
		e.log.Warn("lost leadership; standing by")
	}
}

func (e *Elector) setLeading(v bool) {
	e.mu.Lock()
	e.leading = v
	e.mu.Unlock()
	if e.onChange != nil {
		e.onChange(v)
	}
}

// acquire tries every RetryPeriod until it holds the lease or ctx ends.
func (e *Elector) acquire(ctx context.Context) bool {
	for {
		ok, err := e.tryAcquireOrRenew(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			e.failures.Failed("", "cannot acquire lease", err)
		case err == nil:
			e.failures.Recovered("", "lease reachable again")
		}
		if ok {
			return true
		}
		if !sleep(ctx, spread(e.cfg.RetryPeriod)) {
			return false
		}
	}
}

// renew keeps the lease until a renewal has not succeeded for RenewDeadline
// or ctx ends.
func (e *Elector) renew(ctx context.Context) {
	for {
		if !sleep(ctx, e.cfg.RetryPeriod) {
			return
		}
		attempt, cancel := context.WithDeadline(ctx, e.validUntilTime())
		ok, err := e.tryAcquireOrRenew(attempt)
		cancel()
		if ok {
			e.failures.Recovered("", "lease renewed again")
			continue
		}
		if ctx.Err() != nil {
			return
		}
		e.failures.Failed("", "cannot renew lease", err)
		if !time.Now().Before(e.validUntilTime()) {
			e.log.Error("lease not renewed within the renew deadline; stopping", "renew_deadline", e.cfg.RenewDeadline)
			return
		}
	}
}

func (e *Elector) validUntilTime() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.validUntil
}

// record is the part of a Lease's spec the election reads and writes.
type record struct {
	Holder          string `json:"holderIdentity,omitempty"` // none: released
	DurationSeconds int64  `json:"leaseDurationSeconds"`
	AcquireTime     string `json:"acquireTime"`
	RenewTime       string `json:"renewTime"`
	Transitions     int64  `json:"leaseTransitions"`
}

// lease is the Lease as read and written; other fields are not kept.
type lease struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		Namespace       string `json:"namespace"`
		ResourceVersion string `json:"resourceVersion,omitempty"`
	} `json:"metadata"`
	Spec record `json:"spec"`
}

func (e *Elector) path() string {
	return apiclient.GroupPath("coordination.k8s.io", "v1", e.cfg.Namespace, "leases", e.cfg.Name)
}

// tryAcquireOrRenew makes one attempt. It returns true if we hold the lease.
func (e *Elector) tryAcquireOrRenew(ctx context.Context) (bool, error) {
	sent := time.Now()
	now := microTime(sent)
	mine := record{Holder: e.cfg.Identity, DurationSeconds: int64(e.cfg.LeaseDuration / time.Second), AcquireTime: now, RenewTime: now}

	l, err := e.get(ctx)
	if apiclient.IsNotFound(err) {
		if _, err := e.api.Create(ctx, apiclient.GroupPath("coordination.k8s.io", "v1", e.cfg.Namespace, "leases", ""), e.leaseJSON(mine, "")); err != nil {
			return false, fmt.Errorf("create lease: %w", err)
		}
		e.held(sent, mine)
		return true, nil
	}
	if err != nil {
		return false, err
	}
	current := l.Spec
	if current != e.observed {
		e.observed, e.observedTime = current, time.Now()
	}
	duration := time.Duration(current.DurationSeconds) * time.Second
	if duration <= 0 {
		duration = e.cfg.LeaseDuration
	}
	if current.Holder != "" && current.Holder != e.cfg.Identity && time.Now().Before(e.observedTime.Add(duration)) {
		return false, nil // held by another replica that renewed recently
	}
	if current.Holder == e.cfg.Identity {
		mine.AcquireTime = current.AcquireTime
		mine.Transitions = current.Transitions
	} else {
		mine.Transitions = current.Transitions + 1
	}
	if _, err := e.api.Update(ctx, e.path(), e.leaseJSON(mine, l.Metadata.ResourceVersion)); err != nil {
		// 409: someone else wrote it since we read it; try again later.
		return false, fmt.Errorf("update lease: %w", err)
	}
	e.held(sent, mine)
	return true, nil
}

func (e *Elector) held(sent time.Time, r record) {
	e.observed, e.observedTime = r, time.Now()
	e.mu.Lock()
	e.validUntil = sent.Add(e.cfg.RenewDeadline)
	e.mu.Unlock()
}

// release gives the lease up so a standby need not wait for it to expire.
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l, err := e.get(ctx)
	if err != nil {
		e.log.Warn("cannot release lease", "err", err)
		return
	}
	if l.Spec.Holder != e.cfg.Identity {
		return
	}
	now := microTime(time.Now())
	r := record{DurationSeconds: 1, AcquireTime: now, RenewTime: now, Transitions: l.Spec.Transitions}
	if _, err := e.api.Update(ctx, e.path(), e.leaseJSON(r, l.Metadata.ResourceVersion)); err != nil {
		e.log.Warn("cannot release lease", "err", err)
		return
	}
	e.log.Info("released lease")
}

func (e *Elector) get(ctx context.Context) (lease, error) {
	var l lease
	body, err := e.api.Get(ctx, e.path(), nil, "")
	if err == nil {
		err = json.Unmarshal(body, &l)
	}
	if err != nil {
		return l, fmt.Errorf("get lease: %w", err)
	}
	return l, nil
}

func (e *Elector) leaseJSON(r record, resourceVersion string) []byte {
	l := lease{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Spec: r}
	l.Metadata.Name, l.Metadata.Namespace, l.Metadata.ResourceVersion = e.cfg.Name, e.cfg.Namespace, resourceVersion
	b, _ := json.Marshal(l)
	return b
}

// microTime formats t as a Kubernetes MicroTime.
func microTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}

// spread spreads retries of several replicas by up to 20 %.
func spread(d time.Duration) time.Duration {
	return d + jitter.N(d/5+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
