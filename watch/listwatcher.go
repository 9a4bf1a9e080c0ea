// Package watch keeps a consistent view of one Kubernetes collection over a
// raw HTTP list + watch, the way client-go's reflector does, without
// client-go.
//
// A Decoder reads one event at a time from a stream. A ListWatcher owns
// everything else: the initial state, either streamed on a watch
// (sendInitialEvents, the WatchList feature) or read as a paged LIST decoded
// item by item, the WATCH from the list's resourceVersion, resuming from the
// last resourceVersion after a clean end of stream, relisting when the
// server has forgotten that version (410 Gone), and backing off on failures. It hands every object to a Handler and knows
// nothing of what the objects mean.
//
// Memory is bounded by the largest object, not by the collection: a watch
// line or a list item is read, handed over and dropped before the next one.
package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/metrics"
)

// Transport is the slice of the API client the loop needs.
type Transport interface {
	GetBody(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error)
	Stream(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error)
}

var _ Transport = (*apiclient.Client)(nil)

// Handler receives the collection's objects. Calls come from one goroutine,
// in order, and must not block on the network: the stream waits for them.
type Handler interface {
	// BeginList announces a (re)list; every current object follows as a
	// Synced event.
	BeginList()
	// Handle receives one object. ev.Object is only valid during the call.
	Handle(ev Event)
	// EndList closes a complete list: objects known before BeginList and
	// not handled since are gone. A list that fails half-way is never
	// ended; the next BeginList starts over.
	EndList()
}

// Config tunes a ListWatcher. Zero values take the defaults noted.
type Config struct {
	// Path of the collection, e.g. /api/v1/namespaces/default/configmaps.
	Path string
	// Kind expected in events (e.g. "ConfigMap"); objects of another kind
	// are logged and skipped. Empty accepts any kind.
	Kind string
	// MetadataOnly asks the server for each object's metadata alone
	// (PartialObjectMetadata): a watch of pods then carries names, uids and
	// labels, not specs and status.
	MetadataOnly bool
	// PageSize of the list (500). Pages are decoded one item at a time, so
	// it bounds requests, not memory.
	PageSize int
	// WatchList streams the initial state on the watch itself
	// (sendInitialEvents=true) instead of a paged LIST, ending with a
	// bookmark annotated k8s.io/initial-events-end. A server that refuses it
	// (400, 422) or does not honour it (another event type before that
	// bookmark, the stream ending or going silent for InitialEventsTimeout
	// before it) turns it off for good: the loop falls back to paged lists.
	WatchList bool
	// InitialEventsTimeout is the longest silence tolerated on a WatchList
	// stream before its initial-events-end bookmark (30 s).
	InitialEventsTimeout time.Duration
	// MinWatchTimeout and MaxWatchTimeout bound the server-side timeout of
	// each watch, chosen at random to spread reconnections of many
	// controllers (300 s and 600 s, as client-go).
	MinWatchTimeout, MaxWatchTimeout time.Duration
	// NewBackOff makes the retry policy; the default starts near 0.8 s,
	// doubles with jitter, caps at 30 s and never gives up.
	NewBackOff func() backoff.BackOff
	// ReadyGrace is how long after the last open watch the loop still
	// counts as ready while it reconnects (60 s).
	ReadyGrace time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
	// After waits between retries (time.After); tests record the delays.
	After func(time.Duration) <-chan time.Time
}

// DefaultBackOff is the retry policy for the watch loop: client-go's values
// (0.8 s initial, factor 2, cap 30 s) with jitter so that many controllers
// retrying an API server that just came back do not arrive together.
func DefaultBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 800 * time.Millisecond
	b.RandomizationFactor = 0.5
	b.Multiplier = 2
	b.MaxInterval = 30 * time.Second
	b.MaxElapsedTime = 0 // a controller never gives up on its API server
	b.Reset()
	return b
}

const (
	// minHealthyWatch: a watch that ends sooner with no event is counted as
	// a failure and backs off, so a server that closes streams at once is
	// not hammered in a loop.
	minHealthyWatch = time.Second
	// resetBackOffAfter: only a watch that delivered events or stayed open
	// this long resets the backoff, so a server that drops every stream
	// after a second or two is still met with growing delays on errors.
	resetBackOffAfter = 2 * time.Minute
	// maxRetryAfter bounds a server's Retry-After hint.
	maxRetryAfter = 5 * time.Minute
	// watchSlack lets the server end a watch at its timeoutSeconds before the
	// client gives up on a connection that went silent.
	watchSlack = 30 * time.Second
)

