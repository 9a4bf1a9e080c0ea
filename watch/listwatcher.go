// Package watch keeps a consistent view of one Kubernetes collection over a
// raw HTTP list + watch, as client-go's reflector does, without client-go.
//
// A Decoder reads one event at a time from a stream. A ListWatcher owns the
// rest: the initial state (a paged list, decoded item by item), the
// watch from its resourceVersion, resuming after a clean end, relisting after
// 410 Gone, backing off on failures. It hands every object to a Handler and
// knows nothing of what the objects mean. Memory is bounded by the largest
// object, not by the collection (docs/design.md, docs/memory.md).
package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/jitter"
	"github.com/k8spatterns/config-watcher/internal/retrylog"
	"github.com/k8spatterns/config-watcher/metrics"
)

// Handler receives the collection's objects. Calls come from one goroutine,
// in order, and must not block on the network: the stream waits for them.
type Handler interface {
	// BeginList announces a (re)list; every current object follows as Synced.
	BeginList()
	// Handle receives one object. ev.Object is only valid during the call.
	Handle(ev Event)
	// EndList closes a complete list: objects known before BeginList and not
	// handled since are gone. A list that fails half-way is never ended.
	EndList()
}

// Progresser is a Handler that is told how far the stream has come where no
// object it handles says so: the revision of a list, after its EndList, and
// each bookmark's. An index uses it to tell when it has caught up to a
// revision read elsewhere.
type Progresser interface {
	Progress(resourceVersion string)
}

// Streamer is a Handler that is told when a watch stream opens and when it
// ends: what it keeps is current only in between (Watching). While none is
// open (a cut, the relist after a 410, the retries before), changes may be
// on their way that it has not been shown.
type Streamer interface {
	Streaming(open bool)
}

// Config tunes a ListWatcher. Zero values take the defaults in brackets.
type Config struct {
	Path         string // of the collection, e.g. /api/v1/namespaces/default/configmaps
	Kind         string // expected kind; objects of another are logged and skipped. Empty: any
	MetadataOnly bool   // ask for each object's metadata alone (PartialObjectMetadata)
	// FieldSelector, if set, narrows the list and the watch server-side
	// (e.g. type!=helm.sh/release.v1 for Secrets).
	FieldSelector string
	// LabelSelector, if set, narrows them by labels (the Namespaces that
	// opted in); an object that stops matching arrives as DELETED.
	LabelSelector string
	PageSize      int // of a paged list [apiclient.ListPageSize]; it bounds requests, not memory
	// StartAfter, if set, holds the first list until it is closed: the
	// objects are judged by what another loop must have listed first.
	StartAfter <-chan struct{}

	// Bounds of each watch's timeoutSeconds, chosen at random to spread the
	// reconnections of many controllers [300 s, twice the minimum].
	MinWatchTimeout, MaxWatchTimeout time.Duration

	NewBackOff func() backoff.BackOff               // retry policy, never stopping [apiclient.DefaultBackOff]
	ReadyGrace time.Duration                        // still ready this long after the last open watch, while it reconnects [60 s]
	Now        func() time.Time                     // [time.Now]
	After      func(time.Duration) <-chan time.Time // waits between retries [time.After]
}

const (
	// minHealthyWatch: a watch that ends sooner with no event is a failure
	// and backs off, so a server that closes streams at once is not hammered.
	minHealthyWatch = time.Second
	// resetBackOffAfter: only a watch with events or open this long resets the
	// backoff, so a server dropping every stream still meets growing delays.
	resetBackOffAfter = 2 * time.Minute
	// watchSlack lets the server end a watch at its timeoutSeconds before the
	// client gives up on a silent connection.
	watchSlack = 30 * time.Second
)

// ListWatcher runs list + watch for one collection.
type ListWatcher struct {
	cfg     Config
	client  *apiclient.Client
	h       Handler
	log     *slog.Logger
	metrics *Metrics
	// failures logs a failure once per cause, not at every retry.
	failures *retrylog.Log

	// Only the Run goroutine touches these.
	rv       string // last resourceVersion seen
	needList bool   // the next watch needs a fresh list first

	listed, watching, running atomic.Bool
	relist                    atomic.Bool                        // Relist asked for a list
	stopWatch                 atomic.Pointer[context.CancelFunc] // ends the open watch, if any
	lastHealthy               atomic.Int64                       // unix nanos of the last time the loop was known in sync
	problem                   atomic.Pointer[string]             // the failure since the last open watch, and its fix
}

