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
// ConfigMap or Secret, as its Annotated is told (policy's Config.Pods), one list +
// watch each. A namespace without an index is no gap: its rounds list first.
type Namespaces struct {
	cfg NamespacesConfig
	log *slog.Logger

	mu      sync.Mutex
	ctx     context.Context // Run's; nil before Run, done once Run stops
	wg      sync.WaitGroup
	covered map[string]*covered
	// onChange is given to every index (OnChange).
	onChange func(namespace string, labels map[string]string)
}

// Timer is what AfterFunc returns (a *time.Timer).
type Timer interface{ Stop() bool }

// NamespacesConfig configures Namespaces. Watch and Indexed are required.
type NamespacesConfig struct {
	// Watch makes the loop that feeds h with the pods of namespace.
	Watch func(namespace string, h watch.Handler) *watch.ListWatcher
	// Indexed is told how many namespaces have an index, on every change
	// (with a lock held: it must not block).
	Indexed func(namespaces int)
	// AfterFunc schedules the end of a lingering index; nil: time.AfterFunc.
	AfterFunc func(d time.Duration, f func()) Timer
	// FreeOSMemory returns freed memory to the OS; nil: debug.FreeOSMemory.
	FreeOSMemory func()
}

// Linger is how long an index outlives its namespace's last annotated
// ConfigMap, so that one deleted and created again (kustomize's
// configMapGenerator renames on every change) does not relist.
const Linger = 30 * time.Second

// covered is the index of one namespace.
type covered struct {
	*Index
	ns     *Namespaces
	name   string
	w      *watch.ListWatcher
	cancel context.CancelFunc // nil until started
	listed bool               // its first list has ended
	// timer, while the namespace has no annotated object, ends the index;
	// gen tells a timer that fired late from the current one.
	timer Timer
	gen   uint64
}

// NewNamespaces returns an empty set of indexes; Run starts them.
func NewNamespaces(cfg NamespacesConfig, log *slog.Logger) *Namespaces {
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	if cfg.FreeOSMemory == nil {
		cfg.FreeOSMemory = debug.FreeOSMemory
	}
	return &Namespaces{cfg: cfg, log: log, covered: map[string]*covered{}}
}

// Run starts the indexes wanted so far and those wanted later, until ctx
// is done; then it waits for their loops to return.
func (n *Namespaces) Run(ctx context.Context) {
	n.mu.Lock()
	n.ctx = ctx
	for _, c := range n.covered {
		n.start(c)
	}
	n.mu.Unlock()
	<-ctx.Done()
	n.mu.Lock() // a start that saw ctx live has added to wg by now
	n.mu.Unlock()
	n.wg.Wait()
}

// Annotated starts the index of namespace when it gains its first
// annotated object, and schedules its end when it loses its last one. It
// never blocks (policy calls it with its lock held).
func (n *Namespaces) Annotated(namespace string, annotated bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.covered[namespace]
	switch {
	case annotated && c == nil:
		c = &covered{Index: New(n.log), ns: n, name: namespace}
		c.Index.OnChange(n.onChange)
		c.w = n.cfg.Watch(namespace, c)
		n.covered[namespace] = c
		n.log.Info("pod index: indexing namespace", "namespace", namespace)
		n.start(c)
		n.cfg.Indexed(len(n.covered))
	case annotated && c.timer != nil:
		c.timer.Stop()
		c.timer = nil
		c.gen++
	case !annotated && c != nil && c.timer == nil:
		c.gen++
		gen := c.gen
		c.timer = n.cfg.AfterFunc(Linger, func() { n.expire(c, gen) })
	}
}

// expire stops the index c if it still lingers as of gen.
func (n *Namespaces) expire(c *covered, gen uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.covered[c.name] != c || c.timer == nil || c.gen != gen {
		return
	}
	delete(n.covered, c.name)
	if c.cancel != nil {
		c.cancel()
	}
	n.log.Info("pod index: no annotated object left; stopped indexing namespace", "namespace", c.name)
	n.cfg.Indexed(len(n.covered))
}

// start runs c's loop once Run runs and until it stops. n.mu must be held.
func (n *Namespaces) start(c *covered) {
	if c.cancel != nil || n.ctx == nil || n.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(n.ctx)
	c.cancel = cancel
	n.wg.Go(func() {
		if err := c.w.Run(ctx); err != nil && ctx.Err() == nil {
			n.log.Error("pod index: watch loop ended", "namespace", c.name, "err", err)
		}
	})
}

// EndList implements watch.Handler: the Index's, and once every index
// started so far has listed, the memory the lists took goes back to the OS
// (the runtime would return it only slowly, and the heap after a few pages
// of lists is several times what the indexes keep).
func (c *covered) EndList() {
	c.Index.EndList()
	n := c.ns
	n.mu.Lock()
	release := !c.listed && n.covered[c.name] == c
	c.listed = true
	for _, o := range n.covered {
		release = release && (o.listed || o.cancel == nil)
	}
	n.mu.Unlock()
	if release {
		n.cfg.FreeOSMemory()
	}
}

// Cover returns the index of namespace if it can answer for it now: the
// namespace holds (or held moments ago) an annotated object, its first
// list has ended and its watch stream is open. Otherwise nil: the round
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

// OnChange has f told of the pod changes of every index (Index.OnChange),
// those started already and those started later.
func (n *Namespaces) OnChange(f func(namespace string, labels map[string]string)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.onChange = f
	for _, c := range n.covered {
		c.Index.OnChange(f)
	}
}
