package sim

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing/synctest"
	"time"

	"github.com/k8spatterns/config-watcher/internal/app"
	"github.com/k8spatterns/config-watcher/internal/testlog"
	"github.com/k8spatterns/config-watcher/selector"
)

// The driver: it answers pending requests in an order the seed picks, runs
// the outside events when they are due, and lets virtual time pass only
// when every goroutine of the bubble waits.

// process is one controller process: its connection dies with it.
type process struct {
	gen    int
	conn   *conn
	cancel context.CancelFunc
	done   chan struct{}
	logs   *testlog.Buffer
	err    error
	wiring app.Wiring    // set by the process as it starts
	ended  time.Duration // when it was killed or exited
	// counts: its counters at the instant of its SIGKILL, after which no
	// code of a real process runs (nil: read them at the end).
	counts map[string]float64
	stalls *stalls // nil: the machine is not loaded
}

// startController starts a controller process, wired as the program is.
func (w *world) startController() {
	w.gens++
	p := &process{gen: w.gens, conn: &conn{api: w.api, gen: w.gens}, done: make(chan struct{}), logs: &testlog.Buffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	env := w.env
	o := app.Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		Stdout: io.Discard, Stderr: p.logs, Version: "sim", Revision: "sim", Transport: p.conn,
		Wired: func(wi app.Wiring) { p.wiring = wi }}
	if loaded(w.seed) {
		p.stalls = newStalls(w.seed, p.gen, w.start)
		o.Stall = p.stalls.draw
	}
	go func() {
		defer close(p.done)
		p.err = app.Run(ctx, o)
	}()
	w.proc, w.procSince = p, w.now()
	w.procs = append(w.procs, p)
	if w.downSince >= 0 {
		w.downs = append(w.downs, span{w.downSince, w.now()})
		w.downSince = -1
	}
	// A ConfigMap created again while an earlier controller ran, that
	// carries no record or intent now (that one was killed before the new
	// object's round wrote its intent, or never began one: a refused
	// selector), is seen first by this one, and adopted as it is
	// (docs/design.md, re-created ConfigMaps); so is a Secret whose state
	// ConfigMap is not the new Secret's (the old one's went with it).
	for _, d := range w.dataObjects() {
		dk := dataKey(d.kind, d.ns, d.name)
		o := w.api.get(key{d.kind, d.ns, d.name})
		if len(w.recreatedUnder[dk]) == 0 || o == nil {
			continue
		}
		held := o // where config-watcher keeps its record and intent
		if d.kind == "secrets" {
			held = nil
			if st := w.api.get(key{"configmaps", d.ns, "config-watcher-secret." + d.name}); st != nil {
				refs, _ := meta(st)["ownerReferences"].([]any)
				if slices.ContainsFunc(refs, func(r any) bool { m, _ := r.(map[string]any); return m["uid"] == meta(o)["uid"] }) {
					held = st
				}
			}
		}
		ours := false
		if held != nil {
			for a := range annotationsOf(held) {
				ours = ours || strings.HasPrefix(a, "config-watcher.k8spatterns.io/")
			}
		}
		if !ours {
			w.adoptedRecreated[dk] = w.now()
		}
	}
	w.logf("fault: controller %d started", p.gen)
}

// kill is SIGKILL: from this instant none of the process's requests
// reaches the server and no answer reaches it.
func (w *world) kill() {
	p := w.proc
	if p == nil {
		return
	}
	if p.wiring.Metrics != nil {
		p.counts = scrape(p.wiring.Metrics)
	}
	w.api.mu.Lock()
	p.conn.dead = true
	w.api.mu.Unlock()
	p.cancel()
	w.proc, w.downSince, p.ended = nil, w.now(), w.now()
	w.addCause(causeDown, "")
	w.logf("fault: controller %d SIGKILLed", p.gen)
	w.after(w.between(time.Second, 10*time.Second), "restart", w.startController)
}

// terminate is SIGTERM: the process finishes in-flight work, releases its
// Lease and exits; a new one starts after.
func (w *world) terminate() {
	p := w.proc
	if p == nil {
		return
	}
	p.cancel()
	w.addCause(causeDown, "")
	w.logf("fault: controller %d SIGTERMed", p.gen)
	w.proc = nil
	w.stopping = p
}

// reap notes a terminated process's exit.
func (w *world) reap(restart bool) {
	p := w.stopping
	if p == nil {
		return
	}
	select {
	case <-p.done:
	default:
		return
	}
	w.api.mu.Lock()
	p.conn.dead = true
	w.api.mu.Unlock()
	w.stopping, w.downSince, p.ended = nil, w.now(), w.now()
	w.logf("fault: controller %d exited (%v)", p.gen, p.err)
	if restart {
		w.after(w.between(500*time.Millisecond, 5*time.Second), "restart", w.startController)
	}
}

// fate is what the faults in force do to one request: fail it with code
// (0: none), lose its answer after the server acted (as a broken
// connection, or, gateway, as a proxy's 504), or hold its answer back for
// delay after the server acted: watchers and the owners' controllers see
// the effect at once, the client its answer later.
type fate struct {
	code    int
	lost    bool
	gateway bool
	delay   time.Duration
}

// drawFate draws a request's fate.
func (w *world) drawFate(r *request) fate {
	if r.query.Get("watch") == "true" {
		return fate{}
	}
	if w.chance(w.faults.errRate) {
		return fate{code: pick(w, []int{500, 503, 504})}
	}
	if w.chance(w.faults.lostRate) {
		return fate{lost: true, gateway: w.chance(0.5)}
	}
	if b := w.faults.slowBase; b > 0 {
		return fate{delay: b*4/5 + w.between(0, b*2/5)}
	}
	if w.chance(w.faults.slowRate) {
		// Most within the wait docs/design.md gives an answer (lateAnswer),
		// some beyond it.
		return fate{delay: w.between(50*time.Millisecond, 800*time.Millisecond)}
	}
	return fate{}
}

