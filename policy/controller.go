package policy

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/internal/retrylog"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/selector"
)

// Config of the controller. internal/app passes every field from the settings,
// whose defaults are in internal/app/config.go (and --help). New guards the zero values
// that would stop the controller (no worker, a budget of no pod, a deadline
// already past) with the same defaults, for tests; other zero values mean
// what they say.
type Config struct {
	SelectorAnnotation string // holds the pod label selector on a ConfigMap or Secret
	// DigestKey keys the digests of Secret data (secret.go). It is set,
	// MinDigestKey bytes or more, exactly when Secrets are watched
	// (ForSecrets): without it, no ConfigMap is taken for a Secret's state.
	DigestKey []byte
	// RecordHash writes R and I on the ConfigMaps. Without it (read-only
	// RBAC) they live in memory: changes made while the controller was
	// down are adopted, not acted on.
	RecordHash bool
	// OwnPod is never restarted, nor any pod of its owner (consent.go).
	OwnPod OwnPod
	// PodOptIn, if set, is required of every selected pod besides the
	// object's selector (POD_OPT_IN_LABEL): a workload consents where it
	// is defined.
	PodOptIn *selector.Selector
	// Namespaces, if set, are the namespaces that opted in
	// (NAMESPACE_SELECTOR under WATCH_NAMESPACE=*): objects elsewhere are
	// ignored.
	Namespaces *NamespaceConsent
	Workers    int // ConfigMaps and Secrets reconciled at once (4)
	// ShutdownGrace bounds how long rounds in flight may run once the
	// controller is told to stop (SHUTDOWN_TIMEOUT); 0: they are cut at
	// once.
	ShutdownGrace time.Duration
	NewBackOff    func() backoff.BackOff // retry policy of failed rounds
	Strategy      string                 // StrategyDelete (or "") or StrategyEvict
	// MaxUnavailable is the budget of a round's waves (waves.go; 25%).
	MaxUnavailable Budget
	// MinReadySeconds: a pod counts as available once Ready for this long
	// (budget.go; 0).
	MinReadySeconds time.Duration
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
	Events EventRecorder // if set, records Events on the ConfigMaps and Secrets acted for
	// MayAct, if set, is asked right before every write (current): a
	// leader whose lease may have lapsed must not act.
	MayAct func() bool
	// Pods, if set, is the live pod index of the namespaces that hold
	// annotated objects: rounds there decide from it, woken by its pods'
	// changes, and bound their membership by it (sweep.go).
	Pods PodIndexes
	// StormChanges: more data changes of one object than this within
	// StormWindow are a storm (storm.go); 0: no storm guard.
	StormChanges int
	StormWindow  time.Duration
	// MaxRestartsPerSecond caps the restart requests of every round
	// together, with a burst of ten times as many; 0: no cap.
	MaxRestartsPerSecond int
	// Settle: a round's first restart waits until no annotated object
	// selecting any of its pods has changed for this long (settle.go); 0:
	// at once.
	Settle time.Duration
	// Stall, if set, is how long a round's worker is held up before each
	// wave reads its pods, site naming the round: the simulator's stand-in
	// for a loaded machine, on which any goroutine may be late (its seed
	// draws the delays). Unset in the program: never.
	Stall func(site string) time.Duration
}

// EventRecorder records a Kubernetes Event; it must not block.
type EventRecorder interface {
	Event(obj events.Object, typ, reason, message string)
}

// API is the slice of the API client the controller acts through.
type API interface {
	GetBody(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error)
	Delete(ctx context.Context, path string, body []byte) ([]byte, error)
	Create(ctx context.Context, path string, body []byte) ([]byte, error)
	MergePatch(ctx context.Context, path string, patch []byte) ([]byte, error)
}

var _ API = (*apiclient.Client)(nil)

