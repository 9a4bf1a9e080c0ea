package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The budget of a round in waves is counted as Kubernetes' disruption
// controller counts a PodDisruptionBudget's, over the pods the round's
// selector picks, on one view of the namespace taken now:
//
//   - expected: for each controller owner of a selected pod, its desired
//     replicas (owners.go), or its running pods if more, less its live pods
//     the selector does not pick; where a read got no answer that tells
//     (none, a 5xx, a 429), unknown: no pod that needs the budget goes
//     until a read answers, as the disruption controller allows no
//     disruption while it cannot count; where they cannot be read (RBAC, no
//     scale subresource), the most live pods of that owner seen since the
//     round began: terminating ones
//     included in the first view of it (a StatefulSet replaces a pod only
//     once it is gone), not in later ones (a ReplicaSet's replacement and
//     the pod it replaces are both live for a while: a live view, or a
//     LIST while the old pod's grace period runs, shows both), less the
//     pods gone since that no round restarted (left by other hands: a
//     DaemonSet that lost a node wants one fewer for good) once a count
//     has missed them for leftAfter, as far as its live pods are fewer
//     than before; and never
//     fewer than its running pods and those a round of the namespace
//     restarted (this one, its forerunner, another object's) that are
//     gone with no replacement seen yet (owed), while their restarts are
//     in flight;
//   - available: selected, live, owned, not terminating, Ready for at least
//     MinReadySeconds, and not a restart in flight;
//   - a Ready pod is restarted only while, after it, available stays at
//     least expected - MaxUnavailable of expected, for every round that
//     selects it.
//
// A restart is in flight from the moment it is chosen until its answer
// proves that nothing was deleted, or a view newer than an answer that
// does not tell (a 5xx, a timeout, a cut connection) shows the pod, with
// its uid, not terminating (settleUnsure), or else until 2 minutes have
// passed (the disruption controller's deletion timeout); a pod deleted
// since is no longer in any view, and one terminating is not available, so
// the entry only matters while a view still shows the pod running.
// Choosing and counting are one step under the namespace's lock,
// which no request is sent under. Nothing else decides availability: a lost
// DELETE answer, a pod that left, another round's restarts, a scale-up or a
// scale-down all show in the counts.

// inFlightFor is how long a chosen restart counts as unavailable at most.
const inFlightFor = 2 * time.Minute

// leftAfter is how long a pod gone by other hands keeps counting in its
// owner's estimate: the owner's controller creates a replacement within a
// second or two of the pod being gone, and 30 s also covers a failover of
// kube-controller-manager (a 15 s lease, then its informers' sync). A node
// removed makes the rounds over its DaemonSet wait that long.
const leftAfter = 30 * time.Second

// leftPod is a pod gone by other hands: its owner uid, and when a count
// first missed it (round.left).
type leftPod struct {
	owner string
	at    time.Time
}

// estimate is the first owner (by uid) a round could not read the desired replicas
// of: it says so once (waves.go).
type estimate struct {
	owner ownerRef
	pods  int
	err   error
	said  bool
}

// namespaceBudget is what the rounds of one namespace share.
type namespaceBudget struct {
	mu       sync.Mutex
	inFlight map[string]restartChosen // by pod uid
	// counts numbers the counts of the namespace's rounds; firstSeen is,
	// for each owned pod a count showed live while a restart was in
	// flight, the first count that did, its owner and node: a pod first
	// shown after a restart was chosen is the kind of pod that replaces it
	// (owed).
	counts    uint64
	firstSeen map[string]seenPod
	// deletions are the latest maxDeletions DELETEs the namespace's rounds
	// sent, oldest first: when each was sent, and the revision it answered
	// (0 while in flight); those refused are forgotten (seenAfter).
	deletions []deletion
	// answered, made when someone waits (waitAnswers), is closed at the
	// next answer.
	answered chan struct{}
	// listedUpTo is the newest pod revision a LIST of the namespace's
	// pods showed (viewOf): an index that has not shown that far (its
	// watch resumed, the events since not in yet) is older than a view a
	// count already took, and would take back what that LIST showed: a
	// replacement created meanwhile, counted gone by other hands, lowers
	// its owner's estimate, and the budget with it.
	listedUpTo uint64
	// lastRestart is when a round of the namespace last sent a DELETE or
	// an eviction (Unix nanoseconds), read without mu (replacementsDue).
	lastRestart atomic.Int64
	// live is the owner uid of each owned live pod the namespace's last
	// count showed, by pod uid: a round begins from it too (take).
	live map[string]string
	// listedAt is the revision of the newest LIST of the namespace's pods
	// answered: a wave whose own LIST is older would count behind a view
	// the controller already has (listedSince).
	listedAt uint64
}

