// Package events reports what the controller did as core/v1 Events on the
// objects concerned, so that `kubectl describe configmap` tells the story
// (docs/operations.md#events). Recording never blocks the caller: events go
// through a bounded buffer to one sender, are rate-limited, and are dropped,
// counted, when the API is slow or the buffer is full. Messages are written
// by the controller and never contain ConfigMap data.
package events

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/retrylog"
	"github.com/k8spatterns/config-watcher/metrics"
)

// Event types.
const (
	Normal  = "Normal"
	Warning = "Warning"
)

// Object identifies the object an event is about.
type Object struct {
	APIVersion, Kind, Namespace, Name, UID string
}

const (
	component = "config-watcher" // source.component and reportingComponent
	// An event identical to one recorded for the same object less than
	// dedupeWindow ago is dropped.
	dedupeWindow = 5 * time.Minute
)

// Config of a Recorder; zero values take the defaults noted.
type Config struct {
	Instance string // reportingInstance (POD_NAME)
	// A token bucket of Burst events refilled one per Every (25 and 5 s).
	Burst int
	Every time.Duration
	Now   func() time.Time // time.Now
}

type event struct {
	obj                  Object
	typ, reason, message string
}

// Recorder sends events.
type Recorder struct {
	cfg   Config
	api   *apiclient.Client
	log   *slog.Logger
	queue chan event
	sent  *metrics.CounterVec
	// failures logs events that cannot be recorded once per cause (a
	// missing RBAC rule would fail every one).
	failures *retrylog.Log

	mu     sync.Mutex
	tokens float64
	last   time.Time
	seen   map[string]time.Time
}

// New returns a recorder; Run sends what it records.
func New(cfg Config, api *apiclient.Client, log *slog.Logger, reg *metrics.Registry) *Recorder {
	if cfg.Burst <= 0 {
		cfg.Burst = 25
	}
	if cfg.Every <= 0 {
		cfg.Every = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Recorder{
		cfg: cfg, api: api, log: log,
		queue:    make(chan event, 100),
		failures: retrylog.New(log, 0, cfg.Now),
		sent:     reg.NewCounterVec("config_watcher_events_emitted_total", "Kubernetes Events, by outcome (sent, dropped: rate limit, duplicate or full buffer; error).", "result", "sent", "dropped", "error"),
		tokens:   float64(cfg.Burst),
		last:     cfg.Now(),
		seen:     map[string]time.Time{},
	}
}

// Event records an event about obj. It never blocks.
func (r *Recorder) Event(obj Object, typ, reason, message string) {
	if r == nil {
		return
	}
	if r.allow(obj, reason, message) {
		select {
		case r.queue <- event{obj, typ, reason, message}:
			return
		default: // the buffer is full
		}
	}
	r.sent.Inc("dropped")
}

// allow applies the dedupe window and the token bucket.
func (r *Recorder) allow(obj Object, reason, message string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	key := obj.UID + "\x00" + obj.Namespace + "/" + obj.Name + "\x00" + reason + "\x00" + message
	if t, ok := r.seen[key]; ok && now.Sub(t) < dedupeWindow {
		return false
	}
	r.tokens = min(float64(r.cfg.Burst), r.tokens+now.Sub(r.last).Seconds()/r.cfg.Every.Seconds())
	r.last = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	for k, t := range r.seen { // bounded by the bucket: at most a few hundred keys
		if now.Sub(t) >= dedupeWindow {
			delete(r.seen, k)
		}
	}
	r.seen[key] = now
	return true
}

// Run sends recorded events until ctx is done.
func (r *Recorder) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.queue:
			r.send(ctx, ev)
		}
	}
}

func (r *Recorder) send(ctx context.Context, ev event) {
	now := r.cfg.Now().UTC()
	body, _ := json.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Event",
		"metadata":   map[string]any{"generateName": ev.obj.Name + ".", "namespace": ev.obj.Namespace},
		"involvedObject": map[string]any{
			"apiVersion": ev.obj.APIVersion, "kind": ev.obj.Kind,
			"namespace": ev.obj.Namespace, "name": ev.obj.Name, "uid": ev.obj.UID,
		},
		"type":               ev.typ,
		"reason":             ev.reason,
		"message":            ev.message,
		"source":             map[string]any{"component": component},
		"reportingComponent": component,
		"reportingInstance":  r.cfg.Instance,
		"firstTimestamp":     now.Format(time.RFC3339),
		"lastTimestamp":      now.Format(time.RFC3339),
		"eventTime":          nil,
		"count":              1,
	})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := r.api.Create(ctx, apiclient.CorePath(ev.obj.Namespace, "events", ""), body); err != nil {
		r.sent.Inc("error")
		r.failures.Failed("", "cannot record event", err, "namespace", ev.obj.Namespace, "object", ev.obj.Kind+"/"+ev.obj.Name, "reason", ev.reason)
		return
	}
	r.failures.Recovered("", "recording events again")
	r.sent.Inc("sent")
}