// Controller keeps what the watches of ConfigMaps and Secrets show
// (ForConfigMaps and ForSecrets give each its handler) and runs the workers.
type Controller struct {
	cfg     Config
	api     API
	log     *slog.Logger
	metrics *Metrics
	// failures logs failed rounds once per cause, then how often they
	// repeat (internal/retrylog).
	failures *retrylog.Log
	queue    *queue
	// sweepWait bounds the sweep's wait for the index (defaultSweepWait;
	// shorter in tests, whose index has no watch to wait for).
	sweepWait time.Duration
	// catchUpWait bounds a wait for the index or for an answer that only
	// sharpens a decision (defaultCatchUpWait; longer in tests that show a
	// decision needs no wait).
	catchUpWait time.Duration
	wavePoll    time.Duration // the wait between waves (shorter in tests)
	// replacedWait bounds the wait for the event that explains a 404 or
	// 409 on a write of the state (defaultReplacedWait).
	replacedWait time.Duration

	keyID string // of cfg.DigestKey

	mu      sync.Mutex
	entries map[string]*entry
	// states holds what the state ConfigMaps show, by their Secret's key:
	// it outlives the Secret's entry (a selector removed and put back).
	states     map[string]*stateSeen
	seq        uint64         // numbers events, to tell what a list did not see
	annotated  map[string]int // existing entries per namespace (told to Config.Pods.Annotated)
	tombstones []string       // deleted entries, oldest first, to bound them
	retries    map[string]backoff.BackOff
	// relisting are the namespaces that opted in again (namespaceJoining)
	// whose objects some watched kind has not listed since: a change of
	// one of them is not known yet, and no round there decides (vouched);
	// their state ConfigMaps' views are kept meanwhile, their Secrets to
	// come.
	relisting map[string]*relist
	// viewWaits are the keys that wait for the views their consent and
	// selection are decided on (waitForViews), queued again when a watch
	// streams.
	viewWaits  map[string]bool
	all        [2]*scope                   // by kind: the handler for a watch of every namespace
	namespaced [2]map[string]*scope        // by kind: the handlers of watches of one namespace
	budgets    map[string]*namespaceBudget // per namespace: what its rounds share (budget.go)
	owners     *owners                     // the desired replicas of pods' owners (owners.go)
	halted     map[string]*round           // halted rounds, by key
	storms     map[string]bool             // objects in a storm, by key (storm.go)
	markers    map[string]*marker          // by namespace: marks whose LIST is not sent yet (mark.go)
	begun      map[string][]*round         // by namespace: rounds begun, some maybe over since (mark.go roundIn)
	// acting is the context of the requests of the current term (Lead),
	// nil while no term runs: marks are sent only while this replica acts.
	acting context.Context
	// restartTokens paces every restart request (nil: no cap).
	restartTokens *tokenBucket

	// changed, made when someone waits (waitFor), is closed at the next
	// event.
	changed chan struct{}

	// unsynced counts the scopes whose first list has not ended; synced is
	// closed when none is left. Workers wait for it (at most syncWait):
	// a start's adoption records would slow the initial lists down.
	unsynced   atomic.Int32
	synced     chan struct{}
	syncedOnce sync.Once
	released   atomic.Bool // see releaseAfterSync
	// moment orders what the controller saw against what it sent: a
	// change seen takes the next value (entry.seenAt), and so does each
	// DELETE before it is sent (namespaceBudget.deletions). Pod revisions
	// and ConfigMap revisions are never compared; these are compared
	// instead.
	moment     atomic.Uint64
	opaqueSaid atomic.Bool // see sayOpaque
}

// New returns a controller; the handlers of ForConfigMaps and ForSecrets
// feed it, Run acts.
func New(cfg Config, api API, log *slog.Logger, m *Metrics) *Controller {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = apiclient.DefaultBackOff
	}
	if cfg.MaxUnavailable == (Budget{}) {
		cfg.MaxUnavailable = Budget{Percent: 25}
	}
	if cfg.ProgressDeadline <= 0 {
		cfg.ProgressDeadline = 10 * time.Minute
	}
	c := &Controller{
		sweepWait:    defaultSweepWait,
		catchUpWait:  defaultCatchUpWait,
		wavePoll:     wavePoll,
		replacedWait: defaultReplacedWait,
		budgets:      map[string]*namespaceBudget{},
		owners:       newOwners(api),
		halted:       map[string]*round{},
		storms:       map[string]bool{},
		markers:      map[string]*marker{},
		begun:        map[string][]*round{},
		cfg:          cfg,
		api:          api,
		log:          log,
		failures:     retrylog.New(log, 0, nil),
		metrics:      m,
		queue:        newQueue(func(n int) { m.QueueDepth.Set(float64(n)) }),
		entries:      map[string]*entry{},
		states:       map[string]*stateSeen{},
		relisting:    map[string]*relist{},
		namespaced:   [2]map[string]*scope{{}, {}},
		keyID:        keyID(cfg.DigestKey),
		annotated:    map[string]int{},
		retries:      map[string]backoff.BackOff{},
		viewWaits:    map[string]bool{},
		synced:       make(chan struct{}),
	}
	if cfg.MaxRestartsPerSecond > 0 {
		c.restartTokens = newTokenBucket(cfg.MaxRestartsPerSecond, 10*cfg.MaxRestartsPerSecond)
	}
	c.all = [2]*scope{{c: c, kind: kindConfigMap}, {c: c, kind: kindSecret}}
	if cfg.Pods != nil {
		cfg.Pods.OnChange(c.podChanged)
	}
	if cfg.Namespaces != nil {
		cfg.Namespaces.onVouched(c.consentVouched)
		cfg.Namespaces.onJoining(c.namespaceJoining)
	}
	return c
}