// noteListed notes the pods a LIST of the namespace at revision at showed.
func (b *namespaceBudget) noteListed(pods []livePod, at uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range pods {
		b.listedUpTo = max(b.listedUpTo, pods[i].version)
	}
	b.listedAt = max(b.listedAt, at)
}

// listedSince reports whether a LIST of the namespace newer than
// revision at has answered.
func (b *namespaceBudget) listedSince(at uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.listedAt > at
}

// indexCaughtUp reports whether an index that has shown every pod event up
// to shown is at least as new as every LIST taken.
func (b *namespaceBudget) indexCaughtUp(shown uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return shown >= b.listedUpTo
}

// deletion is a DELETE sent at moment at (Controller.moment), answered at
// pod revision rv (0: no answer yet).
type deletion struct{ at, rv uint64 }

// maxDeletions bounds namespaceBudget.deletions: a round asks about those
// sent since its change was seen, within seconds. One forgotten makes a
// cutoff later, never earlier: a restart too many, not one too few.
const maxDeletions = 256

// noteSent notes a DELETE about to be sent at moment at.
func (b *namespaceBudget) noteSent(at uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.deletions) == maxDeletions {
		b.deletions = slices.Delete(b.deletions, 0, 1)
	}
	b.deletions = append(b.deletions, deletion{at: at})
}

// noteAnswer notes the answer to the DELETE sent at moment at: the
// revision it answered, or 0 if it deleted nothing (refused, not found, an
// eviction's Status), which forgets it.
func (b *namespaceBudget) noteAnswer(at, rv uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.IndexFunc(b.deletions, func(d deletion) bool { return d.at == at }); i >= 0 {
		if rv == 0 {
			b.deletions = slices.Delete(b.deletions, i, i+1)
		} else {
			b.deletions[i].rv = rv
		}
	}
	if b.answered != nil {
		close(b.answered)
		b.answered = nil
	}
}

// seenAfter returns the lowest pod revision a DELETE of any round of the
// namespace sent after moment answered (math.MaxUint64: none), and whether
// one sent after it is not answered yet. Sent after the moment a change was
// seen, the DELETE was carried out after it: every pod created before that
// moment has a lower revision, and a replacement it caused a higher one.
// b.mu must be held.
func (b *namespaceBudget) seenAfter(moment uint64) (low uint64, inFlight bool) {
	low = math.MaxUint64
	for _, d := range b.deletions {
		switch {
		case d.at <= moment:
		case d.rv == 0:
			inFlight = true
		default:
			low = min(low, d.rv)
		}
	}
	return low, inFlight
}

// cutoffAfter returns seenAfter(moment) once no DELETE sent after moment
// is in flight, waiting up to wait for their answers: the index may show a
// deletion, and its replacement, before the DELETE's answer comes back.
// Where one is still unanswered then, its replacement may be taken: a
// restart too many, not one too few.
func (b *namespaceBudget) cutoffAfter(ctx context.Context, moment uint64, wait time.Duration) uint64 {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		low, inFlight := b.seenAfter(moment)
		if !inFlight {
			b.mu.Unlock()
			return low
		}
		if b.answered == nil {
			b.answered = make(chan struct{})
		}
		answered := b.answered
		b.mu.Unlock()
		select {
		case <-answered:
		case <-timer.C:
			return low
		case <-ctx.Done():
			return low
		}
	}
}