// lateAnswer is how long a round waits for a DELETE's answer that its
// cutoff needs (docs/design.md, "half a second at most"): a restart too
// many is allowed only where an answer came later than that.
const lateAnswer = 500 * time.Millisecond

// answer serves one request, or fails it as its fate says, and returns
// its answer (false: none, the client gave up).
func (w *world) answer(r *request, f fate) (answer, bool) {
	if r.ctx.Err() != nil {
		w.logf("api: %d %s: the client gave up", r.conn.gen, r)
		return answer{}, false
	}
	watch := r.query.Get("watch") == "true"
	if rt, ok := parse(r.path); ok && rt.k.res == "pods" && rt.k.name == "" && r.method == http.MethodGet && !watch && r.query.Get("limit") != "1" {
		w.podLists = append(w.podLists, podList{gen: r.conn.gen, ns: rt.k.ns, at: w.now()})
		r.podList, r.served = cmp.Or(rt.k.ns, "*"), w.now()
	}
	if f.code != 0 || f.lost {
		if rt, ok := parse(r.path); ok {
			w.faulted = append(w.faulted, faultedAt{w.now(), rt.k})
		}
	}
	if code := f.code; code != 0 {
		w.logf("api: %d %s -> %d (fault)", r.conn.gen, r, code)
		w.requestCause(r, code, true)
		return answer{resp: status(code, "InternalError", "sim: fault")}, true
	}
	lost := f.lost
	w.serving = r
	resp := w.api.serve(r)
	w.serving = nil
	if resp != nil {
		w.requestCause(r, resp.StatusCode, lost)
		if r.method == http.MethodPost && strings.HasSuffix(r.path, "/events") && resp.StatusCode == http.StatusCreated {
			w.eventPosted(r)
		}
	}
	deletes := r.method == http.MethodDelete || strings.HasSuffix(r.path, "/eviction")
	switch {
	case lost:
		if deletes {
			w.lostAt = append(w.lostAt, w.now())
		}
		if f.gateway {
			w.logf("api: %d %s -> %d, answered 504 by a proxy (fault)", r.conn.gen, r, resp.StatusCode)
			return answer{resp: status(http.StatusGatewayTimeout, "Timeout", "sim: the proxy timed out")}, true
		}
		w.logf("api: %d %s -> %d, answer lost (fault)", r.conn.gen, r, resp.StatusCode)
		return answer{err: errors.New("sim: connection reset by peer")}, true
	case f.delay > 0:
		w.logf("api: %d %s -> %d, answer held %s (fault)", r.conn.gen, r, resp.StatusCode, f.delay.Round(time.Millisecond))
		if deletes && f.delay > lateAnswer {
			w.lostAt = append(w.lostAt, w.now())
		}
		if f.delay > lateAnswer && r.method == http.MethodGet && r.query.Get("limit") == "1" && !watch {
			if rt, ok := parse(r.path); ok && rt.k.res == "pods" && rt.k.name == "" {
				w.lateMarks = append(w.lateMarks, w.now())
			}
		}
		if r.method == http.MethodGet && dataCollection(r.path) {
			w.lateViews = append(w.lateViews, span{w.now(), w.now() + f.delay})
		}
		return answer{resp: resp}, true
	}
	if !watch && !(r.method == http.MethodGet && w.quietGets) {
		w.logf("api: %d %s -> %d", r.conn.gen, r, resp.StatusCode)
	} else if watch {
		w.logf("api: %d %s -> watch", r.conn.gen, r)
	}
	return answer{resp: resp}, true
}

// dataCollection reports whether path names what a controller sees a data
// change through: ConfigMaps, Secrets, Namespaces.
func dataCollection(path string) bool {
	for _, res := range []string{"/configmaps", "/secrets", "/namespaces"} {
		if strings.HasSuffix(path, res) {
			return true
		}
	}
	return false
}

// reply queues answers for delivery: twins' together, at once or, held,
// after delay.
func (w *world) reply(ds []*delivery, delay time.Duration) {
	if len(ds) > 1 {
		w.twins++
		for _, d := range ds {
			d.twin = w.twins
		}
	}
	if delay == 0 {
		w.api.outbox = append(w.api.outbox, ds...)
		return
	}
	w.after(delay, "held answer", func() {
		for _, d := range ds {
			w.logf("api: %d %s: held answer delivered", d.r.conn.gen, d.r)
		}
		w.api.outbox = append(w.api.outbox, ds...)
	})
}

// deliver hands over one queued delivery the seed picks: an answer, or the
// next line (or end) of one watch. Each is followed by synctest.Wait, so
// what it causes is done before the next: the seed alone orders them.
func (w *world) deliver() {
	var heads []int
	seen := map[*stream]bool{}
	for i, d := range w.api.outbox {
		if d.s == nil {
			heads = append(heads, i)
		} else if !seen[d.s] {
			seen[d.s] = true
			heads = append(heads, i)
		}
	}
	i := pick(w, heads)
	d := w.api.outbox[i]
	w.api.outbox = slices.Delete(w.api.outbox, i, i+1)
	if d.twin != 0 {
		// Its twins' answers go with it: nothing tells which of their
		// senders is which.
		w.api.outbox = slices.DeleteFunc(w.api.outbox, func(o *delivery) bool {
			if o.twin == d.twin {
				w.podShown(o)
				o.r.answer <- o.ans
				return true
			}
			return false
		})
	}
	w.podShown(d)
	switch {
	case d.r != nil:
		if d.ans.err == nil {
			for _, sg := range d.r.shows {
				w.sighted(sg, d.r.conn.gen)
			}
			for _, sg := range d.r.gone {
				w.goneShown(sg, d.r.conn.gen)
			}
		}
		d.r.answer <- d.ans
	case d.line != nil:
		d.s.write(d.line)
		if d.added != "" {
			w.addedTo[fmt.Sprintf("%s/%d", d.added, d.s.conn.gen)] = true
		}
		if d.shows.uid != "" {
			w.sighted(d.shows, d.s.conn.gen)
		}
		if d.gone.uid != "" {
			w.goneShown(d.gone, d.s.conn.gen)
		}
	default:
		d.s.finish(d.end)
	}
}

