package policy

import (
	"context"
	"log/slog"
	"net/url"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/watch"
)

// Config of the controller. Zero values take the defaults New sets.
type Config struct {
	SelectorAnnotation string // holds the pod label selector on a ConfigMap
	// RecordHash writes R and I on the ConfigMaps. Without it (read-only
	// RBAC) they live in memory: changes made while the controller was
	// down are adopted, not acted on.
	RecordHash bool
	OwnPod     string // never deleted: the controller's own pod
	Workers    int    // ConfigMaps reconciled at once (4)
	// ShutdownGrace bounds how long rounds in flight may run once the
	// controller is told to stop (10 s).
	ShutdownGrace time.Duration
	NewBackOff    func() backoff.BackOff // retry policy of failed rounds
	Strategy      string                 // StrategyDelete (the default) or StrategyEvict
	// MaxUnavailable is the budget of a round's waves (waves.go; 25%).
	MaxUnavailable Budget
	// ProgressDeadline: a round that could restart nothing for this long
	// halts, and a finished round's replacements not Ready by then are
	// reported (10 min).
	ProgressDeadline time.Duration
	// MaxConcurrentRestarts caps a round's restart requests in flight; 0
	// sends a wave's all at once.
	MaxConcurrentRestarts int
	// DryRun does everything but act: the server validates each restart
	// (dryRun=All), and nothing is deleted, evicted or recorded.
	DryRun bool
	Events EventRecorder // if set, records Events on the ConfigMaps acted for
	// MayAct, if set, is asked before every write: a leader whose lease
	// may have lapsed must not act.
	MayAct func() bool
	// Pods, if set, returns the live pod index of a namespace (nil for
	// none); a round then restarts the pods it selects at once and sweeps
	// with a LIST afterwards (sweep.go).
	Pods func(namespace string) PodIndex
	// Annotated, if set, is told when a namespace gains its first existing
	// annotated ConfigMap (true) and loses its last (false). It is called
	// with the controller's lock held: it must not block or call back.
	Annotated func(namespace string, annotated bool)
}

// EventRecorder records a Kubernetes Event; it must not block.
type EventRecorder interface {
	Event(obj events.Object, typ, reason, message string)
}

// API is the slice of the API client the controller acts through.
type API interface {
	Get(ctx context.Context, path string, query url.Values, accept string) ([]byte, error)
	Delete(ctx context.Context, path string, body []byte) ([]byte, error)
	Create(ctx context.Context, path string, body []byte) ([]byte, error)
	MergePatch(ctx context.Context, path string, patch []byte) ([]byte, error)
}

var _ API = (*apiclient.Client)(nil)

// Controller keeps what the watches of ConfigMaps show (ForNamespace gives
// each its handler) and runs the workers.
type Controller struct {
	cfg     Config
	api     API
	log     *slog.Logger
	metrics *Metrics
	queue   *queue
	// sweepWait bounds the sweep's wait for the index (defaultSweepWait;
	// shorter in tests, whose index has no watch to wait for).
	sweepWait time.Duration
	wavePoll  time.Duration // the wait between waves (shorter in tests)

	mu         sync.Mutex
	entries    map[string]*entry
	seq        uint64         // numbers events, to tell what a list did not see
	annotated  map[string]int // existing entries per namespace (Config.Annotated)
	tombstones []string       // deleted entries, oldest first, to bound them
	retries    map[string]backoff.BackOff
	all        *scope                 // the handler for a watch of every namespace
	gates      map[string]*sync.Mutex // per namespace: one wave at a time (waves.go)
	halted     map[string]*round      // halted rounds, by key

	// unsynced counts the scopes whose first list has not ended; synced is
	// closed when none is left. Workers wait for it (at most syncWait):
	// a start's adoption records would slow the initial lists down.
	unsynced   atomic.Int32
	synced     chan struct{}
	syncedOnce sync.Once
	released   atomic.Bool // see releaseAfterSync
}