// notify wakes whoever waits for an event.
func (c *Controller) notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// stall holds the calling goroutine for d (Config.Stall), or until ctx is
// done.
func (c *Controller) stall(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// waitFor evaluates cond under c.mu, again after each event, until it
// holds (true), wait has passed or ctx is done (false).
func (c *Controller) waitFor(ctx context.Context, wait time.Duration, cond func() bool) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		c.mu.Lock()
		ok := cond()
		if !ok && c.changed == nil {
			c.changed = make(chan struct{})
		}
		changed := c.changed
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// recordsOnServer: R and I are written as annotations (else kept in memory).
func (c *Controller) recordsOnServer() bool { return c.cfg.RecordHash && !c.cfg.DryRun }

// Metrics of the controller.
type Metrics struct {
	Reconciles    *metrics.CounterVec
	PodDeletions  *metrics.CounterVec
	PodEvictions  *metrics.CounterVec
	WritesRefused *metrics.CounterVec
	RoundsHalted  *metrics.Gauge
	// ObjectsInStorm counts objects whose data changes faster than the
	// storm guard lets rounds begin (storm.go).
	ObjectsInStorm *metrics.Gauge
	// ReplacementsNotReady counts finished rounds whose replacements were
	// not Ready ProgressDeadline after the last restart.
	ReplacementsNotReady *metrics.Counter
	InvalidSelectors     *metrics.Counter
	// OwnerReadsFailed counts rounds that could not read an owner's
	// desired replicas, and estimated them or, unanswered, waited.
	OwnerReadsFailed *metrics.CounterVec
	SkippedObjects   *metrics.Counter
	// StateUntrusted counts views of Secrets' state ConfigMaps ignored
	// as not written by this controller under its key.
	StateUntrusted *metrics.Counter
	QueueDepth     *metrics.Gauge
	// ChangeToFirstRestart is the time from a data change seen (the watch
	// event or list item that showed data other than the record) to the
	// first restart of its round the API server accepted.
	ChangeToFirstRestart *metrics.Histogram
	// ChangeToRecord is the time from the same moment to the record of
	// the change (restarted-for) the API server accepted: the round done.
	ChangeToRecord *metrics.Histogram
}

// changeBuckets bound the histograms of a change's way to its pods (in
// seconds): from 5 ms, a first restart from the pod index, through the
// ~100 ms of a list first and the seconds of waves that wait for Ready pods,
// to the 10 min of PROGRESS_DEADLINE and an hour of a halted round going on.
var changeBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// NewMetrics registers the controller's metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		Reconciles: r.NewCounterVec("config_watcher_reconciles_total", "Reconciles of annotated ConfigMaps and Secrets, by result.", "result",
			resultRestarted, resultAdopted, resultUnchanged, resultRefused, resultError, resultGone, resultWaiting, resultNotOptedIn),
		PodDeletions: r.NewCounterVec("config_watcher_pod_deletions_total", "Pod deletions, by result; left: the pod changed and no longer needs the restart (relabelled out of the selector).", "result",
			"deleted", "not_found", "conflict", "left", "error", "dry_run"),
		PodEvictions: r.NewCounterVec("config_watcher_pod_evictions_total", "Pod evictions (RESTART_STRATEGY=evict), by result; blocked: a disruption budget refused it (tried again in the next wave).", "result",
			"evicted", "not_found", "conflict", "left", "blocked", "error", "dry_run"),
		RoundsHalted:         r.NewGauge("config_watcher_rounds_halted", "Rounds halted: no restart possible for PROGRESS_DEADLINE (each also a RolloutHalted Warning Event)."),
		ObjectsInStorm:       r.NewGauge("config_watcher_objects_in_storm", "Objects in a change storm: more than STORM_CHANGES data changes within STORM_WINDOW; their pods are restarted at most once per STORM_WINDOW (each storm also a ChangeStorm Warning Event)."),
		ReplacementsNotReady: r.NewCounter("config_watcher_replacements_not_ready_total", "Finished rounds whose replacements were not Ready PROGRESS_DEADLINE after the last restart (each also a ReplacementsNotReady Warning Event)."),
		WritesRefused: r.NewCounterVec("config_watcher_writes_refused_total", "Writes refused by RBAC or an admission policy (each also a Warning Event and retried), by resource (a Secret's state is written on configmaps).", "resource",
			"configmaps", "pods", "pods/eviction"),
		OwnerReadsFailed: r.NewCounterVec("config_watcher_owner_reads_failed_total", "Rounds that could not read the desired replicas of a pod's owner (its scale subresource) and counted the most of its pods seen instead, by cause (each also an ExpectedPodsEstimated Event); unanswered: a read got no answer that tells, and no pod that needs the budget went until one did (an ExpectedPodsUnknown Event).", "result",
			"no_scale", "forbidden", "error", "unanswered"),
		InvalidSelectors: r.NewCounter("config_watcher_invalid_selectors_total", "Rounds refused because the selector of a ConfigMap or Secret is invalid or too broad, or its restartReferencingPods is neither true nor false."),
		SkippedObjects:   r.NewCounter("config_watcher_skipped_objects_total", "Watched objects that could not be read and were skipped."),
		StateUntrusted:   r.NewCounter("config_watcher_state_untrusted_total", "Views of Secrets' state ConfigMaps ignored as not written by this controller under its digest key (forged, another key, no MAC), each also a StateUntrusted Warning Event."),
		QueueDepth:       r.NewGauge("config_watcher_workqueue_depth", "ConfigMaps and Secrets waiting for a worker."),
		ChangeToFirstRestart: r.NewHistogram("config_watcher_change_to_first_restart_seconds",
			"Seconds from a data change seen to the first restart of its round accepted by the API server.", changeBuckets),
		ChangeToRecord: r.NewHistogram("config_watcher_change_to_record_seconds",
			"Seconds from a data change seen to its record (restarted-for) accepted by the API server: the round done.", changeBuckets),
	}
}

