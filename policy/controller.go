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
	SelectorAnnotation string // holds the pod label selector on a ConfigMap or Secret
	// DigestKey keys the digests of Secret data (secret.go); it must be
	// set, MinDigestKey bytes or more, for ForSecrets.
	DigestKey []byte
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
	// Pods, if set, is the live pod index of the namespaces that hold
	// annotated objects: a round then restarts the pods it selects at once
	// and sweeps with a LIST afterwards (sweep.go).
	Pods PodIndexes
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

// Controller keeps what the watches of ConfigMaps and Secrets show
// (ForNamespace and ForSecrets give each its handler) and runs the workers.
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

	keyID string // of cfg.DigestKey

	mu      sync.Mutex
	entries map[string]*entry
	// states holds what the state ConfigMaps show, by their Secret's key:
	// it outlives the Secret's entry (a selector removed and put back).
	states     map[string]*stateSeen
	seq        uint64         // numbers events, to tell what a list did not see
	annotated  map[string]int // existing entries per namespace (Config.Annotated)
	tombstones []string       // deleted entries, oldest first, to bound them
	retries    map[string]backoff.BackOff
	all        [2]*scope              // by kind: the handler for a watch of every namespace
	configMaps map[string]*scope      // the handlers of ConfigMap watches of one namespace
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
		sweepWait:  defaultSweepWait,
		wavePoll:   wavePoll,
		gates:      map[string]*sync.Mutex{},
		halted:     map[string]*round{},
		cfg:        cfg,
		api:        api,
		log:        log,
		metrics:    m,
		queue:      newQueue(func(n int) { m.QueueDepth.Set(float64(n)) }),
		entries:    map[string]*entry{},
		states:     map[string]*stateSeen{},
		configMaps: map[string]*scope{},
		keyID:      keyID(cfg.DigestKey),
		annotated:  map[string]int{},
		retries:    map[string]backoff.BackOff{},
		synced:     make(chan struct{}),
	}
	c.all = [2]*scope{{c: c, kind: kindConfigMap}, {c: c, kind: kindSecret}}
	return c
}

// stateSeen is a state ConfigMap's latest view.
type stateSeen struct {
	namespace string
	st        stored
	seen      uint64 // sequence number of its last event
}

// scope is the watch.Handler of one ListWatcher: of ConfigMaps or Secrets,
// in one namespace or all of them (namespace ""). A list only speaks for the
// objects of its scope.
type scope struct {
	c               *Controller
	kind            kind
	namespace       string
	start           uint64 // seq when the current list began
	counted, listed bool   // in c.unsynced until its first list ends
}

func (s *scope) covers(namespace string) bool { return s.namespace == "" || s.namespace == namespace }

// ForNamespace returns the handler for a ListWatcher of the ConfigMaps of
// one namespace, or of all namespaces when namespace is "".
func (c *Controller) ForNamespace(namespace string) watch.Handler {
	return c.forScope(kindConfigMap, namespace)
}

// ForSecrets returns the handler for a ListWatcher of the Secrets of one
// namespace, or of all namespaces when namespace is "". Their state lives
// in ConfigMaps (secret.go): the ConfigMaps of the same namespaces must be
// watched too.
func (c *Controller) ForSecrets(namespace string) watch.Handler {
	return c.forScope(kindSecret, namespace)
}