// podShown notes what a delivery shows its controller of pods: a pod
// watch's event the pod, a pod LIST's answer the namespace's pods.
func (w *world) podShown(d *delivery) {
	switch {
	case d.r != nil && d.r.podList != "" && d.ans.err == nil && d.ans.resp != nil && d.ans.resp.StatusCode == http.StatusOK:
		k := fmt.Sprintf("%s/%d", d.r.podList, d.r.conn.gen)
		w.podViews[k] = append(w.podViews[k], podView{made: d.r.served, at: w.now()})
	case d.s != nil && d.pod != "":
		k := fmt.Sprintf("%s/%d", d.pod, d.s.conn.gen)
		w.podViews[k] = append(w.podViews[k], podView{made: d.made, at: w.now()})
	}
}

// sighted notes that controller gen was shown sg: the object, and, the
// first time it shows a later revision, when (createdUnseen).
func (w *world) sighted(sg sighting, gen int) {
	w.shownTo[fmt.Sprintf("%s/%d", sg.uid, gen)] = true
	k := fmt.Sprintf("%s/%d", sg.data, gen)
	if s := w.sightings[k]; len(s) == 0 || s[len(s)-1].rv < sg.rv {
		w.sightings[k] = append(s, sightingAt{rv: sg.rv, at: w.now()})
	}
}

// goneShown notes that controller gen was shown sg's deletion: a DELETED
// event, or a LIST served since without it.
func (w *world) goneShown(sg sighting, gen int) {
	k := fmt.Sprintf("%s/%d", sg.data, gen)
	if s := w.removalsShown[k]; len(s) == 0 || s[len(s)-1].rv < sg.rv {
		w.removalsShown[k] = append(s, sightingAt{rv: sg.rv, at: w.now()})
	}
}

// loop drives the world until done says so or virtual time reaches limit.
func (w *world) loop(limit time.Duration, done func() bool) {
	spins, at := 0, w.now()
	for w.now() < limit && !done() && !w.livelock {
		synctest.Wait()
		if w.now() != at {
			spins, at = 0, w.now()
		}
		if spins++; spins > 50000 {
			w.violate("livelock", "more than 50000 steps at one virtual instant")
			return
		}
		w.reap(!w.ending)
		reqs := w.api.takePending()
		if debugSteps && len(reqs) > 0 {
			var s []string
			for _, r := range reqs {
				s = append(s, fmt.Sprintf("%d %s", r.conn.gen, r))
			}
			w.logf("debug: pending %s", strings.Join(s, " | "))
		}
		// Twins, requests alike in every byte (from one process), come in
		// an order that hangs on the schedule: they share one fate and
		// one delivery.
		var groups [][]*request
		for _, r := range reqs {
			if n := len(groups); n > 0 && groups[n-1][0].canon == r.canon {
				groups[n-1] = append(groups[n-1], r)
			} else {
				groups = append(groups, []*request{r})
			}
		}
		w.rng.Shuffle(len(groups), func(i, j int) { groups[i], groups[j] = groups[j], groups[i] })
		for _, g := range groups {
			f := w.drawFate(g[0])
			var ds []*delivery
			for _, r := range g {
				if a, ok := w.answer(r, f); ok {
					ds = append(ds, &delivery{r: r, ans: a})
				}
			}
			w.reply(ds, f.delay)
		}
		if len(w.api.outbox) > 0 {
			w.deliver()
			continue
		}
		if len(w.timers) > 0 && w.timers[0].at <= w.now() {
			heap.Pop(&w.timers).(*timer).fn()
			continue
		}
		d := limit - w.now()
		if len(w.timers) > 0 {
			d = min(d, w.timers[0].at-w.now())
		}
		var stopped chan struct{}
		if w.stopping != nil {
			stopped = w.stopping.done
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-w.api.wake:
		case <-stopped:
		}
		t.Stop()
	}
}

// every schedules fn every d, from d on, until the run ends.
func (w *world) every(d time.Duration, what string, fn func()) {
	w.after(d, what, func() {
		if !w.ending {
			fn()
			w.every(d, what, fn)
		}
	})
}

// run is one whole run: the cluster, the controller, the workload, then a
// quiet time at whose end every promise is checked, then a graceful stop.
func (w *world) run() {
	w.setup()
	w.startController()
	w.every(30*time.Second, "bookmarks", func() { w.api.tickWatches(true) })
	w.every(time.Second, "watch ends", func() { w.api.tickWatches(false) })
	w.every(time.Second, "prompt", w.checkPrompt)
	w.generate()
	w.loop(w.activeEnd, func() bool { return false })
	w.heal()
	w.loop(w.activeEnd+w.quiet, func() bool { return false })
	w.checkConverged()
	w.noteQuiescence()
	w.ending = true
	w.terminate()
	w.loop(w.activeEnd+w.quiet+5*time.Minute, func() bool { return w.stopping == nil })
	w.api.mu.Lock()
	for _, p := range w.procs {
		p.conn.dead = true
		p.cancel()
	}
	w.api.mu.Unlock()
	w.api.cutWatches(false)
	for _, p := range w.procs {
		w.loop(w.now()+5*time.Minute, func() bool {
			select {
			case <-p.done:
				return true
			default:
				return false
			}
		})
	}
	w.timers = nil
	w.checkTold()
}