// Sizes returns how many entries each of the controller's tables holds.
// It only reads: the simulator checks that they stay bounded by the
// cluster, not by how long the controller has run.
func (c *Controller) Sizes() map[string]int {
	c.mu.Lock()
	s := map[string]int{"entries": len(c.entries), "states": len(c.states), "annotated": len(c.annotated), "tombstones": len(c.tombstones),
		"retries": len(c.retries), "scopes": len(c.namespaced[0]) + len(c.namespaced[1]), "budgets": len(c.budgets), "halted": len(c.halted),
		"storms": len(c.storms), "markers": len(c.markers)}
	budgets := make([]*namespaceBudget, 0, len(c.budgets))
	for _, b := range c.budgets {
		budgets = append(budgets, b)
	}
	c.mu.Unlock()
	inFlight := 0
	for _, b := range budgets {
		b.mu.Lock()
		inFlight += len(b.inFlight)
		b.mu.Unlock()
	}
	s["in flight"] = inFlight
	c.owners.mu.Lock()
	s["owner scales"], s["owner discovery"], s["owner rounds"] = len(c.owners.scales), len(c.owners.discovery), len(c.owners.asked)
	c.owners.mu.Unlock()
	c.queue.mu.Lock()
	s["queue"] = len(c.queue.dirty) + len(c.queue.processing) + len(c.queue.timers) + len(c.queue.retrying)
	c.queue.mu.Unlock()
	return s
}
