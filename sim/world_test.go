package sim

import (
	"container/heap"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/k8spatterns/config-watcher/selector"
)

// The world outside the controller: workloads and their controllers (a
// ReplicaSet's, a DaemonSet's), the kubelet's readiness, the data objects,
// and the ground truth the invariants read: what each pod started with and
// every deletion the server accepted.

const (
	selectorAnnotation = "k8spatterns.io/podDeleteSelector"
	byRefAnnotation    = "k8spatterns.io/restartReferencingPods"
	consentLabel       = "config-watcher.k8spatterns.io/enabled"
	optInLabel         = "restart-ok"
	badValue           = "bad" // a pod that reads it crash-loops
)

// ref is one way a pod template reads a data object.
type ref struct {
	kind string // configmaps, secrets
	name string
	how  string // envFrom, volume, projected, key, init
	key  string // for how == key
	opt  bool   // optional
}

// workload is a ReplicaSet, a DaemonSet (one pod per node up) or a bare pod.
type workload struct {
	kind     string // ReplicaSet, DaemonSet, "" (bare)
	ns, name string
	uid      string
	labels   map[string]string
	refs     []ref
	replicas int    // ReplicaSet: desired
	nodes    []bool // DaemonSet: whether each node is up
	// returning: DaemonSet nodes back up whose pod is not created yet.
	// The budget counts such a node from its pod on: until then nothing
	// outside the DaemonSet controller shows that it wants one more.
	returning map[int]bool
	creating  int // replacements scheduled, not yet created
	// fast: its owner's controller creates a replacement within
	// milliseconds, as a ReplicaSet or DaemonSet controller with nothing
	// else to do does (createDelay).
	fast bool
	// scaled are the ReplicaSet's changes of replicas, oldest first;
	// scaleRead, when each controller (by its generation) was last
	// answered its scale.
	scaled    []scaleChange
	scaleRead map[int]time.Duration
	pods      []*pod
	serial    int
}

// scaleChange is a change of a ReplicaSet's replicas: when, and from how
// many.
type scaleChange struct {
	at   time.Duration
	from int
}

func (wl *workload) live() []*pod {
	return slices.DeleteFunc(slices.Clone(wl.pods), func(p *pod) bool { return !p.alive })
}

// pod is a pod's ground truth.
type pod struct {
	wl       *workload
	ns, name string
	uid      string
	labels   map[string]string
	refs     []ref
	node     int
	started  map[string]map[string]string // kind/name -> the data it started with
	// excused: kind/name -> the data of the moment an edit (of a selector or
	// of its labels) made an object select it: it is owed no restart for that.
	excused    map[string]map[string]string
	created    time.Duration
	ready      bool
	readySince time.Duration
	bad        bool
	alive      bool
	// restartSent is when the controller's last restart of it was sent
	// (restarted: one was).
	restartSent time.Duration
	restarted   bool
	// dropped is when it last became unavailable (not Ready, or removed);
	// availAtDrop: it was available until then.
	dropped     time.Duration
	availAtDrop bool
	// returned: a DaemonSet's pod created for its node come back.
	returned bool
}

// faultedAt is a request a fault failed: when, and what it was for.
type faultedAt struct {
	at time.Duration
	key
}

// data is one data object's ground truth history.
type data struct {
	kind, ns, name string
	changes        []time.Duration // when its data changed
	rv             uint64          // its revision at its last change
}

// sightingAt is when a controller was first shown an object at rv or later.
type sightingAt struct {
	rv uint64
	at time.Duration
}

// removal is a data object's deletion: the revision it made, and what the
// object selected (ok: anything) when it went.
type removal struct {
	sighting
	as annotated
	ok bool
}

// podList is a LIST of pods a controller sent (not a limit=1 mark or
// bound): a round's, a sweep's or the index's.
type podList struct {
	gen int
	ns  string // "": all namespaces
	at  time.Duration
}

// podView is a pod watch event or a pod LIST answer delivered to a
// controller: made when the server took what it shows, delivered at.
type podView struct {
	made, at time.Duration
}

// timer is an outside event due at a virtual time.
type timer struct {
	at   time.Duration
	seq  int
	what string
	fn   func()
}

type timers []*timer