// eventCauses are the outside events that are causes of told.
var eventCauses = map[string]string{"blip": causeUnready, "node lost": causeUnready, "pod deleted": causeUnready, "scale": causeUnready, "rollout": causeUnready, "SIGKILL": causeDown, "SIGTERM": causeDown, "watch cut": causeWatchCut, "compaction": causeWatchCut, "re-create": causeRecreated}

func newWorld(seed uint64) *world {
	w := &world{seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)), start: time.Now(), datas: map[string]*data{},
		watched: map[string]bool{}, initialOut: map[string]bool{}, outSince: map[string]time.Duration{}, outSpans: map[string][]span{},
		adoptedRecreated: map[string]time.Duration{}, recreatedUnder: map[string][]string{}, shownTo: map[string]bool{}, sightings: map[string][]sightingAt{}, selChanged: map[string]time.Duration{}, selWrites: map[string]sighting{}, removals: map[string]removal{}, removalsShown: map[string][]sightingAt{}, addedTo: map[string]bool{}, podViews: map[string][]podView{}, nodeLost: map[string]time.Duration{}, nodesLostAt: map[string][]time.Duration{}, downSince: -1}
	w.api = newAPI(w)
	return w
}

// gcDelay is how long the garbage collector takes to remove what a
// deleted object owned (a Secret's state ConfigMap): seconds, in a cluster
// whose kube-controller-manager runs. A fixed delay: it draws nothing from
// the seed.
const gcDelay = 2 * time.Second

// collectDependents removes, as Kubernetes' garbage collector does, the
// objects whose ownerReferences name uid (background propagation).
func (w *world) collectDependents(uid string) {
	for _, k := range slices.SortedFunc(maps.Keys(w.api.objects), func(a, b key) int { return strings.Compare(a.String(), b.String()) }) {
		refs, _ := meta(w.api.objects[k])["ownerReferences"].([]any)
		if slices.ContainsFunc(refs, func(r any) bool { m, _ := r.(map[string]any); return m["uid"] == uid }) {
			w.logf("world: %s %s/%s removed by the garbage collector", k.res, k.ns, k.name)
			w.api.remove(k)
		}
	}
}

// --- the workload: every outside event, drawn from the seed ---

// setup draws the settings and the cluster: namespaces, workloads, the
// data objects and how each workload reads them.
func (w *world) setup() {
	w.nss = []string{"ns-a"}
	if w.chance(0.4) {
		w.nss = append(w.nss, "ns-b")
	}
	w.env = w.drawSettings()
	w.minReady = time.Duration(atoi(w.env["MIN_READY_SECONDS"])) * time.Second
	w.budget = w.env["MAX_UNAVAILABLE"]
	w.optIn = w.env["POD_OPT_IN_LABEL"] != ""
	w.consent = w.env["WATCH_NAMESPACE"] == "*" && w.env["NAMESPACE_SELECTOR"] != ""
	for _, ns := range w.nss {
		w.watched[ns] = w.env["WATCH_NAMESPACE"] == "*" || slices.Contains(strings.Split(w.env["WATCH_NAMESPACE"], ","), ns)
		labels := map[string]any{}
		if !w.consent || w.chance(0.85) {
			labels[consentLabel] = "true"
		} else {
			w.initialOut[ns] = true
		}
		w.api.put(key{"namespaces", "", ns}, object{"kind": "Namespace", "apiVersion": "v1", "metadata": map[string]any{"name": ns, "labels": labels}})
	}
	for _, ns := range w.nss {
		var names []string
		n := 1 + w.rng.IntN(3)
		for i := range n {
			wl := &workload{kind: "ReplicaSet", ns: ns, name: fmt.Sprintf("rs%d", i+1), replicas: 1 + w.rng.IntN(7)}
			w.wls = append(w.wls, wl)
			names = append(names, wl.name)
		}
		if w.chance(0.4) {
			wl := &workload{kind: "DaemonSet", ns: ns, name: "ds", nodes: make([]bool, 2+w.rng.IntN(3))}
			for node := range wl.nodes {
				wl.nodes[node] = true
			}
			w.wls = append(w.wls, wl)
			names = append(names, wl.name)
		}
		if w.chance(0.3) {
			w.wls = append(w.wls, &workload{ns: ns, name: "bare"})
			names = append(names, "bare")
		}
		var objs []ref
		for i := range 1 + w.rng.IntN(3) {
			objs = append(objs, ref{kind: "configmaps", name: fmt.Sprintf("cm%d", i+1)})
		}
		if w.env["WATCH_SECRETS"] == "true" {
			objs = append(objs, ref{kind: "secrets", name: "secret1"})
		}
		for _, o := range objs {
			ann := map[string]string{}
			switch x := w.rng.IntN(10); {
			case x < 5:
				ann[selectorAnnotation] = w.drawSelector(names)
			case x < 8:
				ann[byRefAnnotation] = "true"
			case x < 9:
				ann[selectorAnnotation] = w.drawSelector(names)
				ann[byRefAnnotation] = "true"
			}
			w.createData(o.kind, ns, o.name, ann, map[string]string{"k1": "v0", "k2": "v0", "k3": "v0"})
		}
		for _, wl := range w.wls {
			if wl.ns != ns {
				continue
			}
			w.uids++
			wl.uid = fmt.Sprintf("owner-%d", w.uids)
			wl.labels = map[string]string{"app": wl.name, "tier": pick(w, []string{"web", "web", "batch"})}
			if w.optIn && w.chance(0.7) {
				wl.labels[optInLabel] = "true"
			}
			for _, o := range objs {
				if !w.chance(0.5) {
					continue
				}
				r := ref{kind: o.kind, name: o.name, how: pick(w, []string{"envFrom", "volume", "projected", "key", "key", "init"}), opt: w.chance(0.2)}
				if r.how == "key" {
					r.key = pick(w, []string{"k1", "k2", "k4"})
					r.opt = r.opt || r.key == "k4"
				}
				wl.refs = append(wl.refs, r)
			}
			switch wl.kind {
			case "ReplicaSet":
				for range wl.replicas {
					w.newPod(wl, 0)
				}
			case "DaemonSet":
				for node := range wl.nodes {
					w.newPod(wl, node)
				}
			default:
				w.newPod(wl, 0)
			}
		}
	}
	// Every pod Ready before the controller starts.
	for _, wl := range w.wls {
		wl.fast = w.fastOwner(wl)
		for _, p := range wl.pods {
			p.ready, p.readySince = true, 0
			w.storePod(p)
		}
	}
	w.timers = nil
	w.activeEnd = w.between(90*time.Second, 240*time.Second) * time.Duration(max(1, w.length))
	w.quiet = 4 * time.Minute
	keys := make([]string, 0, len(w.env))
	for k := range w.env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var s []string
	for _, k := range keys {
		s = append(s, k+"="+w.env[k])
	}
	w.logf("settings: %s", strings.Join(s, " "))
	for _, wl := range w.wls {
		w.logf("world: %s %s/%s labels %v replicas %d nodes %d reads %v", wl.kind, wl.ns, wl.name, wl.labels, wl.replicas, len(wl.nodes), wl.refs)
	}
	for _, ns := range w.nss {
		for _, a := range w.annotatedObjects(ns) {
			w.logf("world: %s %s/%s selector %v byRef %v", a.kind, a.ns, a.name, a.sel, a.byRef)
		}
	}
}

