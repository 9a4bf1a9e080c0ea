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
// time in [from, to], or a list that shows data changes was answered late:
// a change may have been seen late.
func (w *world) troubled(from, to time.Duration) bool {
	spans := append(slices.Clone(w.downs), w.faultSpans...)
	spans = append(spans, w.lateViews...)
	if w.downSince >= 0 {
		spans = append(spans, span{w.downSince, w.now()})
	}
	if w.faults.errRate > 0 || w.faults.lostRate > 0 {
		spans = append(spans, span{to, to})
	}
	return overlaps(spans, from, to)
}

// slowed reports whether answers were held at some time in [from, to]: a
// wait for them is no delay.
func (w *world) slowed(from, to time.Duration) bool {
	spans := slices.Clone(w.slowSpans)
	if w.faults.slowRate > 0 {
		spans = append(spans, span{to, to})
	}
	return overlaps(spans, from, to)
}

func overlaps(spans []span, from, to time.Duration) bool {
	for _, s := range spans {
		if s.from <= to && s.to >= from {
			return true
		}
	}
	return false
}

// capBucket models the controller's MAX_RESTARTS_PER_SECOND token bucket
// (a burst of ten times the rate, full when a controller starts) from the
// restarts it sent.
type capBucket struct {
	gen    int
	tokens float64
	at     time.Duration
}