// syncWait bounds the wait for the initial lists: one that keeps failing
// (RBAC, say) must not hold rounds elsewhere.
const syncWait = 10 * time.Second

var _ watch.Handler = (*scope)(nil)

// New returns a controller; Handle feeds it, Run acts.
func New(cfg Config, api API, log *slog.Logger, m *Metrics) *Controller {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = watch.DefaultBackOff
	}
	if cfg.Strategy == "" {
		cfg.Strategy = StrategyDelete
	}
	if cfg.MaxUnavailable == (Budget{}) {
		cfg.MaxUnavailable = Budget{Percent: 25}
	}
	if cfg.ProgressDeadline <= 0 {
		cfg.ProgressDeadline = 10 * time.Minute
	}
	c := &Controller{
		sweepWait: defaultSweepWait,
		wavePoll:  wavePoll,
		gates:     map[string]*sync.Mutex{},
		halted:    map[string]*round{},
		cfg:       cfg,
		api:       api,
		log:       log,
		metrics:   m,
		queue:     newQueue(func(n int) { m.QueueDepth.Set(float64(n)) }),
		entries:   map[string]*entry{},
		annotated: map[string]int{},
		retries:   map[string]backoff.BackOff{},
		synced:    make(chan struct{}),
	}
	c.all = &scope{c: c}
	return c
}

// scope is the watch.Handler of one ListWatcher: one namespace, or all of
// them (namespace ""). A list only speaks for the ConfigMaps of its scope.
type scope struct {
	c               *Controller
	namespace       string
	start           uint64 // seq when the current list began
	counted, listed bool   // in c.unsynced until its first list ends
}

// ForNamespace returns the handler for a ListWatcher of one namespace, or of
// all namespaces when namespace is "".
func (c *Controller) ForNamespace(namespace string) watch.Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.all
	if namespace != "" {
		s = &scope{c: c, namespace: namespace}
	}
	if !s.counted {
		s.counted = true
		c.unsynced.Add(1)
	}
	return s
}

func (s *scope) BeginList() {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.start = s.c.seq
}

// EndList: ConfigMaps of the scope that the complete list did not show were
// deleted while we were not watching; tombstones older than the list are
// forgotten.
func (s *scope) EndList() {
	c := s.c
	c.mu.Lock()
	for key, e := range c.entries {
		switch {
		case e.seen > s.start || (s.namespace != "" && e.cm.namespace != s.namespace):
		case e.exists:
			c.bury(e) // kept until the next list
		default:
			delete(c.entries, key)
		}
	}
	if s.counted && !s.listed {
		s.listed = true
		if c.unsynced.Add(-1) == 0 {
			c.syncedOnce.Do(func() { close(c.synced) })
		}
	}
	c.mu.Unlock()
	c.releaseAfterSync()
}

// releaseAfterSync returns the memory of the initial sync to the OS once
// every scope has listed and the first term's queue has run dry (at once on
// a standby, which queues nothing): the lists and the adoption records grow
// the heap to several times what is kept, and the runtime would return it
// only slowly (BENCHMARKS.md).
func (c *Controller) releaseAfterSync() {
	if c.released.Load() || c.unsynced.Load() > 0 || (c.mayAct() && (!c.queue.active() || !c.queue.idle())) {
		return
	}
	if c.released.CompareAndSwap(false, true) {
		debug.FreeOSMemory()
	}
}

func (s *scope) Handle(ev watch.Event) { s.c.Handle(ev) }

// Handle takes a ConfigMap event of any scope. It only records state and
// queues work.
func (c *Controller) Handle(ev watch.Event) {
	cm, err := parseConfigMap(ev.Object, c.cfg.SelectorAnnotation)
	if err != nil {
		c.metrics.SkippedObjects.Inc()
		c.log.Warn("skipping object", "type", string(ev.Type), "rv", ev.ResourceVersion, "err", err)
		return
	}
	switch {
	case ev.Type == watch.Deleted:
		c.forget(cm.key())
	case !cm.hasSelector:
		c.drop(cm.key()) // not (or no longer) ours: adopted afresh if it comes back
	case c.observe(cm):
		c.queue.Add(cm.key())
	}
}