var debugSteps = os.Getenv("SIM_DEBUG") != ""

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// drawSelector picks a selector over the workloads' labels.
func (w *world) drawSelector(names []string) string {
	switch w.rng.IntN(4) {
	case 0:
		return "tier=web"
	case 1:
		a, b := pick(w, names), pick(w, names)
		return "app in (" + a + "," + b + ")"
	default:
		return "app=" + pick(w, names)
	}
}

// setSelector writes (set) or removes the selector annotation of the data
// object at k, a selection edit.
func (w *world) setSelector(k key, sel string, set bool) {
	o := clone(w.api.get(k))
	ann, _ := meta(o)["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		meta(o)["annotations"] = ann
	}
	if set {
		ann[selectorAnnotation] = sel
		w.logf("world: %s %s/%s selector now %q", k.res, k.ns, k.name, sel)
	} else {
		delete(ann, selectorAnnotation)
		w.logf("world: %s %s/%s selector removed", k.res, k.ns, k.name)
	}
	w.selChanged[k.ns] = w.now()
	w.selectionEdit(k.ns, func() { w.api.put(k, o) })
	if now := w.api.get(k); now != nil {
		w.selWrites[dataKey(k.res, k.ns, k.name)] = sightingOf(k.res, now)
	}
}

// notDrawn are the settings of docs/settings.md the simulator does not draw,
// and why.
var notDrawn = map[string]string{
	"LEASE_NAMESPACE":     "set to the first namespace: where the Lease lives changes nothing the invariants see",
	"API_URL":             "the simulated cluster's",
	"SELECTOR_ANNOTATION": "the default: its name changes nothing",
	"HTTP_ADDR":           "no listener in the bubble (internal/app.Options.Transport)",
	"LOG_FORMAT":          "output only",
	"LOG_LEVEL":           "output only",
	"POD_NAMESPACE":       "the controller's own pod is not modelled yet",
	"POD_UID":             "the controller's own pod is not modelled yet",
	"RECORD_HASH":         "true: false keeps the state in memory, and a killed controller then adopts (no promise to check)",
	"DIGEST_KEY_FILE":     "a fixed key file, with WATCH_SECRETS",
	"DRY_RUN":             "nothing is restarted: no promise to check",
	"LEASE_NAME":          "its name changes nothing",
	"LEASE_DURATION":      "the defaults (one replica runs at a time)",
	"RENEW_DEADLINE":      "the defaults (one replica runs at a time)",
	"RETRY_PERIOD":        "the defaults (one replica runs at a time)",
}

// drawSettings draws every setting that changes behaviour.
func (w *world) drawSettings() map[string]string {
	env := map[string]string{
		"API_URL":                 "http://sim.invalid",
		"LOG_LEVEL":               map[bool]string{false: "info", true: "debug"}[debugSteps],
		"MAX_UNAVAILABLE":         pick(w, []string{"1", "2", "25%", "50%", "100%"}),
		"MIN_READY_SECONDS":       pick(w, []string{"0", "0", "1", "3"}),
		"SETTLE":                  pick(w, []string{"0s", "0s", "1s", "3s"}),
		"STORM_CHANGES":           pick(w, []string{"3", "5"}),
		"STORM_WINDOW":            pick(w, []string{"5s", "20s", "1m"}),
		"MAX_RESTARTS_PER_SECOND": pick(w, []string{"0", "1", "5", "50"}),
		"MAX_CONCURRENT_RESTARTS": pick(w, []string{"0", "2", "10"}),
		"PROGRESS_DEADLINE":       pick(w, []string{"20s", "1m", "10m"}),
		"RESTART_STRATEGY":        pick(w, []string{"delete", "delete", "evict"}),
		"POD_INDEX":               pick(w, []string{"true", "true", "false"}),
		"WORKERS":                 pick(w, []string{"1", "4"}),
		"EVENTS":                  pick(w, []string{"true", "true", "false"}),
		"SHUTDOWN_TIMEOUT":        pick(w, []string{"0s", "10s"}),
		"LEADER_ELECT":            pick(w, []string{"false", "false", "true"}),
		"POD_NAME":                "config-watcher-0",
		"WATCH_SECRETS":           pick(w, []string{"false", "false", "true"}),
		"NAMESPACE_SELECTOR":      "",
		"POD_OPT_IN_LABEL":        "",
		"LEASE_NAMESPACE":         "ns-a",
	}
	if w.chance(0.15) {
		env["POD_OPT_IN_LABEL"] = optInLabel + "=true"
	}
	switch {
	case w.chance(0.4):
		env["WATCH_NAMESPACE"] = "*"
		if w.chance(0.6) {
			env["NAMESPACE_SELECTOR"] = consentLabel + "=true"
		}
	default:
		env["WATCH_NAMESPACE"] = strings.Join(w.nss, ",")
		if len(w.nss) > 1 && w.chance(0.3) {
			env["WATCH_NAMESPACE"] = w.nss[0]
		}
	}
	if env["WATCH_SECRETS"] == "true" {
		env["DIGEST_KEY_FILE"] = digestKeyFile
	}
	return env
}