func (t timers) Len() int { return len(t) }
func (t timers) Less(i, j int) bool {
	return t[i].at < t[j].at || (t[i].at == t[j].at && t[i].seq < t[j].seq)
}
func (t timers) Swap(i, j int) { t[i], t[j] = t[j], t[i] }
func (t *timers) Push(x any)   { *t = append(*t, x.(*timer)) }
func (t *timers) Pop() any {
	old := *t
	x := old[len(old)-1]
	*t = old[:len(old)-1]
	return x
}

// world is one run's cluster, its controller processes and its trace.
type world struct {
	seed     uint64
	rng      *rand.Rand
	start    time.Time
	api      *api
	timers   timers
	seq      int
	uids     int
	env      map[string]string
	nss      []string
	watched  map[string]bool // namespaces the controller watches
	consent  bool            // NAMESPACE_SELECTOR in force
	optIn    bool            // POD_OPT_IN_LABEL in force
	minReady time.Duration
	budget   string
	wls      []*workload
	datas    map[string]*data // kind/ns/name
	trace    []string
	restarts []restart
	checks   checks

	faults struct {
		errRate, lostRate, slowRate float64
		// slowBase, if set, is an overloaded server's latency: every
		// answer is held about that long (slowRate is 1).
		slowBase time.Duration
	}
	proc      *process
	stopping  *process // SIGTERMed, not exited yet
	procSince time.Duration
	waitSince map[string]time.Duration // object -> since when a round could restart a Ready pod and did not (-1: said)
	tokens    capBucket                // MAX_RESTARTS_PER_SECOND as the controller's restarts spend it
	serving   *request                 // the request being served, if any
	lostAt    []time.Duration
	// lateMarks are when a consistent pod LIST with limit=1 (a mark, or a
	// bound) was served whose answer was held beyond lateAnswer: a round
	// waits that long for its mark (docs/design.md, "half a second at most").
	lateMarks        []time.Duration
	quietGets        bool // GETs left out of the trace
	livelock         bool
	ending           bool
	activeEnd        time.Duration
	quiet            time.Duration
	values           int
	history          map[string][]string // kind/ns/name/key -> values it had
	initialOut       map[string]bool     // namespaces that never opted in
	outSince         map[string]time.Duration
	outSpans         map[string][]span        // when a namespace was opted out
	adoptedRecreated map[string]time.Duration // objects deleted or created again while no controller ran, or while their namespace was out: when created
	recreatedUnder   map[string][]string      // object -> "old uid/controller gen" of each re-creation while that controller ran
	shownTo          map[string]bool          // "object uid/controller gen": a list or watch of that controller showed the ConfigMap or Secret
	sightings        map[string][]sightingAt  // "kind/ns/name/controller gen": when that controller was first shown each later revision
	podLists         []podList
	procs            []*process
	gens             int
	downSince        time.Duration // the controller not running since (-1: running)
	downs            []span        // when no controller ran
	faultSpans       []span        // when requests failed or answers were lost
	faulted          []faultedAt   // the requests a fault failed, in time order (checkPrompt)
	slowSpans        []span        // when answers were held after the server acted
	lateViews        []span        // a list of ConfigMaps, Secrets or Namespaces: from its effect to its held answer
	selChanged       map[string]time.Duration
	selWrites        map[string]sighting        // "kind/ns/name": the last write that changed the object's selector, as the revision it made
	removals         map[string]removal         // "kind/ns/name": the object's last deletion (re-create)
	removalsShown    map[string][]sightingAt    // "kind/ns/name/controller gen": when that controller was first shown each later deletion
	addedTo          map[string]bool            // "pod uid/controller gen": a pods watch of that controller showed the pod ADDED
	podViews         map[string][]podView       // "pod uid/controller gen" or "ns/controller gen" ("": all): what showed that controller the pod, or the namespace's pods
	nodeLost         map[string]time.Duration   // namespace -> end of the wait a DaemonSet node lost explains (checkPrompt)
	nodesLostAt      map[string][]time.Duration // namespace -> when each DaemonSet node of it was lost
	causes           []cause                    // what may make a controller warn (told)
	warnings         []warning                  // Warning Events the server accepted
	length           int                        // the workload's length, times the usual
	quiescent        *quiescence                // what the run left at quiescence (bounded)
	deletedObjects   int                        // data objects the world deleted
	twins            int                        // groups of twin requests answered
}

// span is an interval of virtual time.
type span struct{ from, to time.Duration }