func (c *Controller) forScope(k kind, namespace string) watch.Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.all[k]
	if namespace != "" {
		s = &scope{c: c, kind: k, namespace: namespace}
		if k == kindConfigMap {
			c.configMaps[namespace] = s
		}
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

// EndList: objects of the scope that the complete list did not show were
// deleted while we were not watching; tombstones older than the list are
// forgotten. A list of ConfigMaps tells the state of the scope's Secrets.
func (s *scope) EndList() {
	c := s.c
	c.mu.Lock()
	for key, e := range c.entries {
		switch {
		case e.obj.kind != s.kind || e.seen > s.start || !s.covers(e.obj.namespace):
		case e.exists:
			c.bury(e) // kept until the next list
		default:
			delete(c.entries, key)
		}
	}
	first := !s.listed
	s.listed = true
	if s.kind == kindConfigMap {
		c.statesListed(s)
	}
	if s.counted && first {
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

func (s *scope) Handle(ev watch.Event) { s.c.handle(s.kind, ev) }

// Handle takes a ConfigMap event of any scope.
func (c *Controller) Handle(ev watch.Event) { c.handle(kindConfigMap, ev) }

// handle takes an event of any scope. It only records state and queues
// work.
func (c *Controller) handle(k kind, ev watch.Event) {
	obj, err := parseObject(ev.Object, k, c.cfg.SelectorAnnotation, c.cfg.DigestKey)
	if err != nil {
		c.metrics.SkippedObjects.Inc()
		c.log.Warn("skipping object", "kind", k.String(), "type", string(ev.Type), "rv", ev.ResourceVersion, "err", err)
		return
	}
	switch {
	case obj.stateOf != "" && obj.name == stateName(obj.stateOf):
		c.observeState(obj, ev.Type == watch.Deleted)
	case ev.Type == watch.Deleted:
		c.forget(obj.key())
	case !obj.hasSelector:
		c.drop(obj.key()) // not (or no longer) ours: adopted afresh if it comes back
	case c.observe(obj):
		c.queue.Add(obj.key())
	}
}

// observe stores obj and reports whether it may need action.
func (c *Controller) observe(obj object) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := obj.key()
	e := c.entries[key]
	first := e == nil
	if first {
		e = &entry{}
		c.entries[key] = e
	}
	c.seq++
	e.seen = c.seq
	if e.obj.uid == obj.uid && obj.version != 0 && obj.version <= e.obj.version {
		// Replayed by a watch resumed from an earlier resourceVersion.
		c.setExists(e, true)
		return false
	}
	if obj.kind == kindSecret {
		// Its state is what the entry holds, or, new, what its state
		// ConfigMap shows.
		obj.stored = e.obj.stored
		if first {
			obj.stored = c.stateOf(obj.key(), obj.namespace)
		}
	}
	c.takeView(e, obj)
	c.setExists(e, true)
	return e.decide(c.recordsOnServer()) != stepNothing
}

// takeView applies a view of the object to its entry, and adopts the data
// if nothing tells which the pods run. c.mu must be held.
func (c *Controller) takeView(e *entry, obj object) {
	before := e.round
	e.apply(obj)
	if e.round != before {
		c.pruneHalted() // apply ended a round
	}
	if e.obj.stored.known && e.r.isZero() && !e.i.present() {
		// Nothing tells which data the pods run: adopt it as it is now.
		e.r, e.adopted = e.obj.hash, true
	}
}

// stateOf returns a Secret's state as its state ConfigMap shows it: none if
// there is none, unknown until its namespace's ConfigMaps were listed.
// c.mu must be held.
func (c *Controller) stateOf(key, namespace string) stored {
	if s := c.states[key]; s != nil {
		return s.st
	}
	s := c.configMaps[namespace]
	if s == nil {
		s = c.all[kindConfigMap]
	}
	return stored{known: s.listed}
}

// observeState takes a state ConfigMap's view (deleted: it is gone) to its
// Secret's entry.
func (c *Controller) observeState(obj object, deleted bool) {
	key := keyOf(kindSecret, obj.namespace, obj.stateOf)
	st := c.fromStateConfigMap(obj)
	if obj.keyID != c.keyID && !deleted && !obj.stored.recorded.isZero() {
		c.log.Warn("the state of this Secret was written under another digest key: its data is adopted as it is now",
			"namespace", obj.namespace, "secret", obj.stateOf, "state_configmap", obj.name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if s := c.states[key]; s != nil && !deleted && st.version != 0 && st.version <= s.st.version {
		s.seen = c.seq // replayed by a resumed watch
		return
	}
	if deleted {
		st = stored{known: true} // a wipe: R stays in memory, I is written again
		delete(c.states, key)
	} else {
		c.states[key] = &stateSeen{namespace: obj.namespace, st: st, seen: c.seq}
	}
	c.takeState(key, st)
}

// takeState applies a Secret's state, as now known, to its entry and queues
// it if it may need action. c.mu must be held.
func (c *Controller) takeState(key string, st stored) {
	e := c.entries[key]
	if e == nil || !e.exists {
		return
	}
	view := e.obj
	view.stored = st
	c.takeView(e, view)
	if e.decide(c.recordsOnServer()) != stepNothing {
		c.queue.Add(key) // lock order: c.mu, then the queue's
	}
}

// statesListed: a complete list of scope s's ConfigMaps tells the state of
// its Secrets: state ConfigMaps it did not show are gone. c.mu must be held.
func (c *Controller) statesListed(s *scope) {
	gone := map[string]bool{}
	for key, st := range c.states {
		if st.seen <= s.start && s.covers(st.namespace) {
			delete(c.states, key)
			gone[key] = true
		}
	}
	for key, e := range c.entries {
		if e.obj.kind == kindSecret && s.covers(e.obj.namespace) && (!e.obj.stored.known || gone[key]) {
			c.takeState(key, c.stateOf(key, e.obj.namespace))
		}
	}
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
	ns := e.obj.namespace
	if exists {
		c.annotated[ns]++
	} else {
		c.annotated[ns]--
	}
	n := c.annotated[ns]
	if n == 0 {
		delete(c.annotated, ns)
	}
	if c.cfg.Pods != nil && (n == 0 || (n == 1 && exists)) { // the last lost, or the first gained
		c.cfg.Pods.Annotated(ns, exists)
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
			c.log.Warn("round failed; will retry", "key", key, "retry_in", delay.Round(time.Millisecond), "err", err)
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
		Reconciles: r.NewCounterVec("config_watcher_reconciles_total", "Reconciles of annotated ConfigMaps and Secrets, by result.", "result",
			resultRestarted, resultAdopted, resultUnchanged, resultRefused, resultError, resultGone, resultWaiting),
		PodDeletions: r.NewCounterVec("config_watcher_pod_deletions_total", "Pod deletions, by result; left: the pod changed and no longer needs the restart (relabelled out of the selector).", "result",
			"deleted", "not_found", "conflict", "left", "error", "dry_run"),
		PodEvictions: r.NewCounterVec("config_watcher_pod_evictions_total", "Pod evictions (RESTART_STRATEGY=evict), by result; blocked: a disruption budget refused it (tried again in the next wave).", "result",
			"evicted", "not_found", "conflict", "left", "blocked", "error", "dry_run"),
		RoundsHalted:         r.NewGauge("config_watcher_rounds_halted", "Rounds halted: no restart possible for PROGRESS_DEADLINE (each also a RolloutHalted Warning Event)."),
		ReplacementsNotReady: r.NewCounter("config_watcher_replacements_not_ready_total", "Finished rounds whose replacements were not Ready PROGRESS_DEADLINE after the last restart (each also a ReplacementsNotReady Warning Event)."),
		WritesRefused: r.NewCounterVec("config_watcher_writes_refused_total", "Writes refused by RBAC or an admission policy (each also a Warning Event and retried), by resource (a Secret's state is written on configmaps).", "resource",
			"configmaps", "pods", "pods/eviction"),
		InvalidSelectors: r.NewCounter("config_watcher_invalid_selectors_total", "Rounds refused because the selector of a ConfigMap or Secret is invalid or too broad."),
		SkippedObjects:   r.NewCounter("config_watcher_skipped_objects_total", "Watched objects that could not be read and were skipped."),
		QueueDepth:       r.NewGauge("config_watcher_workqueue_depth", "ConfigMaps and Secrets waiting for a worker."),
	}
}