// observe stores cm and reports whether it may need action.
func (c *Controller) observe(cm configMap) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := cm.key()
	e := c.entries[key]
	first := e == nil
	if first {
		e = &entry{}
		c.entries[key] = e
	}
	c.seq++
	e.seen = c.seq
	if e.cm.uid == cm.uid && cm.version != 0 && cm.version <= e.cm.version {
		// Replayed by a watch resumed from an earlier resourceVersion.
		c.setExists(e, true)
		return false
	}
	before := e.round
	e.apply(cm)
	if e.round != before {
		c.pruneHalted() // apply ended a round
	}
	if first && e.r.isZero() && !e.i.present() {
		// Nothing tells which data the pods run: adopt it as it is now.
		e.r, e.adopted = cm.hash, true
	}
	c.setExists(e, true)
	return e.decide(c.recordsOnServer()) != stepNothing
}

// drop forgets a ConfigMap that is not ours.
func (c *Controller) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.setExists(e, false)
		delete(c.entries, key)
	}
}

// forget turns a deleted ConfigMap's entry into a tombstone, so that one
// re-created under its name with other data is a change for its pods.
func (c *Controller) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || !e.exists {
		return
	}
	c.bury(e)
	c.tombstones = append(c.tombstones, key)
	for len(c.tombstones) > maxTombstones {
		old := c.tombstones[0]
		c.tombstones = c.tombstones[1:]
		if t := c.entries[old]; t != nil && !t.exists {
			delete(c.entries, old)
		}
	}
}

// maxTombstones bounds the memory of deleted ConfigMaps: a name re-created
// after this many other deletions is adopted, not acted on. (Generated
// names, as kustomize makes them, are never re-created.)
const maxTombstones = 1024

// bury makes e a tombstone and stops its round. c.mu must be held.
func (c *Controller) bury(e *entry) {
	c.setExists(e, false)
	e.round, e.last = nil, nil
	c.pruneHalted()
	c.seq++
	e.seen = c.seq
}

// recordsOnServer: R and I are written as annotations (else kept in memory).
func (c *Controller) recordsOnServer() bool { return c.cfg.RecordHash && !c.cfg.DryRun }

// setExists marks e as existing or deleted and keeps c.annotated. c.mu must
// be held.
func (c *Controller) setExists(e *entry, exists bool) {
	if e.exists == exists {
		return
	}
	e.exists = exists
	ns := e.cm.namespace
	if exists {
		c.annotated[ns]++
	} else {
		c.annotated[ns]--
	}
	n := c.annotated[ns]
	if n == 0 {
		delete(c.annotated, ns)
	}
	if c.cfg.Annotated != nil && (n == 0 || (n == 1 && exists)) { // the last lost, or the first gained
		c.cfg.Annotated(ns, exists)
	}
}

// Run works the queue until ctx is done, then gives rounds in flight
// ShutdownGrace to finish.
func (c *Controller) Run(ctx context.Context) {
	c.Lead(ctx, func() time.Duration { return c.cfg.ShutdownGrace })
}

// Lead works the queue until ctx is done, then stops taking work and gives
// rounds in flight grace() to finish before their requests are cancelled.
// It may be called again, one leadership term after another; meanwhile
// events still update the state, and each term begins by queueing every
// ConfigMap that needs action.
func (c *Controller) Lead(ctx context.Context, grace func() time.Duration) {
	actCtx, cancelAct := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelAct()
	c.queue.setPaused(false)
	c.enqueueAll()
	c.releaseAfterSync()
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() { c.work(actCtx) })
	}
	<-ctx.Done()
	c.queue.setPaused(true)
	stopAct := time.AfterFunc(grace(), cancelAct)
	defer stopAct.Stop()
	wg.Wait()
}