// restart is a deletion or eviction the server accepted from the
// controller.
type restart struct {
	at     time.Duration
	pod    *pod
	sent   time.Duration
	window string // the design's window that explains a restart of a pod on current data
}

func (w *world) now() time.Duration   { return time.Since(w.start) }
func (w *world) clockTime() time.Time { return time.Now() }

func (w *world) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%9.3fs ", w.now().Seconds())+fmt.Sprintf(format, args...))
}

// after schedules fn at d from now.
func (w *world) after(d time.Duration, what string, fn func()) {
	w.seq++
	heap.Push(&w.timers, &timer{at: w.now() + d, seq: w.seq, what: what, fn: fn})
}

// between draws a duration in [lo, hi).
func (w *world) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

// hashed returns a generator drawn from the seed and what, not from the
// world's: a draw added to the generator that leaves the seed's other
// draws as they were.
func (w *world) hashed(what string) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", w.seed, what)
	return rand.New(rand.NewPCG(h.Sum64(), 0x4a54))
}

func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

func pick[T any](w *world, xs []T) T { return xs[w.rng.IntN(len(xs))] }

func (w *world) workloadByName(ns, name string) *workload {
	for _, wl := range w.wls {
		if wl.ns == ns && wl.name == name {
			return wl
		}
	}
	return nil
}

// --- data objects ---

func dataKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// dataOf returns the data of an object now (decoded), nil if it does not
// exist.
func (w *world) dataOf(kind, ns, name string) map[string]string {
	o := w.api.get(key{kind, ns, name})
	if o == nil {
		return nil
	}
	out := map[string]string{}
	d, _ := o["data"].(map[string]any)
	for k, v := range d {
		s, _ := v.(string)
		if kind == "secrets" {
			b, _ := base64.StdEncoding.DecodeString(s)
			s = string(b)
		}
		out[k] = s
	}
	return out
}

func encodeData(kind string, d map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range d {
		if kind == "secrets" {
			v = base64.StdEncoding.EncodeToString([]byte(v))
		}
		out[k] = v
	}
	return out
}

// setData writes an object's data as someone else does (kubectl apply).
func (w *world) setData(kind, ns, name string, d map[string]string) {
	k := key{kind, ns, name}
	o := w.api.get(k)
	if o == nil {
		return
	}
	o = clone(o)
	o["data"] = encodeData(kind, d)
	w.api.put(k, o)
	dd := w.datas[dataKey(kind, ns, name)]
	dd.changes, dd.rv = append(dd.changes, w.now()), w.api.rv
}

// createData creates a data object with its annotations.
func (w *world) createData(kind, ns, name string, ann map[string]string, d map[string]string) {
	a := map[string]any{}
	for k, v := range ann {
		a[k] = v
	}
	o := object{"kind": map[string]string{"configmaps": "ConfigMap", "secrets": "Secret"}[kind], "apiVersion": "v1",
		"metadata": map[string]any{"name": name, "namespace": ns, "annotations": a}, "data": encodeData(kind, d)}
	if kind == "secrets" {
		o["type"] = "Opaque"
	}
	w.api.put(key{kind, ns, name}, o)
	// A pod created while an object it needs was gone (deleted, not yet
	// created again) does not start until the object exists: it starts
	// with this data (the kubelet retries the mount or the environment).
	for _, p := range w.alivePods() {
		if _, had := p.started[kind+"/"+name]; had || p.ns != ns {
			continue
		}
		for _, r := range p.refs {
			if r.kind == kind && r.name == name && !r.opt {
				p.started[kind+"/"+name] = maps.Clone(d)
				break
			}
		}
	}
	dk := dataKey(kind, ns, name)
	if w.datas[dk] == nil {
		w.datas[dk] = &data{kind: kind, ns: ns, name: name}
	}
	w.datas[dk].changes, w.datas[dk].rv = append(w.datas[dk].changes, w.now()), w.api.rv
}

// objectWritten is told of every write the controller makes; nothing in
// the world reacts to them.
func (w *world) objectWritten(key) {}

// --- selection, from ground truth ---

// annotated is a data object the controller acts for, as it is now.
type annotated struct {
	kind, ns, name string
	sel            *selector.Selector // nil: none
	byRef          bool
	data           map[string]string
}

// annotatedObjects returns the data objects of ns the controller acts for
// now (watched, consenting namespace, a valid annotation).
func (w *world) annotatedObjects(ns string) []annotated {
	if w.consent && labelsOf(w.api.get(key{"namespaces", "", ns}))[consentLabel] != "true" {
		return nil
	}
	return w.annotatedAnyway(ns)
}

