package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The invariants, from ground truth only: the data each pod started with,
// every deletion or eviction the server accepted, the workloads' desired
// counts. Never the controller's annotations, logs or metrics.

// violation is one broken promise.
type violation struct {
	invariant string
	at        time.Duration
	detail    string
}

func (v violation) String() string {
	return fmt.Sprintf("%s at %.3fs: %s", v.invariant, v.at.Seconds(), v.detail)
}

// checks is what a run found: violations, and restarts of pods already on
// the current data that a window of docs/design.md explains, by window.
type checks struct {
	violations []violation
	windows    map[string]int
	restarts   int
}

func (w *world) violate(invariant, format string, args ...any) {
	w.violateAt(invariant, w.now(), format, args...)
}

// violateAt notes a violation found later than it happened.
func (w *world) violateAt(invariant string, at time.Duration, format string, args ...any) {
	v := violation{invariant: invariant, at: at, detail: fmt.Sprintf(format, args...)}
	w.checks.violations = append(w.checks.violations, v)
	w.logf("VIOLATION %s", v)
	if invariant == "livelock" {
		w.livelock = true
	}
}

func (w *world) podByName(ns, name string) *pod {
	for _, wl := range w.wls {
		for _, p := range wl.pods {
			if p.alive && p.ns == ns && p.name == name {
				return p
			}
		}
	}
	return nil
}

// lastChange is when a's data last changed.
func (w *world) lastChange(a annotated) time.Duration {
	d := w.datas[dataKey(a.kind, a.ns, a.name)]
	if d == nil || len(d.changes) == 0 {
		return 0
	}
	return d.changes[len(d.changes)-1]
}

// troubled reports whether requests failed or no controller ran at some
// time in [from, to].
func (w *world) troubled(from, to time.Duration) bool {
	spans := append(slices.Clone(w.downs), w.faultSpans...)
	if w.downSince >= 0 {
		spans = append(spans, span{w.downSince, w.now()})
	}
	if w.faults.errRate > 0 || w.faults.lostRate > 0 {
		spans = append(spans, span{to, to})
	}
	for _, s := range spans {
		if s.from <= to && s.to >= from {
			return true
		}
	}
	return false
}

// controllerDeletes is told of every deletion or eviction of a pod the
// server is about to accept from the controller: never a bystander, once
// per change, within the budget.
func (w *world) controllerDeletes(r *request, k key) {
	p := w.podByName(k.ns, k.name)
	if p == nil {
		return
	}
	w.checks.restarts++
	var sel []annotated
	for _, a := range w.annotatedObjects(k.ns) {
		if w.selects(a, p) {
			sel = append(sel, a)
		}
	}
	w.logf("truth: controller %d restarts %s/%s (%s, Ready %v, sent at %.3fs)", r.conn.gen, p.ns, p.name, p.uid, p.ready, r.at.Seconds())
	p.restartSent, p.restarted = r.at, true
	for k, since := range w.waitSince {
		if since >= 0 && strings.Contains(k, "/"+p.ns+"/") {
			delete(w.waitSince, k) // a restart is progress
		}
	}
	if len(sel) == 0 {
		if w.selChanged[k.ns] >= r.at {
			w.note("selection changed while the request was in flight")
			return
		}
		w.violate("bystander", "%s/%s deleted though no object selects it (labels %v)", p.ns, p.name, p.labels)
		return
	}
	redundant := true
	for _, a := range sel {
		if !current(a, p) {
			redundant = false
		}
	}
	if redundant {
		if why := w.window(p, sel, r.conn.gen); why != "" {
			w.note(why)
		} else {
			w.violate("once", "%s/%s restarted though it runs the current data of %s", p.ns, p.name, names(sel))
		}
	}
	// A bare pod is restarted outside the budget (docs/design.md, waves).
	if w.available(p) && p.wl.kind != "" {
		for _, a := range sel {
			if w.inBudget(a, p) && !current(a, p) && !w.adoptedAsIs(a) {
				w.checkBudget(a, p, r)
			}
		}
	}
}