// digestKeyFile is the key file of WATCH_SECRETS, written once per process.
var digestKeyFile string

// dataObjects lists the data objects, in a stable order.
func (w *world) dataObjects() []*data {
	var out []*data
	for _, d := range w.datas {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b *data) int {
		return strings.Compare(dataKey(a.kind, a.ns, a.name), dataKey(b.kind, b.ns, b.name))
	})
	return out
}

func (w *world) alivePods() []*pod {
	var out []*pod
	for _, wl := range w.wls {
		for _, p := range wl.pods {
			if p.alive {
				out = append(out, p)
			}
		}
	}
	return out
}

// change sets one key of d to a new value, a bad one, or one it had before.
func (w *world) change(d *data) {
	cur := w.dataOf(d.kind, d.ns, d.name)
	if cur == nil {
		return
	}
	k := pick(w, []string{"k1", "k2", "k3"})
	w.values++
	v := fmt.Sprintf("v%d", w.values)
	switch x := w.rng.Float64(); {
	case x < 0.1:
		v = badValue
	case x < 0.25 && len(w.history[dataKey(d.kind, d.ns, d.name)+"/"+k]) > 0:
		v = pick(w, w.history[dataKey(d.kind, d.ns, d.name)+"/"+k]) // set back
	}
	w.history[dataKey(d.kind, d.ns, d.name)+"/"+k] = append(w.history[dataKey(d.kind, d.ns, d.name)+"/"+k], cur[k])
	cur[k] = v
	if v == badValue {
		w.addCause(causeBad, "")
	}
	w.logf("world: %s %s/%s %s=%s", d.kind, d.ns, d.name, k, v)
	w.setData(d.kind, d.ns, d.name, cur)
}