// restartChosen is a restart in flight: when, and for which object's
// rounds (by key), it was chosen. No round of another object chooses the
// pod while it is in flight; a later round of the same object may (the
// earlier one's request may have failed).
type restartChosen struct {
	at  time.Time
	by  string
	pod string // its name, for a re-read
	// unsure is the moment (Controller.moment) of an answer that did not
	// tell whether the request deleted the pod; 0: none came.
	unsure uint64
	// owner is the pod's owner uid ("": a bare pod); count, the count it
	// was chosen on (namespaceBudget.counts); node, for a pod its owner
	// replaces on its node (replacedOnItsNode), that node ("": any).
	owner string
	count uint64
	node  string
	// shown is the pod as the view that chose it showed it (zero for an
	// earlier process's restart): a round begun after it was gone, whose
	// view shows none of its owner's pods, still counts that owner.
	shown livePod
	// resumed: an earlier process's restart (oweResumed), made before this
	// process began: its replacement is due within seconds of it, so it
	// is owed for leftAfter, as a pod gone by other hands (it may be one:
	// a DaemonSet's node removed while no replica ran), not inFlightFor.
	resumed bool
}

// expires returns when the restart stops counting in flight.
func (c restartChosen) expires() time.Time {
	if c.resumed {
		return c.at.Add(leftAfter)
	}
	return c.at.Add(inFlightFor)
}

// seenPod is a pod's first count, its owner and its node
// (namespaceBudget.firstSeen).
type seenPod struct {
	count       uint64
	owner, node string
}

// budgetOf returns the shared budget state of namespace.
func (c *Controller) budgetOf(namespace string) *namespaceBudget {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.budgets[namespace]
	if b == nil {
		b = &namespaceBudget{inFlight: map[string]restartChosen{}}
		c.budgets[namespace] = b
	}
	return b
}

// release takes a restart out of flight: its answer proved nothing was
// deleted (a failed precondition, a refusal, a disruption budget's 429).
func (b *namespaceBudget) release(uid string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.inFlight, uid)
}

// noteUnsure notes that the restart of pod uid was answered, at moment at,
// in a way that does not tell whether it deleted the pod.
func (b *namespaceBudget) noteUnsure(uid string, at uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if chosen, ok := b.inFlight[uid]; ok {
		chosen.unsure = at
		b.inFlight[uid] = chosen
	}
}

// settleUnsure decides, in view's namespace, the restarts whose answer did
// not tell whether they deleted their pod: a view newer than that answer
// that shows the pod, with its uid, not terminating, shows that nothing
// was deleted, and the restart is taken out of flight; the 2-minute bound
// is left for what no view settles. That view is a re-read of the pod by
// name (a consistent LIST) sent after the answer, asked only for a pod the
// round's view shows running: one the request deleted is terminating or
// gone in any later view, and counts unavailable there anyway. An error of
// a re-read fails the wave, which is retried.
func (c *Controller) settleUnsure(ctx context.Context, namespace string, b *namespaceBudget, view []livePod) error {
	running := make(map[string]bool, len(view))
	for i := range view {
		if p := &view[i]; !p.terminating && p.live() {
			running[p.uid] = true
		}
	}
	type unsure struct {
		uid, pod string
		at       uint64
	}
	var check []unsure
	b.mu.Lock()
	for uid, chosen := range b.inFlight {
		if chosen.unsure != 0 && running[uid] {
			check = append(check, unsure{uid: uid, pod: chosen.pod, at: chosen.unsure})
		}
	}
	b.mu.Unlock()
	slices.SortFunc(check, func(a, b unsure) int { return strings.Compare(a.pod, b.pod) })
	for _, u := range check {
		p, found, err := c.reread(ctx, namespace, u.pod)
		if err != nil {
			return fmt.Errorf("re-read pod %s/%s after an answer that did not tell whether it was deleted: %w", namespace, u.pod, err)
		}
		if !found || p.uid != u.uid || p.terminating {
			continue
		}
		b.mu.Lock()
		if chosen, ok := b.inFlight[u.uid]; ok && chosen.unsure == u.at { // not chosen again meanwhile
			delete(b.inFlight, u.uid)
		}
		b.mu.Unlock()
	}
	return nil
}