// adoptedAsIs reports whether a controller adopts a's data as it is now:
// a was created again while no controller ran (docs/design.md, Decisions:
// re-created ConfigMaps), or its namespace was out from the start and a
// last changed before it first opted in (docs/operations.md: a namespace
// that opts in later has its objects adopted as they are then), and a has
// not changed since. Its pods are owed no restart for that data, and no
// round of it has a budget to keep, as none has for an object whose pods
// run its data.
func (w *world) adoptedAsIs(a annotated) bool {
	last := w.lastChange(a)
	if at, ok := w.adoptedWhileDown[dataKey(a.kind, a.ns, a.name)]; ok && at == last {
		return true
	}
	spans := w.outSpans[a.ns]
	return w.initialOut[a.ns] && len(spans) > 0 && last <= spans[0].to
}

func names(as []annotated) string {
	var s []string
	for _, a := range as {
		s = append(s, a.kind+"/"+a.name)
	}
	return strings.Join(s, ",")
}

func (w *world) note(window string) {
	if w.checks.windows == nil {
		w.checks.windows = map[string]int{}
	}
	w.checks.windows[window]++
	w.logf("truth: window %q", window)
}

// window names the window of docs/design.md ("What the model cannot see",
// the state model) that explains controller gen restarting p, which
// already runs the current data of every object in sel; "" if none does.
func (w *world) window(p *pod, sel []annotated, gen int) string {
	for _, a := range sel {
		last := w.lastChange(a)
		switch {
		case p.created >= last && p.created-last < 2*time.Second:
			return "created between a change and the controller seeing it"
		case p.created >= last && w.troubled(last, p.created):
			return "created between a change and the controller seeing it, while requests failed"
		case p.created >= last && w.outAt(a.ns, p.created):
			// The controller keeps nothing of an opted-out namespace
			// and sees its objects afresh when it opts in: a pod that
			// started meanwhile is one it cannot tell from an older one.
			return "created between a change and the controller seeing it, while its namespace had opted out"
		case p.created < last:
			return "data set back: pods mixed, a new round over every pod"
		}
		for _, at := range w.lostAt {
			if at >= last && at <= p.created {
				return "replacement of a pod whose deletion's answer was lost"
			}
		}
		if w.storm(a) {
			return "a round begun in a storm, for its own data"
		}
	}
	if w.env["POD_INDEX"] == "true" && !w.addedTo[fmt.Sprintf("%s/%d", p.uid, gen)] {
		// Its first list at start, or a relist after a 410: a list
		// shows a pod's last update, not its creation.
		return "pod first seen by the index in a list: counted as created before any change"
	}
	return ""
}

// outAt reports whether namespace ns had opted out at time t.
func (w *world) outAt(ns string, t time.Duration) bool {
	for _, s := range w.outSpans[ns] {
		if t >= s.from && t <= s.to {
			return true
		}
	}
	return false
}

// storm reports whether a's last change fell in a storm: more than
// STORM_CHANGES changes within a STORM_WINDOW began it, and it lasts until
// the data has been quiet for a STORM_WINDOW (policy/storm.go), so every
// change less than a window after the one before it is in it too. Its
// round may record data other than the last, and the next round restarts
// every pod (the state model's storm row); while it lasts, a new round
// waits for the window after the storm's last round began.
func (w *world) storm(a annotated) bool {
	d := w.datas[dataKey(a.kind, a.ns, a.name)]
	n := atoi(w.env["STORM_CHANGES"])
	win, _ := time.ParseDuration(w.env["STORM_WINDOW"])
	in := false
	for i, c := range d.changes {
		if in && c-d.changes[i-1] >= win {
			in = false // quiet for a window: the storm ended
		}
		if !in && i >= n && c-d.changes[i-n] <= win {
			in = true
		}
	}
	return in
}

// available reports whether p is Ready for MIN_READY_SECONDS as the API
// tells it: a condition's lastTransitionTime has whole seconds.
func (w *world) available(p *pod) bool {
	return p.ready && w.now()-p.readySince.Truncate(time.Second) >= w.minReady
}

// inBudget reports whether a round of a counts p in its budget: a pod a
// selects. An object some pod reads by key is left out: its round narrows
// those pods to the ones reading what changed since its record, which the
// ground truth does not tell.
func (w *world) inBudget(a annotated, p *pod) bool {
	if a.byRef {
		for _, q := range w.alivePods() {
			if keys, ok := q.reads(a.kind, a.name); ok && keys != nil && q.ns == a.ns {
				return false
			}
		}
	}
	return w.selects(a, p)
}