// enqueueAll queues every known ConfigMap that needs action, for a new
// leader: it may have stood by while changes were made (the queue takes
// nothing while no term runs).
func (c *Controller) enqueueAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.entries {
		if e.exists && e.decide(c.recordsOnServer()) != stepNothing {
			c.queue.Add(key) // lock order: c.mu, then the queue's
		}
	}
}

func (c *Controller) work(ctx context.Context) {
	if c.unsynced.Load() > 0 {
		select {
		case <-c.synced:
		case <-time.After(syncWait):
		case <-ctx.Done():
		}
	}
	for {
		key, ok := c.queue.Get()
		if !ok {
			return
		}
		result, after, err := c.reconcile(ctx, key)
		c.metrics.Reconciles.Inc(result)
		c.mu.Lock()
		c.pruneHalted()
		if err != nil {
			b, ok := c.retries[key]
			if !ok {
				b = c.cfg.NewBackOff()
				c.retries[key] = b
			}
			delay := watch.RetryDelay(b, err)
			c.mu.Unlock()
			c.log.Warn("round failed; will retry", "configmap", key, "retry_in", delay.Round(time.Millisecond), "err", err)
			c.queue.AddAfter(key, delay, true)
		} else {
			delete(c.retries, key)
			c.mu.Unlock()
			if after > 0 {
				c.queue.AddAfter(key, after, false) // replaces a retry due from an earlier failure
			} else {
				c.queue.Forget(key) // a retry due from an earlier failure would only look again
			}
		}
		c.queue.Done(key)
		c.releaseAfterSync()
	}
}

// Metrics of the controller.
type Metrics struct {
	Reconciles    *metrics.CounterVec
	PodDeletions  *metrics.CounterVec
	PodEvictions  *metrics.CounterVec
	WritesRefused *metrics.CounterVec
	RoundsHalted  *metrics.Gauge
	// ReplacementsNotReady counts finished rounds whose replacements were
	// not Ready ProgressDeadline after the last restart.
	ReplacementsNotReady *metrics.Counter
	InvalidSelectors     *metrics.Counter
	SkippedObjects       *metrics.Counter
	QueueDepth           *metrics.Gauge
}

// NewMetrics registers the controller's metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		Reconciles: r.NewCounterVec("config_watcher_reconciles_total", "ConfigMap reconciles, by result.", "result",
			resultRestarted, resultAdopted, resultUnchanged, resultRefused, resultError, resultGone, resultWaiting),
		PodDeletions: r.NewCounterVec("config_watcher_pod_deletions_total", "Pod deletions, by result; left: the pod changed and no longer needs the restart (relabelled out of the selector).", "result",
			"deleted", "not_found", "conflict", "left", "error", "dry_run"),
		PodEvictions: r.NewCounterVec("config_watcher_pod_evictions_total", "Pod evictions (RESTART_STRATEGY=evict), by result; blocked: a disruption budget refused it (tried again in the next wave).", "result",
			"evicted", "not_found", "conflict", "left", "blocked", "error", "dry_run"),
		RoundsHalted:         r.NewGauge("config_watcher_rounds_halted", "Rounds halted: no restart possible for PROGRESS_DEADLINE (each also a RolloutHalted Warning Event)."),
		ReplacementsNotReady: r.NewCounter("config_watcher_replacements_not_ready_total", "Finished rounds whose replacements were not Ready PROGRESS_DEADLINE after the last restart (each also a ReplacementsNotReady Warning Event)."),
		WritesRefused: r.NewCounterVec("config_watcher_writes_refused_total", "Writes refused by RBAC or an admission policy (each also a Warning Event and retried), by resource.", "resource",
			"configmaps", "pods", "pods/eviction"),
		InvalidSelectors: r.NewCounter("config_watcher_invalid_selectors_total", "Rounds refused because the ConfigMap's selector is invalid or too broad."),
		SkippedObjects:   r.NewCounter("config_watcher_skipped_objects_total", "Watched objects that could not be read and were skipped."),
		QueueDepth:       r.NewGauge("config_watcher_workqueue_depth", "ConfigMaps waiting for a worker."),
	}
}