// prune forgets restarts in flight that expired. b.mu must be held.
func (b *namespaceBudget) prune(now time.Time) {
	for uid, chosen := range b.inFlight {
		if !now.Before(chosen.expires()) {
			delete(b.inFlight, uid)
		}
	}
}

// tally is one round's budget on a view: its available pods and, by owner
// it counts, the desired replicas and the live pods it does not select, as
// the restarts a wave chooses change them (shift).
type tally struct {
	sel       *selection
	available int
	owners    map[string]*ownerTally
	budget    Budget
	// held: an owner's scale read got no answer that tells; no pod that
	// needs this budget goes until one does (readAgainAt).
	held bool
	// For needsBudget: a restart chosen takes an available pod.
	minReady time.Duration
	now      time.Time
}

// ownerTally is one owner in a tally.
type ownerTally struct{ desired, unselected int }

// allowed is how many more of the round's pods may go unavailable: the
// disruption controller's arithmetic, expected pods being each owner's
// desired replicas less its live pods the round does not select.
func (t *tally) allowed() int {
	expected := t.expected()
	return t.available - (expected - t.budget.of(expected))
}

// expected sums each owner's desired replicas less its live pods the
// round does not select.
func (t *tally) expected() int {
	n := 0
	for _, o := range t.owners {
		n += max(o.desired-o.unselected, 0)
	}
	return n
}

// shift counts p's restart (by -1), or takes it back (+1): a pod the round
// selects is one available pod fewer; one of an owner it counts that it
// does not select is one of that owner's other pods fewer, so one more of
// its replicas is expected among the round's.
func (t *tally) shift(p *livePod, by int) {
	switch o := t.owners[p.owner.uid]; {
	case t.sel.selects(p):
		if needsBudget(p, t.minReady, t.now) {
			t.available += by
		}
	case o != nil && p.live() && !p.terminating:
		o.unselected += by
	}
}

// allows reports whether restarting p leaves t within its budget: where it
// takes one more of t's expected pods down (one available fewer, or one
// more expected), t must not be held and must stay within it after, though
// a percentage's budget may grow with expected: over it already, a round
// is not to go further over.
func (t *tally) allows(p *livePod) bool {
	down := t.expected() - t.available
	t.shift(p, -1)
	ok := t.expected()-t.available <= down || (!t.held && t.allowed() >= 0)
	t.shift(p, 1)
	return ok
}

