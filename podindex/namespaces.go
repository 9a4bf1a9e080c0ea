package podindex

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/watch"
)

// Namespaces indexes the pods of only the namespaces that hold an annotated
// ConfigMap, one list + watch each, so that a controller watching the whole
// cluster keeps the pods a selector can match and not every pod there is.
// A namespace without an index is not a gap: its rounds list pods first.
//
// It is told which namespaces to cover by Annotated (policy's
// Config.Annotated). A namespace that loses its last annotated ConfigMap
// keeps its index for Linger, so that a ConfigMap deleted and created again
// (kustomize's configMapGenerator renames on every change) does not relist.
type Namespaces struct {
	cfg NamespacesConfig
	log *slog.Logger

	mu sync.Mutex
	// ctx is Run's, nil before Run; indexes wanted before are started by Run.
	ctx context.Context
	// stopped is set when Run stops: no loop starts after, so that none is
	// added to wg while Run waits for it.
	stopped bool
	wg      sync.WaitGroup
	covered map[string]*covered
	// unlisted counts the running indexes whose first list has not ended.
	unlisted int
}

// Watcher is the list + watch loop that feeds one namespace's index (a
// *watch.ListWatcher).
type Watcher interface {
	Run(ctx context.Context) error
	// Watching reports that the stream is open now (watch.ListWatcher's).
	Watching() bool
}

var _ Watcher = (*watch.ListWatcher)(nil)

// Timer is what AfterFunc returns (a *time.Timer).
type Timer interface{ Stop() bool }

// NamespacesConfig configures Namespaces. Watch is required.
type NamespacesConfig struct {
	// Watch makes the loop that feeds h with the pods of namespace.
	Watch func(namespace string, h watch.Handler) Watcher
	// Linger is how long an index outlives its namespace's last annotated
	// ConfigMap (30 s).
	Linger time.Duration
	// AfterFunc schedules the end of a lingering index (time.AfterFunc).
	AfterFunc func(d time.Duration, f func()) Timer
	// Indexed, if set, is told how many namespaces have an index, on every
	// change (it is called with a lock held and must not block).
	Indexed func(namespaces int)
	// FreeOSMemory returns freed memory to the OS (debug.FreeOSMemory).
	FreeOSMemory func()
}

// DefaultLinger is NamespacesConfig.Linger's default: long enough for a
// deploy tool to delete a ConfigMap and create its successor.
const DefaultLinger = 30 * time.Second

// covered is the index of one namespace.
type covered struct {
	*Index
	ns     *Namespaces
	name   string
	w      Watcher
	cancel context.CancelFunc // nil until started
	listed bool               // its first list has ended
	// lingering is set from the loss of the namespace's last annotated
	// ConfigMap until a new one arrives or the index stops; gen tells a
	// timer that fired late from the current one.
	lingering bool
	timer     Timer
	gen       uint64
}

// NewNamespaces returns an empty set of indexes; call Run to start them.
// log may be nil (slog's default).
func NewNamespaces(cfg NamespacesConfig, log *slog.Logger) *Namespaces {
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	if cfg.FreeOSMemory == nil {
		cfg.FreeOSMemory = debug.FreeOSMemory
	}
	if log == nil {
		log = slog.Default()
	}
	return &Namespaces{cfg: cfg, log: log, covered: map[string]*covered{}}
}

// Run starts the indexes wanted so far and those wanted later, until ctx
// is done; then it waits for their loops to return.
func (n *Namespaces) Run(ctx context.Context) {
	n.mu.Lock()
	n.ctx = ctx
	for ns, c := range n.covered {
		n.start(ns, c)
	}
	n.mu.Unlock()
	<-ctx.Done()
	n.mu.Lock()
	n.stopped = true
	n.mu.Unlock()
	n.wg.Wait()
}

// Annotated starts the index of namespace when it gains its first
// annotated ConfigMap, and schedules its end when it loses its last one. It
// never blocks (policy calls it with its lock held).
func (n *Namespaces) Annotated(namespace string, annotated bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.covered[namespace]
	switch {
	case annotated && c == nil:
		c = &covered{Index: New(n.log), ns: n, name: namespace}
		c.w = n.cfg.Watch(namespace, c)
		n.covered[namespace] = c
		n.log.Info("pod index: indexing namespace", "namespace", namespace)
		if n.ctx != nil {
			n.start(namespace, c)
		}
		n.report()
	case annotated && c.lingering:
		c.lingering = false
		c.gen++
		c.timer.Stop()
	case !annotated && c != nil && !c.lingering:
		c.lingering = true
		c.gen++
		gen := c.gen
		c.timer = n.cfg.AfterFunc(n.cfg.Linger, func() { n.expire(namespace, c, gen) })
	}
}

// expire stops the index of namespace if it still lingers as of gen.
func (n *Namespaces) expire(namespace string, c *covered, gen uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.covered[namespace] != c || !c.lingering || c.gen != gen {
		return
	}
	delete(n.covered, namespace)
	if c.cancel != nil {
		c.cancel()
		if !c.listed {
			n.unlisted--
		}
	}
	n.log.Info("pod index: no annotated ConfigMap left; stopped indexing namespace", "namespace", namespace)
	n.report()
}

// start runs c's loop. n.mu must be held and n.ctx set.
func (n *Namespaces) start(namespace string, c *covered) {
	if c.cancel != nil || n.stopped {
		return
	}
	ctx, cancel := context.WithCancel(n.ctx)
	c.cancel = cancel
	n.unlisted++
	n.wg.Go(func() {
		if err := c.w.Run(ctx); err != nil && ctx.Err() == nil {
			n.log.Error("pod index: watch loop ended", "namespace", namespace, "err", err)
		}
	})
}

func (n *Namespaces) report() {
	if n.cfg.Indexed != nil {
		n.cfg.Indexed(len(n.covered))
	}
}

// EndList implements watch.Handler: the Index's, and once every index
// started so far has listed, the memory the lists took goes back to the OS
// (the runtime would return it only slowly, and the heap after a few lists
// of pages is several times what the indexes keep).
func (c *covered) EndList() {
	c.Index.EndList()
	n := c.ns
	n.mu.Lock()
	release := false
	if !c.listed && n.covered[c.name] == c {
		c.listed = true
		n.unlisted--
		release = n.unlisted == 0
	}
	n.mu.Unlock()
	if release {
		n.cfg.FreeOSMemory()
	}
}

// Cover returns the index of namespace if it can answer for it now: the
// namespace holds (or held moments ago) an annotated ConfigMap, its first
// list has ended and its watch stream is open. Otherwise nil, and the round
// lists pods first.
func (n *Namespaces) Cover(namespace string) *Index {
	n.mu.Lock()
	c := n.covered[namespace]
	n.mu.Unlock()
	if c == nil || !c.w.Watching() {
		return nil
	}
	return c.Index
}

// Len returns the number of pods indexed over all namespaces.
func (n *Namespaces) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	total := 0
	for _, c := range n.covered {
		total += c.Index.Len()
	}
	return total
}