// allowed is MAX_UNAVAILABLE of expected pods: rounded down, at least 1.
func (w *world) allowed(expected int) int {
	if pct, ok := strings.CutSuffix(w.budget, "%"); ok {
		n, _ := strconv.Atoi(pct)
		return max(1, expected*n/100)
	}
	n, _ := strconv.Atoi(w.budget)
	return n
}

// checkBudget: restarting the Ready pod p leaves a's pods at least
// expected - MAX_UNAVAILABLE available, expected as the disruption
// controller counts it (owners' desired counts, less their pods a does
// not select).
func (w *world) checkBudget(a annotated, p *pod, r *request) {
	expected, available := w.counts(a, p, w.inBudget)
	if available >= expected-w.allowed(expected) {
		return
	}
	if w.readyDropped[a.ns] >= r.at {
		w.note("a pod became unavailable while the restart was in flight")
		return
	}
	w.violate("budget", "%s/%s restarted for %s/%s leaves %d available of %d expected (MAX_UNAVAILABLE %s)", p.ns, p.name, a.kind, a.name, available, expected, w.budget)
}

// counts returns a's expected and available pods were p gone, a's pods
// those in says a counts (inBudget, or selects).
func (w *world) counts(a annotated, p *pod, in func(annotated, *pod) bool) (expected, available int) {
	for _, wl := range w.wls {
		if wl.ns != a.ns || wl.kind == "" {
			continue // the budget counts owned pods
		}
		selected, other := 0, 0
		for _, q := range wl.live() {
			if in(a, q) {
				selected++
				if q != p && w.available(q) {
					available++
				}
			} else {
				other++
			}
		}
		if selected == 0 {
			continue
		}
		desired := selected
		switch wl.kind {
		case "ReplicaSet":
			desired = wl.replicas
		case "DaemonSet":
			desired = 0
			for node, up := range wl.nodes {
				if up && !wl.returning[node] {
					desired++
				}
			}
		}
		expected += max(selected, desired-other)
	}
	return expected, available
}

// checkConverged: at quiescence every selected pod runs its objects' last
// data, but where a namespace holds bad data (a halted round waits for a
// fix) or a documented window explains it.
func (w *world) checkConverged() {
	for _, ns := range w.nss {
		objs := w.annotatedObjects(ns)
		bad := false
		for _, a := range objs {
			bad = bad || hasBad(a.data)
		}
		if bad {
			continue
		}
		for _, a := range objs {
			for _, p := range w.alivePods() {
				if !w.selects(a, p) || current(a, p) {
					continue
				}
				if why := w.convergeWindow(a, p); why != "" {
					w.note(why)
					continue
				}
				w.violate("converge", "%s/%s (created %.3fs) does not run the last data of %s/%s (changed %.3fs)", p.ns, p.name, p.created.Seconds(), a.kind, a.name, w.lastChange(a).Seconds())
			}
		}
	}
}

// convergeWindow names the documented window that leaves p on other data
// than a's last, "" if none.
func (w *world) convergeWindow(a annotated, p *pod) string {
	dk := dataKey(a.kind, a.ns, a.name)
	if _, ok := w.adoptedWhileDown[dk]; ok {
		return "object deleted or created again while no controller ran: adopted"
	}
	for _, under := range w.recreatedUnder[dk] {
		if !w.shownTo[under] {
			return "object created again before the running controller had seen it: adopted"
		}
	}
	for _, s := range w.outSpans[a.ns] {
		for _, c := range w.datas[dk].changes {
			if c >= s.from && c <= s.to {
				return "data changed while its namespace had opted out: adopted"
			}
		}
	}
	for _, s := range w.downs {
		if p.created >= s.from && p.created <= s.to {
			for _, c := range w.datas[dk].changes {
				if c >= s.from && c <= s.to {
					return "data changed and set back while no controller ran"
				}
			}
		}
	}
	return ""
}