// count makes round r's tally on view. expected comes from the owners'
// desired replicas, or r's estimate of them (r.mostSeen, updated here).
// b.mu must be held.
func (c *Controller) count(b *namespaceBudget, r *round, view []livePod, now time.Time) *tally {
	type ownerCount struct {
		ref ownerRef
		// Live pods: selected (terminating ones too), not selected and
		// not terminating, not terminating, and all of them.
		selected, unselected, running, counted int
		// shownNone: the view shows none of its pods the round selects
		// (it may show others), and an earlier count showed some (each
		// restarted, its replacement not created yet): it still wants
		// them.
		shownNone bool
	}
	byOwner := map[string]*ownerCount{}
	available := 0
	b.noteShown(view)
	for i := range view {
		p := &view[i]
		if !p.owned() || !p.live() {
			continue
		}
		o := byOwner[p.owner.uid]
		if o == nil {
			o = &ownerCount{ref: p.owner}
			byOwner[p.owner.uid] = o
		}
		o.counted++
		selected := r.sel.selects(p)
		_, chosen := b.inFlight[p.uid] // restarted: going, whatever the view shows
		switch {
		case selected:
			o.selected++
		case !p.terminating && !chosen:
			o.unselected++
		}
		if !p.terminating {
			o.running++
		}
		if selected && !chosen && p.available(c.cfg.MinReadySeconds, now) {
			available++
		}
	}
	// Pods live at the last count and gone (or finished) since, that no
	// round of the namespace restarted, left by other hands (a DaemonSet's
	// node removed, a scale-down): their owner is estimated to want that
	// many fewer, once leftAfter has passed. A DaemonSet replaces a pod
	// deleted on a node that stays only once it is gone: lowered at once,
	// the estimate would widen the budget until the replacement shows.
	live := ownedLive(view)
	if r.left == nil {
		r.left = map[string]leftPod{}
	}
	b.live = live
	for uid, owner := range r.live {
		if _, ours := b.inFlight[uid]; live[uid] == "" && !ours {
			r.left[uid] = leftPod{owner: owner, at: now}
		}
	}
	r.live = live
	left := map[string]int{}
	for uid, l := range r.left {
		if now.Sub(l.at) >= leftAfter {
			left[l.owner]++
			delete(r.left, uid)
		}
	}
	t := &tally{sel: r.sel, available: available, owners: map[string]*ownerTally{}, budget: c.cfg.MaxUnavailable, minReady: c.cfg.MinReadySeconds, now: now}
	var unanswered *estimate // the first owner whose read got no answer that tells
	if r.mostSeen == nil {
		r.mostSeen = map[string]int{} // counted before it took its pods, or never to take them
	}
	if r.owners == nil {
		r.owners = map[string]ownerRef{}
	}
	// stillWanted marks the owner of ref as shownNone where the view shows
	// none of its pods the round selects: none at all, or only others
	// while a pod of it the round selected is gone with its replacement
	// not shown yet (replacementDue). Once shown, a replacement the round
	// does not select (the pod it replaced labelled by hand, not by the
	// owner's template) leaves the round none of that owner's pods, and
	// the owner counts no more, as in the disruption controller's count:
	// counted on, each restart of its other pods would be one more down
	// of the round's, and hold the other rounds over them on its budget.
	stillWanted := func(ref ownerRef) {
		switch o := byOwner[ref.uid]; {
		case o == nil:
			byOwner[ref.uid] = &ownerCount{ref: ref, shownNone: true}
		case o.selected == 0 && b.replacementDue(r, ref.uid, live):
			o.shownNone = true
		}
	}
	for _, ref := range r.owners {
		stillWanted(ref)
	}
	// So is the owner of a pod the round selects that a round of the
	// namespace restarted (its forerunner, superseded; another object's)
	// and that is gone, with none of that owner's pods shown: a round
	// begun after every one of them was restarted never saw the owner,
	// and would count none of the replicas it still wants.
	for uid, chosen := range b.inFlight {
		if p := &chosen.shown; p.owned() && live[uid] == "" && r.sel.selects(p) {
			stillWanted(p.owner)
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(byOwner)) { // the estimate told is the first's
		o := byOwner[uid]
		seen, before := r.mostSeen[uid]
		if before {
			// Never below its live pods, terminating ones too: a pod
			// that left was replaced meanwhile if they are as many as
			// before, and a restart terminating still wants its pod.
			r.mostSeen[uid] = max(seen-left[uid], min(seen, o.counted), o.running)
		} else {
			r.mostSeen[uid] = o.counted
		}
		if o.selected == 0 && !o.shownNone {
			delete(r.owners, uid)
			continue // an owner none of whose pods the round selects
		}
		r.owners[uid] = o.ref
		desired, err := c.owners.desired(uid)
		if err != nil {
			desired = max(r.mostSeen[uid], o.running+b.owed(uid, live, nil))
			switch {
			case errors.Is(err, errUnanswered):
				if unanswered == nil {
					unanswered = &estimate{owner: o.ref, pods: desired, err: err}
				}
			case r.estimate == nil && !errors.Is(err, errNotRead): // none read: no pod needs the budget
				r.estimate = &estimate{owner: o.ref, pods: desired, err: err}
			}
		}
		// Never fewer than it runs: a read a second old must not widen
		// the budget behind a scale-up.
		t.owners[uid] = &ownerTally{desired: max(desired, o.running), unselected: o.unselected}
	}
	// Read again (readAgainAt) before a pod that needs the budget goes;
	// said once per round where that held one back.
	t.held = unanswered != nil
	if t.held && t.allowed() > 0 && r.unanswered == nil {
		r.unanswered = unanswered
	}
	return t
}

// ownedLive returns the owner uid of each owned, live pod of view, by pod
// uid.
func ownedLive(view []livePod) map[string]string {
	live := map[string]string{}
	for i := range view {
		if p := &view[i]; p.owned() && p.live() {
			live[p.uid] = p.owner.uid
		}
	}
	return live
}

// noteShown numbers a new count and notes, for each owned pod view shows
// live, the first count that showed it (owed). With no restart in flight
// there is no replacement to tell, and the notes start afresh. b.mu must
// be held.
func (b *namespaceBudget) noteShown(view []livePod) {
	b.counts++
	if len(b.inFlight) == 0 || b.firstSeen == nil {
		b.firstSeen = map[string]seenPod{}
	}
	for i := range view {
		if p := &view[i]; p.owned() && p.live() {
			switch seen, ok := b.firstSeen[p.uid]; {
			case !ok:
				b.firstSeen[p.uid] = seenPod{count: b.counts, owner: p.owner.uid, node: p.node}
			case seen.node != p.node: // bound since its first count
				seen.node = p.node
				b.firstSeen[p.uid] = seen
			}
		}
	}
}

// replacementDue reports whether a pod of owner that round r selects (or
// an earlier process's restart, which may be one) was restarted and is
// gone, and the owner's restarts are owed a replacement not shown yet:
// until each has one, a replacement still to come may be r's. b.mu must
// be held.
func (b *namespaceBudget) replacementDue(r *round, owner string, live map[string]string) bool {
	for uid, chosen := range b.inFlight {
		if chosen.owner == owner && live[uid] == "" && (chosen.resumed || r.sel.selects(&chosen.shown)) {
			return b.owed(owner, live, nil) > 0
		}
	}
	return false
}

// owed returns how many pods of owner the namespace's rounds restarted
// that live (this count's owned live pods) no longer shows, and whose
// replacements no count has shown yet: a round that begins while they are
// missing has not seen them, and counts them as expected all the same. A
// pod of owner first shown after a restart was chosen is taken for its
// replacement; the latest k restarts need k of those first shown after the
// earliest of them. A DaemonSet's replacement is on the node of the pod it
// replaces: one on another node (come back, or added) replaces none, and
// taken for a replacement it would leave the missing pod uncounted. Where
// a restart's node is not known (an earlier process's, oweResumed), any
// node's pod counts. among, if not nil, says which restarts count (by
// pod uid). b.mu must be held.
func (b *namespaceBudget) owed(owner string, live map[string]string, among map[string]bool) int {
	gone := map[string][]uint64{} // by node, where every restart's is known
	byNode := true
	for uid, chosen := range b.inFlight {
		if chosen.owner == owner && live[uid] == "" && (among == nil || among[uid]) {
			gone[chosen.node] = append(gone[chosen.node], chosen.count)
			byNode = byNode && chosen.node != ""
		}
	}
	if len(gone) == 0 {
		return 0
	}
	if !byNode {
		var all []uint64
		for _, counts := range gone {
			all = append(all, counts...)
		}
		gone = map[string][]uint64{"": all}
	}
	since := map[string][]uint64{}
	for _, seen := range b.firstSeen {
		if seen.owner == owner {
			node := ""
			if byNode {
				node = seen.node
			}
			since[node] = append(since[node], seen.count)
		}
	}
	owed := 0
	for node, counts := range gone {
		owed += owedOf(counts, since[node])
	}
	return owed
}

// owedOf returns how many of the restarts chosen at the counts gone have
// no replacement among the pods first shown at the counts since.
func owedOf(gone, since []uint64) int {
	slices.Sort(gone)
	slices.Sort(since)
	owed := 0
	for i, chosen := range gone {
		after, _ := slices.BinarySearch(since, chosen+1)
		owed = max(owed, len(gone)-i-(len(since)-after))
	}
	return owed
}

// oweResumed notes, for round r that resumed an intent no round of this
// term took before (round.owes: else its own restarts are in flight
// already, and those gone by other hands owed nothing), the pods it names
// that view does not show, less the owned pods it selects and does not
// name (created since the round began: replacements, of any owner; shown,
// or restarted by a round of this term and gone since), as
// restarts of an earlier process's round in flight from now (for
// leftAfter: restartChosen.resumed): their replacements may not exist yet
// (owed). Less again those whose replacements the restarts of this term
// in flight still owe: owed twice, a replacement still to come would count
// twice. They are owed to the owner of the named pods the view shows,
// where those have one (else to none: theirs is not known), and where the
// intent groups its pods by owner (newIntent) only those of that owner's
// group: a gone bare pod, or one of an owner the view no longer shows
// among the named, has no replacement that owner makes, and owed to it
// would hold every round over its pods for nothing. Nor is a pod gone
// whose replacement the view shows under another owner one that owner
// still waits for. b.mu must be held.
func (b *namespaceBudget) oweResumed(r *round, view []livePod, now time.Time) {
	owner, shown, since := "", map[string]bool{}, 0
	ownersShown := map[string]bool{} // the named pods shown live: all the owner's
	for i := range view {
		p := &view[i]
		if !r.only[p.uid] {
			continue
		}
		shown[p.uid] = true
		if !p.live() {
			continue
		}
		if !p.owned() || (owner != "" && p.owner.uid != owner) {
			return
		}
		owner, ownersShown[p.uid] = p.owner.uid, true
	}
	if owner == "" {
		return
	}
	theirs := r.only // the pods that may be the owner's
	if r.groups != nil {
		theirs = map[string]bool{}
		for _, group := range r.groups {
			if slices.ContainsFunc(group, func(uid string) bool { return ownersShown[uid] }) {
				for _, uid := range group {
					theirs[uid] = true
				}
			}
		}
	}
	for i := range view {
		if p := &view[i]; p.live() && p.owned() && !r.only[p.uid] && r.sel.selects(p) {
			since++
		}
	}
	// So are those a round of this term restarted since, gone now: a
	// named pod's replacement restarted again before this round took its
	// view, whose own replacement its restart in flight owes already.
	live := ownedLive(view)
	for uid, chosen := range b.inFlight {
		if p := &chosen.shown; !chosen.resumed && !r.only[uid] && live[uid] == "" && p.owned() && p.owner.uid == owner && r.sel.selects(p) {
			since++
		}
	}
	owed := -since
	for uid := range theirs {
		if !shown[uid] {
			owed++
		}
	}
	// Those of them another round of this term restarted, their
	// replacements still to come, are owed by their own restarts in flight
	// already: owed again here, a missing replacement would count twice.
	owed -= b.owed(owner, live, theirs)
	if owed <= 0 {
		return
	}
	b.noteShown(view) // the pods shown now are not the replacements still to come
	for uid := range theirs {
		if _, ok := b.inFlight[uid]; !ok && !shown[uid] && owed > 0 {
			b.inFlight[uid] = restartChosen{at: now, by: r.key, owner: owner, count: b.counts, resumed: true}
			owed--
		}
	}
}