// ListWatcher runs list + watch for one collection.
type ListWatcher struct {
	cfg     Config
	t       Transport
	h       Handler
	log     *slog.Logger
	metrics *Metrics

	rv string // last resourceVersion seen; only the Run goroutine touches it
	// noWatchList: the server does not stream initial events; only the Run
	// goroutine touches it.
	noWatchList bool

	listed      atomic.Bool
	watching    atomic.Bool
	lastHealthy atomic.Int64 // unix nanos of the last time the loop was known in sync
	running     atomic.Bool
}

// New returns a ListWatcher; call Run to start it.
func New(cfg Config, t Transport, h Handler, log *slog.Logger, m *Metrics) *ListWatcher {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 500
	}
	if cfg.MinWatchTimeout <= 0 {
		cfg.MinWatchTimeout = 5 * time.Minute
	}
	if cfg.MaxWatchTimeout < cfg.MinWatchTimeout {
		cfg.MaxWatchTimeout = 2 * cfg.MinWatchTimeout
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = DefaultBackOff
	}
	if cfg.InitialEventsTimeout <= 0 {
		cfg.InitialEventsTimeout = 30 * time.Second
	}
	if cfg.ReadyGrace <= 0 {
		cfg.ReadyGrace = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	return &ListWatcher{cfg: cfg, t: t, h: h, log: log, metrics: m}
}

// Ready reports that the initial list is done and a watch is open, or was
// open less than ReadyGrace ago and is being resumed.
func (lw *ListWatcher) Ready() bool {
	if !lw.listed.Load() {
		return false
	}
	if lw.watching.Load() {
		return true
	}
	return lw.cfg.Now().Sub(time.Unix(0, lw.lastHealthy.Load())) < lw.cfg.ReadyGrace
}

// Watching reports that a watch stream is open now. Unlike Ready it has no
// grace: a cache fed by this loop is current only while it is true.
func (lw *ListWatcher) Watching() bool { return lw.listed.Load() && lw.watching.Load() }

// Alive reports that Run is running.
func (lw *ListWatcher) Alive() bool { return lw.running.Load() }

func (lw *ListWatcher) markHealthy() { lw.lastHealthy.Store(lw.cfg.Now().UnixNano()) }

// Run lists and watches until ctx is done. It never gives up on errors: it
// logs them and retries with backoff. It returns ctx's error.
func (lw *ListWatcher) Run(ctx context.Context) error {
	lw.running.Store(true)
	defer lw.running.Store(false)
	bo := lw.cfg.NewBackOff()
	needList := true
	startReason := "initial"
	for ctx.Err() == nil {
		streamed := needList && lw.cfg.WatchList && !lw.noWatchList
		if needList && !streamed {
			if err := lw.list(ctx); err != nil {
				if ctx.Err() != nil {
					break
				}
				lw.log.Error("list failed; retrying", "path", lw.cfg.Path, "err", err)
				lw.wait(ctx, bo, err)
				continue
			}
			needList = false
			lw.listed.Store(true)
			lw.markHealthy()
		}

		lw.metrics.WatchStarts.Inc(startReason)
		started := lw.cfg.Now()
		events, timeout, listed, err := lw.watch(ctx, streamed)
		lasted := lw.cfg.Now().Sub(started)
		if listed {
			needList = false
		}
		if events > 0 || lasted >= resetBackOffAfter {
			bo.Reset()
		}
		healthy := events > 0 || lasted >= minHealthyWatch
		if ctx.Err() != nil {
			break
		}
		switch {
		case errors.Is(err, errNoWatchList):
			// Every later (re)list is paged; the next round starts one at once.
			lw.noWatchList = true
			startReason = "error"
			lw.log.Warn("server does not stream the initial list; falling back to paged lists", "path", lw.cfg.Path, "err", err)
		case err == nil:
			// The server closed the stream at its timeout or cleanly: resume
			// from the last resourceVersion at once.
			startReason = "eof"
			if lasted >= timeout-time.Second {
				startReason = "timeout" // the server's timeoutSeconds: the normal end
			}
			lw.log.Debug("watch ended; resuming", "rv", lw.rv, "events", events)
			if !healthy {
				lw.wait(ctx, bo, nil)
			}
		case isGone(err):
			// The server no longer has our resourceVersion in its history.
			// Changes made since are only visible in a fresh list.
			startReason = "gone"
			needList = true
			lw.metrics.Relists.Inc()
			lw.log.Info("resourceVersion expired; relisting", "rv", lw.rv, "err", err)
			if !healthy {
				lw.wait(ctx, bo, nil)
			}
		default:
			startReason = "error"
			lw.log.Warn("watch failed; retrying", "rv", lw.rv, "err", err)
			lw.wait(ctx, bo, err)
		}
	}
	return ctx.Err()
}