// annotatedAnyway returns the annotated objects of ns as annotatedObjects
// does, whether or not ns has opted in: what its objects select while it
// is out is what they select once it opts in again.
func (w *world) annotatedAnyway(ns string) []annotated {
	if !w.watched[ns] {
		return nil
	}
	var out []annotated
	for _, kind := range []string{"configmaps", "secrets"} {
		if kind == "secrets" && w.env["WATCH_SECRETS"] != "true" {
			continue
		}
		for k, o := range w.api.objects {
			if k.res != kind || k.ns != ns {
				continue
			}
			if a, ok := annotatedAs(k, o); ok {
				a.data = w.dataOf(kind, ns, k.name)
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, func(x, y annotated) int { return strings.Compare(x.kind+x.name, y.kind+y.name) })
	return out
}

// annotatedAs returns the selection object o at k makes, its data left
// out; ok is false where it makes none (no annotation, or an invalid
// selector).
func annotatedAs(k key, o object) (a annotated, ok bool) {
	ann := annotationsOf(o)
	a = annotated{kind: k.res, ns: k.ns, name: k.name, byRef: ann[byRefAnnotation] == "true"}
	if s, set := ann[selectorAnnotation]; set {
		sel, err := selector.Parse(s)
		if err != nil {
			return a, false
		}
		a.sel = sel
	}
	return a, a.sel != nil || a.byRef
}

// reads returns which keys of an object p reads: all (nil, true), some,
// or none (false).
func (p *pod) reads(kind, name string) (keys []string, ok bool) {
	whole := false
	for _, r := range p.refs {
		if r.kind != kind || r.name != name {
			continue
		}
		if r.how == "key" {
			keys = append(keys, r.key)
		} else {
			whole = true
		}
		ok = true
	}
	if whole {
		return nil, true
	}
	return keys, ok
}

// selects reports whether the object picks p now.
func (w *world) selects(a annotated, p *pod) bool {
	if !p.alive || p.ns != a.ns {
		return false
	}
	if w.optIn && p.labels[optInLabel] != "true" {
		return false
	}
	if a.sel != nil && !a.sel.Matches(p.labels) {
		return false
	}
	if a.byRef {
		if _, ok := p.reads(a.kind, a.name); !ok {
			return false
		}
	}
	return true
}

// view is the part of an object's data a pod's restart is for: all of it
// for a selector, the keys the pod reads for a reference by key.
func view(a annotated, p *pod, d map[string]string) map[string]string {
	if !a.byRef {
		return d
	}
	keys, _ := p.reads(a.kind, a.name)
	if keys == nil {
		return d
	}
	out := map[string]string{}
	for _, k := range keys {
		if v, ok := d[k]; ok {
			out[k] = v
		}
	}
	return out
}

// current reports whether p runs a's data now, or is excused from it.
func current(a annotated, p *pod) bool {
	k := a.kind + "/" + a.name
	if e, ok := p.excused[k]; ok && maps.Equal(view(a, p, e), view(a, p, a.data)) {
		return true
	}
	return maps.Equal(view(a, p, p.started[k]), view(a, p, a.data))
}

// selectionEdit runs edit, then excuses every pod it made some object
// select: a selection changed is no data change (the state model restarts
// nothing for it), nor is it one made while the namespace had opted out
// (docs/operations.md: an object that carries a record is judged by it at
// the opt-in, as after a restart of the controller).
func (w *world) selectionEdit(ns string, edit func()) {
	before := map[string]bool{}
	for _, a := range w.annotatedAnyway(ns) {
		for _, p := range w.alivePods() {
			if w.selects(a, p) {
				before[a.kind+"/"+a.name+"/"+p.uid] = true
			}
		}
	}
	edit()
	for _, a := range w.annotatedAnyway(ns) {
		for _, p := range w.alivePods() {
			if w.selects(a, p) && !before[a.kind+"/"+a.name+"/"+p.uid] {
				if p.excused == nil {
					p.excused = map[string]map[string]string{}
				}
				p.excused[a.kind+"/"+a.name] = maps.Clone(a.data)
			}
		}
	}
}

func hasBad(d map[string]string) bool {
	for _, v := range d {
		if v == badValue {
			return true
		}
	}
	return false
}