// generate schedules the outside events of the active time.
func (w *world) generate() {
	w.history = map[string][]string{}
	type event struct {
		weight int
		name   string
		fn     func()
	}
	events := []event{
		{30, "change", func() { w.change(pick(w, w.dataObjects())) }},
		{5, "storm", func() {
			d := pick(w, w.dataObjects())
			at := time.Duration(0)
			for range 3 + w.rng.IntN(9) {
				at += w.between(50*time.Millisecond, 900*time.Millisecond)
				w.after(at, "storm change", func() { w.change(d) })
			}
		}},
		{8, "scale", func() {
			rss := slices.DeleteFunc(slices.Clone(w.wls), func(wl *workload) bool { return wl.kind != "ReplicaSet" })
			wl := pick(w, rss)
			w.scale(wl, 1+w.rng.IntN(8))
		}},
		{3, "rollout", func() {
			// A Deployment's rollout: a new ReplicaSet takes the old one's
			// pods, as many, and the old one is scaled to none.
			rss := slices.DeleteFunc(slices.Clone(w.wls), func(wl *workload) bool { return wl.kind != "ReplicaSet" || wl.replicas == 0 })
			if len(rss) == 0 {
				return
			}
			old := pick(w, rss)
			w.uids++
			nw := &workload{kind: "ReplicaSet", ns: old.ns, name: fmt.Sprintf("%s-%d", old.labels["app"], w.uids), uid: fmt.Sprintf("owner-%d", w.uids),
				labels: maps.Clone(old.labels), refs: old.refs, fast: old.fast}
			w.wls = append(w.wls, nw)
			w.logf("world: rollout: ReplicaSet %s/%s replaces %s", nw.ns, nw.name, old.name)
			w.scale(nw, old.replicas)
			w.scale(old, 0)
		}},
		{8, "blip", func() {
			pods := slices.DeleteFunc(w.alivePods(), func(p *pod) bool { return !p.ready })
			if len(pods) == 0 {
				return
			}
			p := pick(w, pods)
			w.setReady(p, false)
			w.after(w.between(time.Second, 20*time.Second), "blip ends", func() { w.setReady(p, true) })
		}},
		{3, "node lost", func() {
			for _, wl := range w.wls {
				if wl.kind != "DaemonSet" {
					continue
				}
				node := w.rng.IntN(len(wl.nodes))
				if !wl.nodes[node] {
					return
				}
				wl.nodes[node] = false
				w.logf("world: node %d of %s/%s lost", node, wl.ns, wl.name)
				w.noteNodeLost(wl, node)
				for _, p := range wl.pods {
					if p.alive && p.node == node {
						w.deletePod(p, "node lost")
					}
				}
				w.after(w.between(10*time.Second, 60*time.Second), "node back", func() {
					wl.nodes[node] = true
					if wl.returning == nil {
						wl.returning = map[int]bool{}
					}
					wl.returning[node] = true
					w.logf("world: node %d of %s/%s back", node, wl.ns, wl.name)
					w.reconcile(wl)
				})
				return
			}
		}},
		{3, "relabel", func() {
			pods := w.alivePods()
			if len(pods) == 0 {
				return
			}
			p := pick(w, pods)
			w.selectionEdit(p.ns, func() {
				switch w.rng.IntN(3) {
				case 0:
					w.relabel(p, "app", "other")
				case 1:
					w.relabel(p, "tier", pick(w, []string{"web", "batch", ""}))
				default:
					w.relabel(p, optInLabel, pick(w, []string{"true", ""}))
				}
			})
		}},
		{3, "selector edit", func() {
			d := pick(w, w.dataObjects())
			k := key{d.kind, d.ns, d.name}
			if w.api.get(k) == nil {
				return
			}
			var names []string
			for _, wl := range w.wls {
				if wl.ns == d.ns {
					names = append(names, wl.name)
				}
			}
			w.setSelector(k, w.drawSelector(names), true)
		}},
		{3, "bad selector", func() {
			// A user writes a selector the product refuses (README,
			// "Only what consented" and "Nothing else is deleted"), then
			// sets back the one it had: until then no pod is the
			// object's, and a change still pending is acted on once
			// fixed (docs/operations.md, ConfigWatcherInvalidSelector).
			d := pick(w, w.dataObjects())
			k := key{d.kind, d.ns, d.name}
			o := w.api.get(k)
			if o == nil {
				return
			}
			old, had := annotationsOf(o)[selectorAnnotation]
			if had {
				if _, err := selector.Parse(old); err != nil {
					return // already refused
				}
			} else if annotationsOf(o)[byRefAnnotation] != "true" {
				return // not annotated: a selector would opt it in
			}
			// The pods selected until now stay owed the data changed
			// meanwhile: the fix excuses only the ones it adds.
			ok := d.kind + "/" + d.name
			owed := map[*pod]map[string]string{}
			for _, a := range w.annotatedAnyway(d.ns) {
				for _, p := range w.alivePods() {
					if a.kind+"/"+a.name == ok && w.selects(a, p) {
						owed[p] = p.excused[ok]
					}
				}
			}
			bad := pick(w, []string{"app in (web", "", "!app", "tier", "pod-template-hash", "app=web,"})
			w.setSelector(k, bad, true)
			w.addCause(causeBadSel, "")
			w.after(w.between(2*time.Second, 30*time.Second), "selector fixed", func() {
				o := w.api.get(k)
				if o == nil {
					return
				}
				// A selector edit meanwhile was the fix: the round it
				// let run restarted the pods it selected, and setting
				// the old one back is a selection edit like any other.
				cur, set := annotationsOf(o)[selectorAnnotation]
				refused := set && cur == bad
				if had {
					w.setSelector(k, old, true)
				} else {
					w.setSelector(k, "", false)
				}
				if !refused {
					return
				}
				for p, e := range owed {
					if e == nil {
						delete(p.excused, ok)
					} else {
						p.excused[ok] = e
					}
				}
			})
		}},
		{3, "re-create", func() {
			d := pick(w, w.dataObjects())
			k := key{d.kind, d.ns, d.name}
			o := w.api.get(k)
			if o == nil {
				return
			}
			w.selChanged[d.ns] = w.now()
			deleted := w.now()
			uid, _ := meta(o)["uid"].(string)
			w.logf("world: %s %s/%s deleted", d.kind, d.ns, d.name)
			w.deletedObjects++
			gone := removal{sighting: sightingOf(d.kind, w.api.remove(k))}
			gone.as, gone.ok = annotatedAs(k, o)
			w.removals[dataKey(d.kind, d.ns, d.name)] = gone
			w.after(gcDelay, "garbage collector", func() { w.collectDependents(uid) })
			ann := annotationsOf(o)
			for a := range ann {
				if strings.HasPrefix(a, "config-watcher.k8spatterns.io/") {
					delete(ann, a) // a re-created object carries only what its author wrote
				}
			}
			w.after(w.between(0, 10*time.Second), "re-create", func() {
				cur := w.dataOf(d.kind, d.ns, d.name)
				if cur != nil {
					return
				}
				dd := map[string]string{}
				for k, v := range w.lastData(o, d.kind) {
					dd[k] = v
				}
				if w.chance(0.5) {
					w.values++
					dd["k1"] = fmt.Sprintf("v%d", w.values)
				}
				w.logf("world: %s %s/%s created again (data %v)", d.kind, d.ns, d.name, dd)
				w.createData(d.kind, d.ns, d.name, ann, dd)
				dk := dataKey(d.kind, d.ns, d.name)
				switch {
				case w.proc == nil || w.procSince > deleted:
					// No controller that saw the old object runs: the
					// one that comes sees the new one first.
					w.adoptedRecreated[dk] = w.now()
				case w.outBetween(d.ns, deleted, w.now()):
					// The controller keeps nothing of a namespace while
					// it is out, the old object's tombstone included
					// (docs/design.md, what the model cannot see): it
					// sees the new one first, with no record, and adopts
					// it (Decisions: adoption), as one started then would.
					w.adoptedRecreated[dk] = w.now()
				default:
					// The controller that runs may not have seen the
					// old object yet either (its first list not
					// answered, or its answer lost): then it sees the
					// new one first, as one started now would
					// (docs/design.md, re-created ConfigMaps). Its
					// answers may still be on their way: judged at the
					// end (convergeWindow).
					w.recreatedUnder[dk] = append(w.recreatedUnder[dk], fmt.Sprintf("%s/%d", uid, w.proc.gen))
				}
			})
		}},
		{2, "namespace opt-out", func() {
			if !w.consent {
				return
			}
			ns := pick(w, w.nss)
			w.setConsent(ns, false)
			w.after(w.between(5*time.Second, 30*time.Second), "opt in", func() { w.setConsent(ns, true) })
		}},
		{2, "pod deleted", func() {
			pods := w.alivePods()
			if len(pods) > 0 {
				w.deletePod(pick(w, pods), "kubectl delete pod")
			}
		}},
		{4, "SIGKILL", w.kill},
		{2, "SIGTERM", w.terminate},
		{3, "5xx", func() {
			w.faults.errRate = 0.3
			w.logf("fault: 5xx on 30%% of requests")
			from := w.now()
			w.after(w.between(3*time.Second, 20*time.Second), "5xx ends", func() {
				w.faults.errRate = 0
				w.faultSpans = append(w.faultSpans, span{from, w.now()})
				w.logf("fault: 5xx ends")
			})
		}},
		{3, "lost answers", func() {
			w.faults.lostRate = 0.3
			w.logf("fault: 30%% of answers lost")
			from := w.now()
			w.after(w.between(3*time.Second, 20*time.Second), "lost answers end", func() {
				w.faults.lostRate = 0
				w.faultSpans = append(w.faultSpans, span{from, w.now()})
				w.logf("fault: lost answers end")
			})
		}},
		{6, "slow answers", func() {
			// Twice the weight of 5xx or lost answers: an overloaded API
			// server is a busy cluster's everyday state, not a rare
			// outage, and its answers race the pod index's watch.
			// Half the spans scatter: half the answers held, each its own
			// time. In the other half the server is overloaded: every
			// answer is held about one time, the span's (drawn by hash,
			// not from the world's generator, so that the seed's other
			// draws stay what they were), so that answers sent in order
			// come back in order, each later than the index's watch
			// shows what the request did.
			from := w.now()
			if h := w.hashed(fmt.Sprintf("slow/%d", from)); h.IntN(2) == 0 {
				w.faults.slowRate = 0.5
				w.logf("fault: half the answers held after the server acted")
			} else {
				w.faults.slowRate = 1
				w.faults.slowBase = 50*time.Millisecond + time.Duration(h.Int64N(int64(400*time.Millisecond)))
				w.logf("fault: every answer held about %s after the server acted", w.faults.slowBase.Round(time.Millisecond))
			}
			w.after(w.between(3*time.Second, 20*time.Second), "slow answers end", func() {
				w.faults.slowRate, w.faults.slowBase = 0, 0
				w.slowSpans = append(w.slowSpans, span{from, w.now()})
				w.logf("fault: slow answers end")
			})
		}},
		{3, "watch cut", func() {
			broken := w.chance(0.5)
			w.logf("fault: every watch cut (broken %v)", broken)
			w.api.cutWatches(broken)
		}},
		{3, "compaction", func() {
			w.logf("fault: compaction at %d", w.api.rv)
			w.api.compact()
			if w.chance(0.5) {
				w.api.cutWatches(true)
			}
		}},
	}
	total := 0
	for _, e := range events {
		total += e.weight
	}
	for at := w.between(time.Second, 5*time.Second); at < w.activeEnd-5*time.Second; at += w.between(200*time.Millisecond, 8*time.Second) {
		x := w.rng.IntN(total)
		for _, e := range events {
			if x -= e.weight; x < 0 {
				w.after(at, e.name, func() {
					w.logf("event: %s", e.name)
					if k, ok := eventCauses[e.name]; ok {
						w.addCause(k, "")
					}
					e.fn()
				})
				break
			}
		}
	}
}