// New returns a ListWatcher; call Run to start it.
func New(cfg Config, client *apiclient.Client, h Handler, log *slog.Logger, m *Metrics) *ListWatcher {
	if cfg.PageSize <= 0 {
		cfg.PageSize = apiclient.ListPageSize
	}
	if cfg.MinWatchTimeout <= 0 {
		cfg.MinWatchTimeout = 5 * time.Minute
	}
	if cfg.MaxWatchTimeout < cfg.MinWatchTimeout {
		cfg.MaxWatchTimeout = 2 * cfg.MinWatchTimeout
	}
	if cfg.ReadyGrace <= 0 {
		cfg.ReadyGrace = time.Minute
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = apiclient.DefaultBackOff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	return &ListWatcher{cfg: cfg, client: client, h: h, log: log, metrics: m, failures: retrylog.New(log, 0, cfg.Now)}
}

// Ready reports that the initial list is done and a watch is open, or was
// open less than ReadyGrace ago and is being resumed.
func (lw *ListWatcher) Ready() bool {
	sinceHealthy := lw.cfg.Now().Sub(time.Unix(0, lw.lastHealthy.Load()))
	return lw.listed.Load() && (lw.watching.Load() || sinceHealthy < lw.cfg.ReadyGrace)
}

// Unready says why the loop is not Ready, "" when it is: its last failure
// and what fixes it, or that its first list has not ended.
func (lw *ListWatcher) Unready() string {
	switch p := lw.problem.Load(); {
	case lw.Ready():
		return ""
	case p != nil:
		return *p
	case !lw.listed.Load():
		return "initial list not done"
	}
	return "watch down; reconnecting"
}

// Watching reports that a watch stream is open now. Unlike Ready it has no
// grace: a cache fed by this loop is current only while it is true.
func (lw *ListWatcher) Watching() bool { return lw.listed.Load() && lw.watching.Load() }

// Path is the collection's path, e.g. /api/v1/namespaces/default/configmaps.
func (lw *ListWatcher) Path() string { return lw.cfg.Path }

// Alive reports that Run is running.
func (lw *ListWatcher) Alive() bool { return lw.running.Load() }

func (lw *ListWatcher) markHealthy() { lw.lastHealthy.Store(lw.cfg.Now().UnixNano()) }

// Relist makes the loop list the collection again at once, ending its open
// watch: the handler sees every object afresh (those of a namespace that
// just opted in, ignored until now).
func (lw *ListWatcher) Relist() {
	lw.relist.Store(true)
	if stop := lw.stopWatch.Load(); stop != nil {
		(*stop)()
	}
}

// Run lists and watches until ctx is done. It never gives up on errors: it
// logs them and retries with backoff. It returns ctx's error.
func (lw *ListWatcher) Run(ctx context.Context) error {
	lw.running.Store(true)
	defer lw.running.Store(false)
	if lw.cfg.StartAfter != nil {
		select {
		case <-lw.cfg.StartAfter:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	bo := lw.cfg.NewBackOff()
	lw.needList = true
	reason := "initial" // why the previous watch ended
	for ctx.Err() == nil {
		if lw.needList {
			if err := lw.list(ctx); err != nil {
				if ctx.Err() == nil {
					lw.failed("list failed; retrying", err)
					lw.wait(ctx, bo, err)
				}
				continue
			}
		}

		lw.metrics.WatchStarts.Inc(reason)
		started := lw.cfg.Now()
		events, timeout, err := lw.watch(ctx)
		lasted := lw.cfg.Now().Sub(started)
		if events > 0 || lasted >= resetBackOffAfter {
			bo.Reset()
		}
		healthy := events > 0 || lasted >= minHealthyWatch
		if ctx.Err() != nil {
			break
		}
		switch {
		case lw.relist.Swap(false):
			reason = "relist"
			lw.needList = true
			lw.log.Info("relisting, as asked", "path", lw.cfg.Path)
		case err == nil: // the server closed the stream: resume from lw.rv at once
			reason = "eof"
			if lasted >= timeout-time.Second {
				reason = "timeout" // the server's timeoutSeconds: the normal end
			}
			lw.log.Debug("watch ended; resuming", "rv", lw.rv, "events", events)
			if !healthy {
				lw.wait(ctx, bo, nil)
			}
		case apiclient.IsGone(err): // changes since lw.rv are only visible in a fresh list
			reason = "gone"
			lw.needList = true
			lw.metrics.Relists.Inc()
			lw.log.Info("resourceVersion expired; relisting", "rv", lw.rv, "err", err)
			if !healthy {
				lw.wait(ctx, bo, nil)
			}
		default:
			reason = "error"
			lw.failed("watch failed; retrying", fmt.Errorf("watch %s: %w", lw.cfg.Path, err))
			lw.wait(ctx, bo, err)
		}
	}
	return ctx.Err()
}

// failed logs a failed list or watch, once per cause, and keeps it, with
// its fix if a person can fix it, for Unready.
func (lw *ListWatcher) failed(msg string, err error) {
	problem := err.Error()
	if fix := lw.failures.Failed("", msg, err, "path", lw.cfg.Path); fix != "" {
		problem += "; fix: " + fix
	}
	lw.problem.Store(&problem)
}

// wait sleeps for apiclient.RetryDelay.
func (lw *ListWatcher) wait(ctx context.Context, bo backoff.BackOff, err error) {
	select {
	case <-ctx.Done():
	case <-lw.cfg.After(apiclient.RetryDelay(bo, err)):
	}
}

// accept returns metadata if the config asks for metadata only, else the
// client's default.
func (lw *ListWatcher) accept(metadata string) string {
	if lw.cfg.MetadataOnly {
		return metadata
	}
	return ""
}

// list reads the whole collection, page by page, and hands every object to
// the handler.
func (lw *ListWatcher) list(ctx context.Context) error {
	lw.h.BeginList()
	meta, err := apiclient.List(ctx, lw.client, lw.cfg.Path, lw.query(url.Values{}), lw.accept(apiclient.MetadataListAccept), lw.cfg.PageSize, lw.listItem)
	switch {
	case err != nil:
		return fmt.Errorf("list %s: %w", lw.cfg.Path, err)
	case meta.ResourceVersion == "":
		return fmt.Errorf("list %s: response has no metadata.resourceVersion", lw.cfg.Path)
	}
	lw.rv = meta.ResourceVersion
	lw.h.EndList()
	if p, ok := lw.h.(Progresser); ok {
		p.Progress(meta.ResourceVersion)
	}
	lw.needList = false
	lw.listed.Store(true)
	lw.markHealthy()
	return nil
}

// query adds what narrows every request of the loop to q.
func (lw *ListWatcher) query(q url.Values) url.Values {
	if lw.cfg.FieldSelector != "" {
		q.Set("fieldSelector", lw.cfg.FieldSelector)
	}
	if lw.cfg.LabelSelector != "" {
		q.Set("labelSelector", lw.cfg.LabelSelector)
	}
	return q
}

// listItem hands one listed object to the handler as Synced.
func (lw *ListWatcher) listItem(raw []byte) {
	rv := gjson.GetBytes(raw, "metadata.resourceVersion")
	if len(raw) == 0 || raw[0] != '{' || rv.Type != gjson.String {
		lw.metrics.Malformed.Inc()
		lw.log.Warn("skipping malformed list item", "path", lw.cfg.Path, "err", &MalformedError{Reason: "list item is not an object with metadata.resourceVersion", Length: len(raw)})
		return
	}
	lw.h.Handle(Event{Type: Synced, Object: raw, ResourceVersion: rv.Str})
}

// watch opens one watch from lw.rv and dispatches its events until the
// stream ends; it returns nil for a clean end, the number of events and the
// timeoutSeconds it asked for.
func (lw *ListWatcher) watch(ctx context.Context) (events int, timeout time.Duration, err error) {
	timeout = lw.cfg.MinWatchTimeout
	if span := lw.cfg.MaxWatchTimeout - lw.cfg.MinWatchTimeout; span > 0 {
		timeout += jitter.N(span)
	}
	q := lw.query(url.Values{
		"watch":               {"true"},
		"resourceVersion":     {lw.rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {strconv.Itoa(int(timeout.Seconds()))},
	})
	ctx, cancel := context.WithTimeout(ctx, timeout+watchSlack)
	defer cancel()
	// Published before the flag is read: a Relist either sees the stop or
	// is seen here.
	lw.stopWatch.Store(&cancel)
	defer lw.stopWatch.Store(nil)
	if lw.relist.Load() {
		return 0, timeout, nil
	}
	body, err := lw.client.Stream(ctx, lw.cfg.Path, q, lw.accept(apiclient.MetadataAccept))
	if err != nil {
		return 0, timeout, err
	}
	defer body.Close()
	lw.watching.Store(true)
	lw.problem.Store(nil)
	lw.failures.Recovered("", "watching again", "path", lw.cfg.Path)
	streamer, _ := lw.h.(Streamer)
	if streamer != nil {
		streamer.Streaming(true)
	}
	defer func() {
		lw.watching.Store(false)
		if streamer != nil {
			streamer.Streaming(false)
		}
		lw.markHealthy()
	}()

	dec := NewDecoder(body)
	for {
		ev, err := dec.Next()
		switch {
		case errors.Is(err, io.EOF):
			return events, timeout, nil
		case errors.As(err, new(*MalformedError)):
			lw.metrics.Malformed.Inc()
			lw.log.Warn("skipping malformed watch event", "rv", lw.rv, "err", err)
			continue
		case err != nil:
			return events, timeout, fmt.Errorf("read watch stream: %w", err)
		}
		lw.metrics.Events.Inc(string(ev.Type))
		lw.metrics.LastEvent.Set(float64(lw.cfg.Now().UnixNano()) / 1e9)
		switch {
		case ev.Type == Error:
			if st := apiclient.StatusFromJSON(ev.Object); st != nil {
				return events, timeout, st
			}
			return events, timeout, &apiclient.StatusError{Code: 500, Message: "ERROR event without a Status object"}
		case ev.Type == Bookmark:
			lw.rv = ev.ResourceVersion // a bookmark only moves the resourceVersion
			if p, ok := lw.h.(Progresser); ok {
				p.Progress(ev.ResourceVersion)
			}
		default:
			lw.rv = ev.ResourceVersion
			if kind := gjson.GetBytes(ev.Object, "kind").String(); lw.cfg.Kind != "" && kind != "" && kind != lw.cfg.Kind {
				lw.log.Warn("skipping event for another kind", "kind", kind, "rv", ev.ResourceVersion)
			} else {
				lw.h.Handle(ev)
			}
		}
		events++
	}
}

// Metrics of the loop.
type Metrics struct {
	Events      *metrics.CounterVec
	WatchStarts *metrics.CounterVec
	Relists     *metrics.Counter
	Malformed   *metrics.Counter
	LastEvent   *metrics.Gauge
}

// NewMetrics registers the metrics of the ConfigMap loops in r.
func NewMetrics(r *metrics.Registry) *Metrics { return newMetrics(r, "config_watcher_", "") }

// NewMetricsFor registers the metrics of another collection's loops in r,
// named config_watcher_<what>_..., e.g. config_watcher_pod_index_events_total.
func NewMetricsFor(r *metrics.Registry, what string) *Metrics {
	return newMetrics(r, "config_watcher_"+what+"_", " ("+strings.ReplaceAll(what, "_", " ")+")")
}

func newMetrics(r *metrics.Registry, prefix, about string) *Metrics {
	return &Metrics{
		Events: r.NewCounterVec(prefix+"events_total", "Watch events received, by type"+about+".", "type",
			string(Added), string(Modified), string(Deleted), string(Bookmark), string(Error)),
		WatchStarts: r.NewCounterVec(prefix+"watch_starts_total", "Watches opened, by why the previous one ended (initial, timeout: the server's timeoutSeconds, eof: closed sooner, gone, error, relist: a namespace opted in)"+about+".", "reason",
			"initial", "timeout", "eof", "gone", "error", "relist"),
		Relists:   r.NewCounter(prefix+"relists_total", "Lists made again because the watch's resourceVersion expired"+about+"."),
		Malformed: r.NewCounter(prefix+"malformed_events_total", "Watch lines that could not be decoded and were skipped"+about+"."),
		LastEvent: r.NewGauge(prefix+"last_event_timestamp_seconds", "Unix time of the last watch event, bookmarks included"+about+"."),
	}
}