// isGone: the watch's resourceVersion (or a list's continue token) is older
// than the server's history; only a relist recovers.
func isGone(err error) bool { return apiclient.IsGone(err) }

// wait sleeps for the next backoff interval, or longer if the server asked
// for it with Retry-After.
func (lw *ListWatcher) wait(ctx context.Context, bo backoff.BackOff, err error) {
	d := bo.NextBackOff()
	if d == backoff.Stop {
		d = lw.cfg.MinWatchTimeout // a custom policy gave up; we do not
	}
	if ra := min(apiclient.RetryAfter(err), maxRetryAfter); ra > d {
		d = ra
	}
	select {
	case <-ctx.Done():
	case <-lw.cfg.After(d):
	}
}

// Accept headers that ask for metadata only. A server that cannot serve
// metadata alone falls back to whole objects, which read the same way.
const (
	MetadataListAccept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	MetadataAccept     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// accept returns the Accept header for a request: metadata when configured,
// else the client's default.
func (lw *ListWatcher) accept(metadata string) string {
	if lw.cfg.MetadataOnly {
		return metadata
	}
	return ""
}

// errContinueExpired restarts a list whose continue token expired.
var errContinueExpired = errors.New("list continue token expired")

// list reads the whole collection, page by page, and hands every object to
// the handler. Each page is decoded as it arrives, one item at a time. On
// success lw.rv is the list's resourceVersion.
func (lw *ListWatcher) list(ctx context.Context) error {
	lw.h.BeginList()
	q := url.Values{"limit": {strconv.Itoa(lw.cfg.PageSize)}}
	for {
		meta, err := lw.listPage(ctx, q)
		if err != nil {
			if isGone(err) && q.Get("continue") != "" {
				return fmt.Errorf("%w: %w", errContinueExpired, err)
			}
			return fmt.Errorf("list %s: %w", lw.cfg.Path, err)
		}
		if meta.ResourceVersion == "" {
			return fmt.Errorf("list %s: response has no metadata.resourceVersion", lw.cfg.Path)
		}
		if meta.Continue == "" {
			lw.rv = meta.ResourceVersion
			lw.h.EndList()
			return nil
		}
		q.Set("continue", meta.Continue)
	}
}

// listPage reads one page and hands over its items.
func (lw *ListWatcher) listPage(ctx context.Context, q url.Values) (listMeta, error) {
	body, err := lw.t.GetBody(ctx, lw.cfg.Path, q, lw.accept(MetadataListAccept))
	if err != nil {
		return listMeta{}, err
	}
	defer body.Close()
	return readPage(body, func(raw []byte) {
		rv := gjson.GetBytes(raw, "metadata.resourceVersion")
		if len(raw) == 0 || raw[0] != '{' || rv.Type != gjson.String {
			lw.metrics.Malformed.Inc()
			lw.log.Warn("skipping malformed list item", "path", lw.cfg.Path, "err", &MalformedError{Reason: "list item is not an object with metadata.resourceVersion", Length: len(raw)})
			return
		}
		lw.h.Handle(Event{Type: Synced, Object: raw, ResourceVersion: rv.Str})
	})
}

// errNoWatchList: the server refused or did not honour a WatchList request.
var errNoWatchList = errors.New("streamed initial list not supported")

// initialEventsEnd is the annotation of the bookmark that closes the initial
// events of a WatchList.
const initialEventsEnd = "k8s.io/initial-events-end"

// refusesWatchList: the server rejected the WatchList parameters (an older
// server, or the feature turned off) rather than failing.
func refusesWatchList(err error) bool {
	return apiclient.IsInvalid(err) || apiclient.IsBadRequest(err)
}

// watch opens one watch from lw.rv and dispatches its events until the
// stream ends. With streamed set it is a WatchList: it starts a list, hands
// the initial events over as Synced and ends the list at the
// initial-events-end bookmark, then goes on as a plain watch. It returns nil
// for a clean end, counts the events handled, says which timeoutSeconds it
// asked for and whether it completed a list.
func (lw *ListWatcher) watch(ctx context.Context, streamed bool) (events int, timeout time.Duration, listed bool, err error) {
	timeout = lw.cfg.MinWatchTimeout
	if span := lw.cfg.MaxWatchTimeout - lw.cfg.MinWatchTimeout; span > 0 {
		timeout += rand.N(span)
	}
	q := url.Values{
		"watch":               {"true"},
		"resourceVersion":     {lw.rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {strconv.Itoa(int(timeout.Seconds()))},
	}
	if streamed {
		// The most recent state, read consistently, then changes from there.
		q.Set("resourceVersion", "")
		q.Set("sendInitialEvents", "true")
		q.Set("resourceVersionMatch", "NotOlderThan")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+watchSlack)
	defer cancel()
	body, err := lw.t.Stream(ctx, lw.cfg.Path, q, lw.accept(MetadataAccept))
	if err != nil {
		if streamed && refusesWatchList(err) {
			err = fmt.Errorf("%w: %w", errNoWatchList, err)
		}
		return 0, timeout, false, err
	}
	defer body.Close()
	lw.watching.Store(true)
	defer func() {
		lw.watching.Store(false)
		lw.markHealthy()
	}()

	initial := streamed
	var stalled atomic.Bool
	var stall *time.Timer
	if streamed {
		lw.h.BeginList()
		// A server that ignores sendInitialEvents sends the objects and then
		// nothing: the silence, not the stream's timeout, gives it away.
		stall = time.AfterFunc(lw.cfg.InitialEventsTimeout, func() {
			stalled.Store(true)
			cancel()
		})
		defer stall.Stop()
	}
	dec := NewDecoder(body)
	for {
		ev, err := dec.Next()
		var malformed *MalformedError
		switch {
		case initial && stalled.Load():
			return events, timeout, false, fmt.Errorf("%w: no %s bookmark after %s of silence", errNoWatchList, initialEventsEnd, lw.cfg.InitialEventsTimeout)
		case errors.Is(err, io.EOF) && initial:
			return events, timeout, false, fmt.Errorf("%w: stream ended before the %s bookmark", errNoWatchList, initialEventsEnd)
		case errors.Is(err, io.EOF):
			return events, timeout, listed, nil
		case errors.As(err, &malformed):
			lw.metrics.Malformed.Inc()
			lw.log.Warn("skipping malformed watch event", "rv", lw.rv, "err", err)
			continue
		case err != nil:
			return events, timeout, listed, fmt.Errorf("read watch stream: %w", err)
		}
		if initial {
			stall.Reset(lw.cfg.InitialEventsTimeout)
		}
		lw.metrics.Events.Inc(string(ev.Type))
		lw.metrics.LastEvent.Set(float64(lw.cfg.Now().UnixNano()) / 1e9)
		switch {
		case ev.Type == Error:
			return events, timeout, listed, watchError(ev.Object)
		case ev.Type == Bookmark && initial && isInitialEventsEnd(ev.Object):
			stall.Stop()
			initial = false
			lw.rv = ev.ResourceVersion
			lw.h.EndList()
			listed = true
			lw.listed.Store(true)
			lw.markHealthy()
		case ev.Type == Bookmark:
			if !initial {
				lw.rv = ev.ResourceVersion // a bookmark only moves the resourceVersion
			}
		case initial && ev.Type != Added:
			return events, timeout, false, fmt.Errorf("%w: %s event before the %s bookmark", errNoWatchList, ev.Type, initialEventsEnd)
		default:
			if kind := gjson.GetBytes(ev.Object, "kind").String(); lw.cfg.Kind != "" && kind != "" && kind != lw.cfg.Kind {
				lw.log.Warn("skipping event for another kind", "kind", kind, "rv", ev.ResourceVersion)
			} else if initial {
				ev.Type = Synced // the current state, not a change
				lw.h.Handle(ev)
			} else {
				lw.h.Handle(ev)
			}
			if !initial {
				lw.rv = ev.ResourceVersion
			}
		}
		events++
	}
}

// isInitialEventsEnd: the bookmark closes the initial events of a WatchList.
func isInitialEventsEnd(object []byte) bool {
	return gjson.GetBytes(object, "metadata.annotations").Get(gjson.Escape(initialEventsEnd)).String() == "true"
}

// watchError turns an ERROR event's Status into an error.
func watchError(object []byte) error {
	if st := apiclient.StatusFromJSON(object); st != nil {
		return st
	}
	return &apiclient.StatusError{Code: 500, Message: "ERROR event without a Status object"}
}

// ResourceVersion returns the last resourceVersion seen. For tests and
// diagnostics; call it only when Run is not running.
func (lw *ListWatcher) ResourceVersion() string { return lw.rv }

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
		WatchStarts: r.NewCounterVec(prefix+"watch_starts_total", "Watches opened, by why the previous one ended (initial, timeout: the server's timeoutSeconds, eof: closed sooner, gone, error)"+about+".", "reason",
			"initial", "timeout", "eof", "gone", "error"),
		Relists:   r.NewCounter(prefix+"relists_total", "Lists made again because the watch's resourceVersion expired"+about+"."),
		Malformed: r.NewCounter(prefix+"malformed_events_total", "Watch lines that could not be decoded and were skipped"+about+"."),
		LastEvent: r.NewGauge(prefix+"last_event_timestamp_seconds", "Unix time of the last watch event, bookmarks included"+about+"."),
	}
}