// checkPrompt, every second: no round waits more than 2 s while a pod it
// waits for is Ready and every budget that counts it allows its restart.
// Judged only where the ground truth can tell: objects selecting by labels
// alone, a controller running for 20 s with no fault meanwhile, its watches
// open, no bad data in the namespace, no storm, no SETTLE wait, no change in
// the last 2 s, no DaemonSet node lost within the window noteNodeLost says.
func (w *world) checkPrompt() {
	if w.waitSince == nil {
		w.waitSince = map[string]time.Duration{}
	}
	now := w.now()
	settle, _ := time.ParseDuration(w.env["SETTLE"])
	calm := w.proc != nil && now-w.procSince >= 20*time.Second && !w.troubled(now-20*time.Second, now)
	for _, ns := range w.nss {
		objs := w.annotatedObjects(ns)
		bad := false
		for _, a := range objs {
			bad = bad || hasBad(a.data)
		}
		for _, a := range objs {
			k := dataKey(a.kind, a.ns, a.name)
			estimating := now < w.nodeLost[ns]
			if !calm || bad || a.sel == nil || a.byRef || w.storm(a) || now-w.lastChange(a) < settle+2*time.Second || !w.viewsStream(a) || estimating {
				delete(w.waitSince, k)
				continue
			}
			var ready *pod
			for _, p := range w.alivePods() {
				// A pod a documented window leaves on other data (its
				// object adopted) is owed nothing.
				if p.wl.kind != "" && w.selects(a, p) && !current(a, p) && w.convergeWindow(a, p) == "" && w.available(p) && w.budgetAllows(p) {
					ready = p
					break
				}
			}
			if ready == nil {
				delete(w.waitSince, k)
				continue
			}
			since, ok := w.waitSince[k]
			switch {
			case !ok:
				w.waitSince[k] = now
			case now-since > 3*time.Second && since >= 0:
				w.violate("prompt", "the round of %s waited %.1fs while %s/%s was Ready, not on its data, and every budget allowed its restart", k, (now - since).Seconds(), ready.ns, ready.name)
				w.waitSince[k] = -1 // said once
			}
		}
	}
}

// noteNodeLost notes the wait that node of wl lost explains in its
// namespace (checkPrompt). A DaemonSet has no scale: a pod gone by other
// hands counts in its estimate for 30 s (docs/design.md, waves), then a
// wave's look. A restart of the node's pod sent in the last 2 minutes
// counts as owed until its replacement is seen, for 2 minutes at most
// (the in-flight bound): one created and lost with the node between two
// counts is never seen.
func (w *world) noteNodeLost(wl *workload, node int) {
	until := w.now() + 32*time.Second
	for _, p := range wl.pods {
		if p.restarted && p.node == node && w.now()-p.restartSent < 2*time.Minute {
			until = max(until, p.restartSent+2*time.Minute+2*time.Second)
		}
	}
	w.nodeLost[wl.ns] = max(w.nodeLost[wl.ns], until)
}

// viewsStream reports whether the running controller has a watch open on
// a's collection in its namespace and, with consent on, on Namespaces:
// until it has, a selector narrowed or an opt-out may be on its way, and
// the controller writes nothing its view decides (docs/design.md), a
// wait, not a delay. The open streams are the server's ground truth.
func (w *world) viewsStream(a annotated) bool {
	open := func(res, ns string) bool {
		for _, s := range w.api.watches {
			if s.conn == w.proc.conn && s.c.res == res && (s.c.ns == "" || s.c.ns == ns) && !s.ended() {
				return true
			}
		}
		return false
	}
	return open(a.kind, a.ns) && (!w.consent || open("namespaces", ""))
}

// budgetAllows reports whether restarting p keeps every object that
// selects it and would restart it, or whose round is owed, within
// MAX_UNAVAILABLE. It counts every object that selects p, by reference
// too, over every pod it selects, where the budget check leaves out one
// whose readers narrow by key: a restart it cannot be sure is allowed is
// no round's delay. An object whose round is owed counts even where p
// runs its data (a replacement of that round): a wave keeps the budget of
// every round that selects the pod, begun or not yet (docs/design.md,
// waves), and restarting p would take that round's pods below it.
func (w *world) budgetAllows(p *pod) bool {
	for _, a := range w.annotatedObjects(p.ns) {
		if !w.selects(a, p) || (current(a, p) && !w.owesRound(a)) {
			continue
		}
		expected, available := w.counts(a, p, w.selects)
		if available < expected-w.allowed(expected) {
			return false
		}
	}
	return true
}

// owesRound reports whether a pod a selects does not run a's data, and no
// documented window explains it: a's round is in progress or due.
func (w *world) owesRound(a annotated) bool {
	for _, q := range w.alivePods() {
		if w.selects(a, q) && !current(a, q) && w.convergeWindow(a, q) == "" {
			return true
		}
	}
	return false
}