// spend takes the token of a restart controller gen sent at at, and
// reports whether it was the cap's last: the next restart, of any round,
// waits for its turn. docs/operations.md: the cap is "across all objects",
// turns are "taken in the order restarts ask", and "a Ready pod waits for
// its turn": while the cap is spent, a round whose turn is behind other
// namespaces' restarts waits for the cap, not by a delay of its own, so
// such a restart is progress for every round (checkPrompt).
func (b *capBucket) spend(setting string, gen int, at time.Duration) bool {
	rate, err := strconv.Atoi(setting)
	if err != nil || rate <= 0 {
		return false
	}
	burst := float64(10 * rate)
	if gen != b.gen {
		*b = capBucket{gen: gen, tokens: burst, at: at}
	}
	b.tokens = min(burst, b.tokens+float64(rate)*(at-b.at).Seconds())
	b.at = at
	b.tokens--
	return b.tokens < 1
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
	paced := w.tokens.spend(w.env["MAX_RESTARTS_PER_SECOND"], r.conn.gen, r.at)
	for k, since := range w.waitSince {
		if since >= 0 && (paced || strings.Contains(k, "/"+p.ns+"/")) {
			delete(w.waitSince, k) // a restart is progress
		}
	}
	if len(sel) == 0 {
		if w.selChanged[k.ns] >= r.at {
			w.note("selection changed while the request was in flight")
			return
		}
		if w.selWriteUnseen(k.ns, r.conn.gen, r.at) {
			w.note("selection changed, not yet shown to the controller that sent the request")
			return
		}
		if w.removalUnseen(p, r.conn.gen, r.at) {
			w.note("an object deleted, its deletion not yet shown to the controller that sent the request")
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
		for _, a := range w.annotatedObjects(k.ns) {
			if w.bears(a, p) && w.behind(a) && !w.adoptedAsIs(a) {
				w.checkBudget(a, p, r)
			}
		}
	}
}

// bears reports whether restarting p, which a does not select, changes a's
// budget: a counts p's owner (it selects another of its live pods), whose
// desired replicas less its pods a does not select are a's expected pods
// (docs/design.md, waves): one of those gone is one more expected.
func (w *world) bears(a annotated, p *pod) bool {
	return !w.selects(a, p) && p.wl.kind != "" && slices.ContainsFunc(p.wl.live(), func(q *pod) bool { return q != p && w.inBudget(a, q) })
}

// adoptedAsIs reports whether a controller adopts a's data as it is now:
// a was created again while no controller ran, or with its namespace out
// at some time since its deletion (docs/design.md, Decisions: re-created
// ConfigMaps; an opted-out namespace's tombstones are not kept), and a has
// not changed since (since the next controller started, where none ran);
// or a was created again while its namespace was out
// and has not changed since it opted in again, or its namespace was out
// from the start and a last changed before it first opted in
// (docs/operations.md: a namespace that opts in later has its objects
// that carry no record adopted as they are then). Its pods are owed no
// restart for that data, and no round of it has a budget to keep, as none
// has for an object whose pods run its data.
func (w *world) adoptedAsIs(a annotated) bool {
	last := w.lastChange(a)
	if at, ok := w.adoptedRecreated[dataKey(a.kind, a.ns, a.name)]; ok {
		for _, s := range w.outSpans[a.ns] {
			if at >= s.from && at <= s.to {
				at = s.to // created while out: adopted as it is at the opt-in
			}
		}
		// Created while no controller ran: the next one to start sees
		// the object first, with the data of that moment, changes made
		// meanwhile included (docs/design.md, re-created ConfigMaps).
		downs := w.downs
		if w.downSince >= 0 {
			downs = append(slices.Clone(downs), span{w.downSince, w.now()})
		}
		for _, s := range downs {
			if at >= s.from && at <= s.to {
				at = s.to
			}
		}
		if last <= at {
			return true
		}
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
		case p.created >= last && w.createdUnseen(a, p, gen):
			return "created between a change and the controller seeing it"
		case p.created >= last && w.ownBound(p.ns, gen, last, p.created):
			return "created after the controller saw the change, before its round's own bound (an eviction, no index, a round's LIST)"
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
				return "replacement of a pod whose deletion's answer was lost or late"
			}
		}
		for _, at := range w.lateMarks {
			// The round took its pods before its mark answered: its bound
			// decides (docs/design.md, pods created after a change was
			// seen: "a mark still unanswered when the round takes its pods").
			if at >= last && at <= p.created {
				return "created after the controller saw the change, its mark's answer later than a round waits for it"
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

// outBetween reports whether namespace ns was out at some time from from
// to to, or is out now.
func (w *world) outBetween(ns string, from, to time.Duration) bool {
	if w.consent && labelsOf(w.api.get(key{"namespaces", "", ns}))[consentLabel] != "true" {
		return true
	}
	for _, s := range w.outSpans[ns] {
		if s.from <= to && s.to >= from {
			return true
		}
	}
	return false
}

// createdUnseen reports whether p was created before controller gen was
// first shown a's data of its last change (by a watch event or a list):
// before it saw the change. The server's deliveries are the ground truth
// of that moment, as docs/design.md has it ("normally the watch's few
// milliseconds"), not a guess at the watch's latency.
func (w *world) createdUnseen(a annotated, p *pod, gen int) bool {
	d := w.datas[dataKey(a.kind, a.ns, a.name)]
	for _, s := range w.sightings[fmt.Sprintf("%s/%d", dataKey(a.kind, a.ns, a.name), gen)] {
		if s.rv >= d.rv {
			return p.created <= s.at
		}
	}
	return true
}

// ownBound reports whether a pod created at created, after controller gen
// saw a change at since, may still be counted before it (docs/design.md,
// "What the model cannot see"): without an index the round's LIST is its
// bound, however late the round began (a selector refused until a fix);
// with one, where no DELETE's answer tells (evictions) or the round lists
// its pods (a LIST of ns since the change), its own bound, taken when it
// began, decides, and a round begins within milliseconds of the change or
// is marked (markRefused, noteSeen).
func (w *world) ownBound(ns string, gen int, since, created time.Duration) bool {
	if w.env["POD_INDEX"] != "true" {
		return true
	}
	if created-since >= 2*time.Second {
		return false
	}
	if w.env["RESTART_STRATEGY"] == "evict" {
		return true
	}
	for _, l := range w.podLists {
		if l.gen == gen && (l.ns == ns || l.ns == "") && l.at >= since {
			return true
		}
	}
	return false
}

// selWriteUnseen reports whether an object of namespace ns still there
// had its selector written, at its last such write, before at and the
// server had not shown that write to controller gen by then (a watch cut,
// an answer held): the controller decided on the selection it was shown,
// and the pod's own preconditions (uid, resourceVersion) cannot tell it
// of a write to another object. A write shown at the very instant the
// request was sent may have come after it.
func (w *world) selWriteUnseen(ns string, gen int, at time.Duration) bool {
	for dk, wr := range w.selWrites {
		d := w.datas[dk]
		if d == nil || d.ns != ns || w.api.get(key{d.kind, d.ns, d.name}) == nil {
			continue
		}
		shown := false
		for _, s := range w.sightings[fmt.Sprintf("%s/%d", dk, gen)] {
			if s.rv >= wr.rv && s.at < at {
				shown = true
				break
			}
		}
		if !shown {
			return true
		}
	}
	return false
}

// removalUnseen reports whether an object that selected p when it was
// deleted, and that the server had shown controller gen, was deleted
// before at, and the server had not shown that deletion to gen by then (a
// watch cut, a LIST answer held since before it): as with a selector write
// (selWriteUnseen), the controller decided on the objects it was shown,
// and RELIABILITY.md's bystander judges by them. A deletion shown at the
// very instant the request was sent may have come after it; a later
// revision of the object created again shows it too.
func (w *world) removalUnseen(p *pod, gen int, at time.Duration) bool {
	for dk, rm := range w.removals {
		if !rm.ok || !w.selects(rm.as, p) || !w.shownTo[fmt.Sprintf("%s/%d", rm.uid, gen)] {
			continue
		}
		shown := false
		for _, s := range w.removalsShown[fmt.Sprintf("%s/%d", dk, gen)] {
			shown = shown || s.rv >= rm.rv && s.at < at
		}
		for _, s := range w.sightings[fmt.Sprintf("%s/%d", dk, gen)] {
			shown = shown || s.rv > rm.rv && s.at < at
		}
		if !shown {
			return true
		}
	}
	return false
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
	if available+w.unshownDrops(a, p, r) >= expected-w.allowed(expected) {
		w.note("a pod became unavailable, not yet shown to the controller that sent the restart")
		return
	}
	if expected, available := w.countsAsRead(a, p, r); available >= expected-w.allowed(expected) {
		w.note("an owner scaled up within the second before the restart, after its scale was read, its pods not created then")
		return
	}
	if expected, available := w.countsShown(a, p, r); available >= expected-w.allowed(expected) {
		w.note("pods no view shown to the controller that sent the restart showed: a DaemonSet's pod for its node come back, or every pod of a new owner")
		return
	}
	w.violate("budget", "%s/%s restarted for %s/%s leaves %d available of %d expected (MAX_UNAVAILABLE %s)", p.ns, p.name, a.kind, a.name, available, expected, w.budget)
}

// unshownDrops counts a's pods, other than p, that the controller of r
// was shown before they became unavailable (not Ready, or removed by
// anyone but the controller) while available, and not shown since before
// r was sent: docs/design.md (waves) counts a pod as the server last
// showed it, by a pods watch's event or a pod LIST's answer taken after
// the drop. A view taken at the drop's very instant may have come after
// it.
func (w *world) unshownDrops(a annotated, p *pod, r *request) int {
	n := 0
	for _, wl := range w.wls {
		if wl.ns != a.ns || wl.kind == "" {
			continue
		}
		for _, q := range wl.pods {
			if q == p || !q.availAtDrop || (q.alive && w.available(q)) || (!q.alive && q.restarted) || !w.inBudget(a, asAlive(q)) {
				continue
			}
			before, since := false, false
			for _, k := range []string{q.uid, q.ns, "*"} {
				for _, v := range w.podViews[fmt.Sprintf("%s/%d", k, r.conn.gen)] {
					if v.at >= r.at {
						continue
					}
					before = before || v.made < q.dropped
					since = since || v.made >= q.dropped
				}
			}
			if before && !since {
				n++
			}
		}
	}
	return n
}

// countsShown is checkBudget's counts without the pods no view shown to
// r's controller before r was sent could have counted: docs/design.md
// (waves) counts the pods and owners the server showed the controller.
// Left out: a DaemonSet's pod created for its node come back where no
// view showed it (a node come back is seen only by its pod; a pod
// recreated on a node that stayed is no such pod: the estimate keeps
// counting the one it replaces), and every pod of an owner none of whose
// pods a view showed (a ReplicaSet a rollout has just made: owners are
// learnt from their pods).
func (w *world) countsShown(a annotated, p *pod, r *request) (expected, available int) {
	shown := func(q *pod) bool {
		for _, k := range []string{q.uid, q.ns, "*"} {
			for _, v := range w.podViews[fmt.Sprintf("%s/%d", k, r.conn.gen)] {
				if v.at < r.at && v.made >= q.created && (q.alive || v.made <= q.dropped) {
					return true
				}
			}
		}
		return false
	}
	known := map[*workload]bool{}
	for _, wl := range w.wls {
		known[wl] = slices.ContainsFunc(wl.pods, shown)
	}
	return w.countsOf(a, p, func(a annotated, q *pod) bool {
		return w.inBudget(a, q) && known[q.wl] && (!q.returned || shown(q))
	}, func(wl *workload) (int, time.Duration) { return wl.replicas, -1 })
}

// asAlive is q as it was before its removal, if removed: a's selection
// of a pod removed by other hands is judged on the labels it had then,
// which its removal leaves as they were (selects takes no removed pod).
func asAlive(q *pod) *pod {
	if q.alive {
		return q
	}
	c := *q
	c.alive = true
	return &c
}

// countsAsRead is checkBudget's counts with each ReplicaSet scaled up
// within the second before restart r, after the last answer to r's
// controller of its scale, at its replicas before: docs/design.md (waves)
// reads an owner's scale at most once a second, and a scale-up within
// that second, its pods not created yet, shows in no count. The pods
// created since are left out, as the view that counted did not show them.
func (w *world) countsAsRead(a annotated, p *pod, r *request) (expected, available int) {
	return w.countsOf(a, p, w.inBudget, func(wl *workload) (int, time.Duration) {
		replicas, since := wl.replicas, time.Duration(-1)
		read, ok := wl.scaleRead[r.conn.gen]
		for i := len(wl.scaled) - 1; i >= 0; i-- {
			c := wl.scaled[i]
			if c.at > r.at || r.at-c.at >= time.Second || (ok && c.at <= read) {
				break
			}
			replicas, since = c.from, c.at
		}
		if since >= 0 && replicas > wl.replicas {
			return wl.replicas, -1 // a scale-down since: judged as it is
		}
		return replicas, since
	})
}

// counts returns a's expected and available pods were p gone, a's pods
// those in says a counts (inBudget, or selects).
func (w *world) counts(a annotated, p *pod, in func(annotated, *pod) bool) (expected, available int) {
	return w.countsOf(a, p, in, func(wl *workload) (int, time.Duration) { return wl.replicas, -1 })
}

// countsOf is counts with a ReplicaSet's desired replicas from replicas,
// which also says since when pods created are left out (-1: none).
func (w *world) countsOf(a annotated, p *pod, in func(annotated, *pod) bool, replicas func(*workload) (int, time.Duration)) (expected, available int) {
	for _, wl := range w.wls {
		if wl.ns != a.ns || wl.kind == "" {
			continue // the budget counts owned pods
		}
		desiredRS, since := replicas(wl)
		selected, other := 0, 0
		for _, q := range wl.live() {
			if since >= 0 && q.created > since || q == p && !in(a, q) {
				continue // p, one of the owner's pods a does not count, gone
			}
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
			desired = desiredRS
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
	if _, ok := w.adoptedRecreated[dk]; ok {
		return "object deleted or created again while no controller ran, or while its namespace was out: adopted"
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

// checkPrompt, every second: no round waits more than 3 s (one that may be
// halted without an index, 13 s: haltedLook) while a pod it waits for is
// Ready and every budget that counts it allows its restart.
// Judged only where the ground truth can tell: objects selecting by labels
// alone, a controller running for 20 s with no fault meanwhile and no
// retry backoff left (retrying), its watches open, no bad data in the
// namespace, no freeze (frozen), no storm, no SETTLE wait (settledSince),
// no change in the last 2 s, no DaemonSet node lost within the window
// noteNodeLost says.
func (w *world) checkPrompt() {
	if w.waitSince == nil {
		w.waitSince = map[string]time.Duration{}
	}
	now := w.now()
	settle, _ := time.ParseDuration(w.env["SETTLE"])
	calm := w.proc != nil && now-w.procSince >= 20*time.Second && !w.troubled(now-20*time.Second, now) && !w.slowed(now-20*time.Second, now)
	for _, ns := range w.nss {
		objs := w.annotatedObjects(ns)
		bad := false
		for _, a := range objs {
			bad = bad || hasBad(a.data)
		}
		for _, a := range objs {
			k := dataKey(a.kind, a.ns, a.name)
			estimating := now < w.nodeLost[ns] || w.resumedAfterNodeLost(ns, now)
			if !calm || bad || w.retrying(a, now) || w.frozen(a) || a.sel == nil || a.byRef || w.storm(a) || now-w.settledSince(a, objs, settle) < settle+2*time.Second || !w.viewsStream(a) || estimating {
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
			case now-since > 3*time.Second+w.haltedLook(a)+w.stalled(since, now) && since >= 0:
				w.violate("prompt", "the round of %s waited %.1fs while %s/%s was Ready, not on its data, and every budget allowed its restart", k, (now - since).Seconds(), ready.ns, ready.name)
				w.waitSince[k] = -1 // said once
			}
		}
	}
}

// maxBackOff is the longest retry backoff of a round a fault failed
// (docs/design.md: 0.8 s doubling, 30 s cap; apiclient.RetryDelay).
const maxBackOff = 30 * time.Second

// retrying reports whether a's round may be waiting out its retry
// backoff: a request sent for it (a's object, or a pod of its namespace:
// a list, a restart) was failed by a fault (a 5xx, a 504 by a proxy, an
// answer lost) less than maxBackOff ago. The backoff is the documented
// wait, and it outlasts the 20 s calm after the fault.
func (w *world) retrying(a annotated, now time.Duration) bool {
	for _, f := range slices.Backward(w.faulted) {
		if now-f.at > maxBackOff {
			return false
		}
		if (f.ns == a.ns || f.ns == "") && f.res == "pods" || f.ns == a.ns && f.res == a.kind && f.name == a.name {
			return true
		}
	}
	return false
}

// settledSince is when the SETTLE wait of a's round began: a's last
// change or, with SETTLE, the last change of an object of its namespace
// (objs) that selects a pod a selects. docs/operations.md: "a round's
// first restart waits until no annotated object of its namespace
// selecting any of its pods has changed for SETTLE". The ground truth
// cannot tell whether a's round has sent its first restart (another
// round's restarts of the same pods look alike), so the wait counts
// until then.
func (w *world) settledSince(a annotated, objs []annotated, settle time.Duration) time.Duration {
	last := w.lastChange(a)
	if settle <= 0 {
		return last
	}
	for _, b := range objs {
		if w.lastChange(b) <= last {
			continue
		}
		for _, p := range w.alivePods() {
			if w.selects(a, p) && w.selects(b, p) {
				last = w.lastChange(b)
				break
			}
		}
	}
	return last
}

// haltedLook is the longer wait of a round that may be halted: without a
// pod index, a halted round looks every 10 s, not every second
// (docs/design.md, waves: "halts, which changes ... without an index, how
// often it looks (every 10 s)"), and it stays halted until a restart of
// its own.
func (w *world) haltedLook(a annotated) time.Duration {
	if w.env["POD_INDEX"] != "false" || !w.mayBeHalted(a) {
		return 0
	}
	return 10 * time.Second
}

// mayBeHalted reports whether a's round may be halted: since a's last
// change, no pod a selects was restarted (by any round: one whose pods
// another restarts does not halt) for PROGRESS_DEADLINE. The ground truth
// cannot tell a restart of its own from another round's, so any such
// stall counts.
func (w *world) mayBeHalted(a annotated) bool {
	deadline, err := time.ParseDuration(w.env["PROGRESS_DEADLINE"])
	if err != nil {
		return false
	}
	last := w.lastChange(a)
	sent := []time.Duration{last, w.now()}
	for _, wl := range w.wls {
		for _, p := range wl.pods {
			if p.restarted && p.restartSent >= last && p.ns == a.ns && w.selects(a, p) {
				sent = append(sent, p.restartSent)
			}
		}
	}
	slices.Sort(sent)
	for i := 1; i < len(sent); i++ {
		if sent[i]-sent[i-1] >= deadline {
			return true
		}
	}
	return false
}

// frozen reports whether a's round may be halted while a replacement of
// it is not available: docs/design.md, waves: "while its own replacements
// are not available it restarts nothing (a freeze)", until they are or a
// new change comes. A pod a selects, created since a's last change and
// crash-looping, may be such a replacement (on another object's bad data,
// which may since be gone: deleted, not fixed, it brings no pod back), so
// the round's wait is the freeze, not a delay.
func (w *world) frozen(a annotated) bool {
	if !w.mayBeHalted(a) {
		return false
	}
	last := w.lastChange(a)
	for _, p := range w.alivePods() {
		if p.bad && p.created >= last && w.selects(a, p) {
			return true
		}
	}
	return false
}

// noteNodeLost notes the wait that node of wl lost explains in its
// namespace (checkPrompt). A DaemonSet has no scale: a pod gone by other
// hands counts in its estimate for 30 s (docs/design.md, waves), then a
// wave's look. A restart of the node's pod sent in the last 2 minutes
// counts as owed until its replacement is seen, for 2 minutes at most
// (the in-flight bound): one created and lost with the node between two
// counts is never seen.
func (w *world) noteNodeLost(wl *workload, node int) {
	w.nodesLostAt[wl.ns] = append(w.nodesLostAt[wl.ns], w.now())
	until := w.now() + 32*time.Second
	for _, p := range wl.pods {
		if p.restarted && p.node == node && w.now()-p.restartSent < 2*time.Minute {
			until = max(until, p.restartSent+2*time.Minute+2*time.Second)
		}
	}
	w.nodeLost[wl.ns] = max(w.nodeLost[wl.ns], until)
}

// resumedAfterNodeLost: the running controller first viewed ns's pods
// less than 32 s ago, after a DaemonSet node of ns was lost: docs/design.md
// (waves) has a resumed round owe the pods its intent names that are gone
// for 30 s, as an earlier process's restarts, and a pod gone with its node
// looks the same.
func (w *world) resumedAfterNodeLost(ns string, now time.Duration) bool {
	if w.proc == nil {
		return false
	}
	first := time.Duration(-1)
	for _, k := range []string{ns, "*"} {
		for _, v := range w.podViews[fmt.Sprintf("%s/%d", k, w.proc.gen)] {
			if first < 0 || v.at < first {
				first = v.at
			}
		}
	}
	return first >= 0 && now < first+32*time.Second && slices.ContainsFunc(w.nodesLostAt[ns], func(t time.Duration) bool { return t <= first })
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
// selects it and would restart it, or whose round is owed, and every
// object whose round is owed that p's restart bears on (bears), within
// MAX_UNAVAILABLE. It counts every object that selects p, by reference
// too, over every pod it selects, where the budget check leaves out one
// whose readers narrow by key: a restart it cannot be sure is allowed is
// no round's delay. An object whose round is owed counts even where p
// runs its data (a replacement of that round): a wave keeps the budget of
// every round that selects the pod, begun or not yet (docs/design.md,
// waves), and restarting p would take that round's pods below it; so does
// one whose round may not have ended (replacing).
func (w *world) budgetAllows(p *pod) bool {
	for _, a := range w.annotatedObjects(p.ns) {
		switch {
		case w.bears(a, p):
			if !w.owesRound(a) {
				continue
			}
		case !w.selects(a, p) || (current(a, p) && !w.owesRound(a) && !w.replacing(a)):
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
// documented window explains it, or runs it and a documented window
// (window) lets a's round restart it all the same for the running
// controller (one created after the change, before the round's own
// bound): a's round is in progress or due, and it keeps its budget
// while that pod is pending.
func (w *world) owesRound(a annotated) bool {
	if w.behind(a) {
		return true
	}
	for _, q := range w.alivePods() {
		if w.selects(a, q) && current(a, q) && w.proc != nil && w.window(q, []annotated{a}, w.proc.gen) != "" {
			return true
		}
	}
	return false
}

// replacing reports whether a's round may still be in progress with
// every pod it selects on its data: a pod it selects was restarted since
// a's last change and a replacement of it is not yet available. Until it
// is, the round has not ended, and docs/design.md (waves) counts its
// budget "for every round that selects a candidate or another pod of its
// owner". The ground truth cannot tell whose round sent that restart, so
// any restart counts.
func (w *world) replacing(a annotated) bool {
	last := w.lastChange(a)
	for _, r := range w.alivePods() {
		if !w.selects(a, r) || w.available(r) || r.wl.kind == "" {
			continue
		}
		for _, q := range r.wl.pods {
			if q.restarted && q.restartSent >= last && r.created >= q.restartSent && (r.wl.kind != "DaemonSet" || q.node == r.node) {
				return true
			}
		}
	}
	return false
}

// behind reports whether a pod a selects does not run a's data, and no
// documented window explains it: a's round is in progress (it cannot have
// ended), or due.
func (w *world) behind(a annotated) bool {
	return slices.ContainsFunc(w.alivePods(), func(q *pod) bool {
		return w.selects(a, q) && !current(a, q) && w.convergeWindow(a, q) == ""
	})
}