// lastData is an object's data as o holds it, decoded.
func (w *world) lastData(o object, kind string) map[string]string {
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

func (w *world) setConsent(ns string, in bool) {
	k := key{"namespaces", "", ns}
	o := clone(w.api.get(k))
	labels, _ := meta(o)["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		meta(o)["labels"] = labels
	}
	was := labels[consentLabel] == "true"
	if in {
		labels[consentLabel] = "true"
	} else {
		delete(labels, consentLabel)
	}
	w.selChanged[ns] = w.now()
	// A span begins when the namespace leaves and ends when it comes back:
	// an opt-out of one already out (from the start, say) leaves its span
	// as it began.
	switch {
	case in && !was:
		w.outSpans[ns] = append(w.outSpans[ns], span{w.outSince[ns], w.now()})
	case !in && was:
		w.outSince[ns] = w.now()
	}
	w.logf("world: namespace %s opted in: %v", ns, in)
	w.api.put(k, o)
}

// heal ends the active time: faults stop, the controller runs, bad data is
// fixed, and namespaces opt in again, so every promise must hold after the
// quiet time.
func (w *world) heal() {
	w.logf("event: heal")
	w.faults.errRate, w.faults.lostRate, w.faults.slowRate, w.faults.slowBase = 0, 0, 0, 0
	for _, d := range w.dataObjects() {
		cur := w.dataOf(d.kind, d.ns, d.name)
		if cur != nil && hasBad(cur) {
			for k, v := range cur {
				if v == badValue {
					w.values++
					cur[k] = fmt.Sprintf("v%d", w.values)
				}
			}
			w.logf("world: %s %s/%s fixed", d.kind, d.ns, d.name)
			w.setData(d.kind, d.ns, d.name, cur)
		}
	}
	for _, p := range w.alivePods() {
		if p.bad && !w.readsBad(p) {
			// It crash-loops on bad data of an object that no longer
			// selects it (a selector edit or a relabel since it
			// started): no controller's to bring back (readsBad), and
			// a round it holds would wait for good. Whoever fixed the
			// data deletes it; its owner creates it again.
			w.deletePod(p, "crash-looping on data no object selects it for")
		}
	}
	if w.consent {
		for _, ns := range w.nss {
			if !w.initialOut[ns] && labelsOf(w.api.get(key{"namespaces", "", ns}))[consentLabel] != "true" {
				w.setConsent(ns, true)
			}
		}
	}
	if w.proc == nil && w.stopping == nil && !slices.ContainsFunc(w.timers, func(t *timer) bool { return t.what == "restart" }) {
		w.startController()
	}
}
