package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/internal/truncate"
	"github.com/k8spatterns/config-watcher/podindex"
)

// A round restarts its pods in waves, so that a change is never an
// outage. Each wave reads the namespace's pods (from the pod index where
// one watches, else a LIST: sweep.go) and restarts what the budget allows
// (budget.go): a pod that serves nothing and will not by itself (broken,
// or not Ready for brokenAfter) at once, those first, for restarting it is
// how a fix reaches crash-looping pods; a Ready one while every round that
// selects it keeps its budget. Then it gives its worker back until a pod
// it selects changes readiness (the index says so: podChanged), or a time
// it decides on comes (nextLook), and looks again; without an index it
// looks again after wavePoll. A round that could restart nothing for
// ProgressDeadline halts: it says so (RolloutHalted), keeps its intent,
// and goes on looking, at least every minute; while its own replacements
// are not available, a halted round is frozen: it restarts nothing, Ready
// or not, until they are or a new change comes. docs/operations.md tells
// it for users.

// Budget is MAX_UNAVAILABLE: a number of pods, or a percentage of the pods
// a round's owners expect.
type Budget struct {
	Pods    int // used when Percent is 0
	Percent int
}

// ParseBudget reads a MAX_UNAVAILABLE value: "2" or "25%".
func ParseBudget(s string) (Budget, error) {
	digits, percent := strings.CutSuffix(s, "%")
	n, err := strconv.Atoi(digits)
	switch {
	case err != nil || n < 1 || (percent && n > 100):
		return Budget{}, errors.New("must be a whole number of pods (at least 1) or a percentage from 1% to 100%")
	case percent:
		return Budget{Percent: n}, nil
	}
	return Budget{Pods: n}, nil
}

func (b Budget) String() string {
	if b.Percent > 0 {
		return strconv.Itoa(b.Percent) + "%"
	}
	return strconv.Itoa(b.Pods)
}

// of returns how many of n pods may be unavailable: rounded down, and at
// least one, so that a single replica is restarted too.
func (b Budget) of(n int) int {
	if b.Percent > 0 {
		return max(n*b.Percent/100, 1)
	}
	return max(b.Pods, 1)
}

// all: every pod at once (100%), as the book's pattern restarts them.
func (b Budget) all() bool { return b.Percent == 100 }

// wavePoll is how long a waiting round without an index gives its worker
// back before it lists its pods again; a halted one waits haltedPolls
// times as long: it may wait for hours, and each look is a LIST. A round
// that decides from the index is woken by its pods' changes instead, and
// looks at least every lookEvery (nextLook).
const (
	wavePoll    = time.Second
	haltedPolls = 10
	lookEvery   = time.Minute
)

// errWaiting: the round restarted what its budget allows and waits for
// replacements; it is queued again after round.next, holding no worker.
var errWaiting = errors.New("waiting for replacements to become Ready")

// errMembersAdded: the round's membership was completed with pods it had
// not taken; the next wave, at once, restarts them.
var errMembersAdded = errors.New("pods added to the round")

// wave takes round r one wave further: it reads the namespace's pods,
// takes the round's pods from them if it has none yet, restarts what the
// budget allows (the intent written first, beside the reads of the owners'
// desired replicas), and returns errWaiting while pods are left. Once none
// is, a round that began from the index completes its membership
// (complete) before it is recorded.
func (c *Controller) wave(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	r.blocked.Store(nil) // this wave's refusals tell why it stalls
	if c.cfg.Stall != nil {
		c.stall(ctx, c.cfg.Stall("wave "+key))
	}
	viewAt := time.Now()
	view, x, err := c.viewOf(ctx, obj.namespace, r)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	b := c.budgetOf(obj.namespace)
	c.take(b, obj, r, view, x, c.takeCutoff(ctx, obj.namespace, r, view, x), log)
	wasPending := r.count(podPending)
	pending := c.refresh(r, view, log)
	if len(pending) == 0 {
		return c.completed(ctx, key, obj, r, log)
	}
	if wait := c.settleWait(obj, r, view, time.Now()); wait > 0 {
		// Changes of objects over the same pods may follow: their rounds
		// begin meanwhile and share the restarts. This one's bound is
		// taken now (pods created while it settles are not its own), and
		// its intent written, so that a kill leaves each object's.
		c.startBound(ctx, obj.namespace, r)
		if err := c.ensureIntent(ctx, key, obj, r, log); err != nil {
			return err
		}
		r.next = wait
		return errWaiting
	}
	if !c.cfg.DryRun && !c.cfg.MaxUnavailable.all() {
		if err := c.settleUnsure(ctx, obj.namespace, b, view); err != nil {
			return err
		}
	}
	others := c.otherRounds(obj.namespace, r)
	if r.indexed != nil && (c.cfg.Strategy == StrategyEvict || c.cfg.DryRun) {
		// No answer will carry a revision: the bound is a LIST, sent
		// beside the intent's write, never waited for by a restart.
		c.startBound(ctx, obj.namespace, r)
	}
	var wg sync.WaitGroup
	var intentErr error
	wg.Go(func() { intentErr = c.ensureIntent(ctx, key, obj, r, log) })
	var read []ownerRef
	if !c.cfg.DryRun && !c.cfg.MaxUnavailable.all() {
		read = c.ownersToRead(b, r, others, view, pending)
		c.owners.refresh(ctx, r, obj.namespace, read, time.Time{})
	}
	wg.Wait()
	if intentErr != nil {
		return intentErr
	}
	if !r.haltFound.IsZero() {
		r.halted = true // found halted: frozen from its first wave (judgeProgress says so)
	}
	if view, pending, err = c.viewAfterReads(ctx, obj.namespace, r, view, x, read, pending, log); err != nil {
		return err
	}
	// A change seen while the intent's write or the reads were out is a
	// round that counts the restarts chosen now (begun or not), as any.
	others = c.otherRounds(obj.namespace, r)
	now := time.Now()
	chosen, tokens, stale := c.choose(b, r, others, view, pending, now, c.owners.readSince(read, viewAt))
	if stale {
		// A scale-up within the second a read is kept, while a pod is
		// missing, shows in no count: a Ready pod goes only on reads
		// sent after the view, one more per owner in a wave that would
		// restart one.
		c.owners.refresh(ctx, r, obj.namespace, read, viewAt)
		if view, pending, err = c.viewAfterReads(ctx, obj.namespace, r, view, x, read, pending, log); err != nil {
			return err
		}
		others = c.otherRounds(obj.namespace, r)
		now = time.Now()
		chosen, tokens, _ = c.choose(b, r, others, view, pending, now, true)
	}
	c.sayEstimate(b, obj, r, log)
	restarted, done := r.count(podRestarted), len(r.pods)-r.count(podPending)
	err = c.restartAll(ctx, key, obj, r, chosen, tokens, log)
	c.judgeProgress(ctx, key, obj, r, view, done, r.count(podRestarted) > restarted, len(pending) < wasPending || !r.tokenAt.IsZero(), log)
	if err != nil {
		return err
	}
	if r.count(podPending) > 0 {
		if r.indexed != nil && !r.indexed.hasAnswer() {
			// Nothing deleted yet: a bound taken now, not at the first
			// DELETE of a later wave, leaves out the pods created meanwhile.
			c.startBound(ctx, obj.namespace, r)
		}
		r.next = c.nextLook(b, r, x != nil, view, now, c.owners.readAgainAt(read, viewAt))
		return errWaiting
	}
	return c.completed(ctx, key, obj, r, log)
}

// viewAfterReads returns the view a wave that read its owners' scale
// counts on, and its pending pods judged on it: where view came from the
// index x, the index as it is now, as the reads may have been slow (a
// server that answers late), and a pod gone not Ready or created meanwhile
// must show in the count its restart goes on. A pending pod the index no
// longer shows live, selected and not terminating (gone by other hands
// while the read was slow) is judged again on it (refresh), as the next
// wave would: the view before the reads would count it available. Where
// the index has not caught up with a LIST, view stays. Where view came
// from a LIST, the count must not go back behind what the controller was
// shown either: an index that came up meanwhile (its watch was down, or
// had not listed yet) and has caught up with that LIST gives the view, as
// the next wave's would; else view stays unless another round's newer
// LIST answered meanwhile, and the wave lists again (one LIST more only
// where rounds of the namespace overlap).
func (c *Controller) viewAfterReads(ctx context.Context, namespace string, r *round, view []livePod, x *podindex.Index, read []ownerRef, pending []int, log *slog.Logger) ([]livePod, []int, error) {
	switch {
	case len(read) == 0:
		return view, pending, nil
	case x == nil:
		if up := c.indexFor(namespace); up != nil {
			if now, opaque, ok := c.indexView(namespace, up); ok && !opaque && showsPending(r, now) {
				return now, c.refresh(r, now, log), nil
			}
		}
		if !c.budgetOf(namespace).listedSince(r.listedAt) {
			return view, pending, nil
		}
		now, _, err := c.viewOf(ctx, namespace, r)
		if err != nil {
			return nil, nil, fmt.Errorf("list pods: %w", err)
		}
		return now, c.refresh(r, now, log), nil
	}
	now, opaque, ok := c.indexView(namespace, x)
	if !ok || opaque {
		return view, pending, nil
	}
	return now, c.refresh(r, now, log), nil
}

// completed completes round r's membership (complete): nil if it gained no
// pod, else errMembersAdded, and the next wave restarts them; where every
// pending pod goes at once (100 %, a dry run) they are restarted here,
// with the preconditions of the view that found them.
func (c *Controller) completed(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	before := len(r.pods)
	added, err := c.complete(ctx, key, obj, r, log)
	if err != nil || !added {
		return err
	}
	if !c.cfg.DryRun && !c.cfg.MaxUnavailable.all() {
		return errMembersAdded
	}
	var which []int
	for i := before; i < len(r.pods); i++ {
		which = append(which, i)
	}
	if err := c.restartAll(ctx, key, obj, r, which, c.reserveTokens(len(which)), log); err != nil {
		return err
	}
	if r.count(podPending) > 0 {
		return errMembersAdded
	}
	return nil
}

// take makes the first wave's view the round's, once: its pods are the
// selected, live pods that are not terminating (for a resumed round, those
// its intent names), but those the index saw created above cutoff
// (takeCutoff). Pods created after it run the new data. A view from the
// index (x) may lack pods created just before: the round's membership is
// completed later (complete).
func (c *Controller) take(b *namespaceBudget, obj object, r *round, view []livePod, x *podindex.Index, cutoff uint64, log *slog.Logger) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.listed {
		return
	}
	for _, p := range view {
		switch {
		case p.terminating || !p.live() || !r.sel.selects(&p):
		case c.cfg.OwnPod.Spares(obj.namespace, p.name, p.uid, p.owner.uid):
			c.log.Debug("not deleting own pod", "namespace", obj.namespace, "pod", p.name)
		case cutoff != math.MaxUint64 && createdAfter(x, obj.namespace, p.uid, cutoff):
			log.Info("leaving pod created after the change was seen", "pod", p.name)
		case r.only == nil || r.only[p.uid]:
			r.pods = append(r.pods, p.podRef)
		}
	}
	// In name order, as a LIST gives them: which pods a wave takes first
	// does not hang on the index's map order (and a simulator's seed
	// replays).
	slices.SortFunc(r.pods, func(a, b podRef) int { return strings.Compare(a.name, b.name) })
	if x != nil {
		r.indexed = &indexed{index: x, answered: math.MaxUint64}
	}
	r.state = make([]podState, len(r.pods))
	r.listed, r.progress = true, time.Now()
	// The owned pods shown now, and those the namespace's last count
	// showed, are seen since the round began: one a count misses later
	// (deleted by other hands while the round settles or waits its turn,
	// or just before it began, counted by the round it superseded or
	// another object's) keeps counting for leftAfter, as a DaemonSet
	// replaces it only once it is gone.
	r.mostSeen, r.live = map[string]int{}, ownedLive(view)
	for _, owner := range r.live {
		r.mostSeen[owner]++
	}
	last := map[string]int{}
	for uid, owner := range b.live {
		if _, ok := r.live[uid]; !ok {
			r.live[uid] = owner
		}
		last[owner]++
	}
	for owner, n := range last {
		r.mostSeen[owner] = max(r.mostSeen[owner], n)
	}
	if r.owes {
		b.oweResumed(r, view, r.progress)
	}
	if r.resumed {
		log.Info("resuming an interrupted round", obj.dataAttr(), "pods", len(r.pods), "max_unavailable", c.cfg.MaxUnavailable.String(), "from_index", x != nil)
	} else {
		log.Info("data changed; restarting pods", obj.dataAttr(), "pods", len(r.pods), "max_unavailable", c.cfg.MaxUnavailable.String(), "from_index", x != nil)
	}
}

// takeCutoff returns the lowest pod revision known to follow the moment
// round r's change was seen (seenCutoff), for take; math.MaxUint64 where
// none is, or r has taken its pods. The index may show another round's
// deletion and its replacement before that DELETE's answer is back: where
// the view shows a pod the index saw created above r.seenFloor (after what
// it had shown when the change was seen: perhaps such a replacement), the
// answers and the mark are waited for, up to catchUpWait; only then, so
// that rounds over pods that were all there before their change wait for
// none of one another's requests. One still missing then may make a restart
// too many, never one too few.
func (c *Controller) takeCutoff(ctx context.Context, namespace string, r *round, view []livePod, x *podindex.Index) uint64 {
	if x == nil || r.listed {
		return math.MaxUint64
	}
	if r.only == nil { // a resumed round takes what its intent names, all created before it
		for i := range view {
			p := &view[i]
			if p.terminating || !p.live() || !r.sel.selects(p) {
				continue
			}
			if created, known := x.Created(ctx, namespace, p.uid, 0); known && created > r.seenFloor {
				return c.seenCutoff(ctx, namespace, r, c.catchUpWait)
			}
		}
	}
	return c.seenCutoff(ctx, namespace, r, 0)
}

// createdAfter: the index saw pod uid created (its ADDED event) above
// revision cutoff.
func createdAfter(x *podindex.Index, namespace, uid string, cutoff uint64) bool {
	created, known := x.Created(context.Background(), namespace, uid, 0)
	return known && created > cutoff
}

// nextLook returns when round r, waiting, looks again. Without an index
// (each look a LIST), after wavePoll, or haltedPolls times that once
// halted. With one, pods' changes wake it (podChanged); it looks by itself
// only when a time it decides on comes: a selected pod available once
// Ready for MinReadySeconds, a pending one restartable outside the budget
// once not Ready for brokenAfter, a restart out of flight, the
// ProgressDeadline, the token of MAX_RESTARTS_PER_SECOND a pod that needs
// the budget waits for (tokenFor), or the next one its last wave could not
// reserve soon enough (round.tokenAt, sooner than wavePoll without an
// index too), rescale (the wave counted an owner's scale
// read before its view: a scale-down's deletions wake the round before its
// new scale may be read); at least every lookEvery, and soon again while a
// disruption budget refuses its evictions.
func (c *Controller) nextLook(b *namespaceBudget, r *round, indexed bool, view []livePod, now, rescale time.Time) time.Duration {
	if !indexed {
		poll := c.wavePoll
		if r.halted {
			poll *= haltedPolls
		}
		if !r.tokenAt.IsZero() {
			poll = min(poll, max(r.tokenAt.Sub(now), time.Millisecond))
		}
		return poll
	}
	at := now.Add(lookEvery)
	soon := func(t time.Time) {
		if t.After(now) && t.Before(at) {
			at = t
		}
	}
	pending := map[string]bool{}
	for i, p := range r.pods {
		if r.state[i] == podPending {
			pending[p.uid] = true
		}
	}
	for i := range view {
		p := &view[i]
		if p.terminating || !p.live() || !r.sel.selects(p) || p.since.IsZero() {
			continue
		}
		if p.ready && c.cfg.MinReadySeconds > 0 {
			soon(p.since.Add(c.cfg.MinReadySeconds))
		}
		if !p.ready && pending[p.uid] {
			soon(p.since.Add(brokenAfter))
		}
	}
	if !r.halted {
		soon(r.progress.Add(c.cfg.ProgressDeadline))
	}
	soon(r.token)
	if !r.tokenAt.IsZero() {
		soon(now.Add(max(r.tokenAt.Sub(now), time.Millisecond)))
	}
	if !rescale.IsZero() {
		if !rescale.After(now) {
			rescale = now.Add(time.Millisecond) // it may be read again already
		}
		soon(rescale)
	}
	b.mu.Lock()
	for _, chosen := range b.inFlight {
		soon(chosen.expires()) // a restart of its own, or one another round's count owes
	}
	for _, l := range r.left {
		soon(l.at.Add(leftAfter))
	}
	b.mu.Unlock()
	if r.blocked.Load() != nil {
		soon(now.Add(c.wavePoll)) // a disruption budget's status follows readiness late
	}
	return max(at.Sub(now), time.Millisecond)
}

// podChanged queues the rounds in progress of namespace that select a pod
// whose readiness (or anything else they decide on) changed; labels nil:
// every round of the namespace. Called by the index's watch: it never
// blocks.
func (c *Controller) podChanged(namespace string, labels map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wakeRounds(namespace, labels)
}

// wakeRounds queues the rounds in progress of namespace that may select a
// pod labelled labels (nil: any). c.mu must be held.
func (c *Controller) wakeRounds(namespace string, labels map[string]string) {
	var keys []string
	for key, e := range c.entries {
		if r := e.round; r != nil && e.obj.namespace == namespace && (labels == nil || r.sel.mayMatch(labels)) {
			keys = append(keys, key)
		}
	}
	c.queue.AddAll(keys) // lock order: c.mu, then the queue's
}

// refresh returns the round's pending pods as the view shows them, their
// preconditions taken from it. A pod the view does not show is gone; one
// terminating, or finished, is done with (its replacement runs the new
// data); one the selector no longer picks has left.
func (c *Controller) refresh(r *round, view []livePod, log *slog.Logger) (pending []int) {
	byUID := make(map[string]*livePod, len(view))
	for i := range view {
		byUID[view[i].uid] = &view[i]
	}
	for i := range r.pods {
		if r.state[i] != podPending {
			continue
		}
		p := byUID[r.pods[i].uid]
		switch {
		case p == nil:
			log.Info("pod gone since the round began", "pod", r.pods[i].name)
			r.state[i] = podGone
		case p.terminating || !p.live():
			log.Info("pod terminating or finished since the round began", "pod", p.name)
			r.state[i] = podGone
		case !r.sel.selects(p):
			c.countRestart("left")
			log.Info("pod no longer selected since the round began; leaving it", "pod", p.name, "outcome", "left")
			r.state[i] = podLeft
		default:
			r.pods[i].rv, r.pods[i].version = p.rv, p.version
			pending = append(pending, i)
		}
	}
	return pending
}

// otherRounds returns the rounds whose budgets a restart of round r must
// keep: those in progress of the namespace's other objects, taken their
// pods or not, and, for each other object whose change has no round yet
// (a controller just started begins one object's round at a time; SETTLE
// or a storm's gate holds one back), a round as it would begin, which
// only counts: its pods run old data all the same. A round a view ended
// (other data, a deletion) restarts nothing more: its object counts as one
// whose change has no round yet, and a deleted one as none. Its worker
// lets it go at its next look, which a deleted object may not get until
// it is created again.
func (c *Controller) otherRounds(namespace string, r *round) []*round {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*round
	for key, e := range c.entries {
		if e.obj.namespace != namespace || key == r.key || e.round == r {
			continue
		}
		if e.round != nil && !e.ended {
			out = append(out, e.round)
			continue
		}
		if step := e.decide(c.recordsOnServer()); !e.exists || !e.obj.optedIn() || (step != stepRound && step != stepResume) {
			continue
		}
		sel, err := c.selectionOf(e.obj)
		if err != nil {
			continue // refused: it restarts nothing
		}
		if !e.i.present() {
			c.narrow(sel, e.obj, e.rKeys)
		}
		out = append(out, &round{key: key, hash: e.obj.hash, sel: sel})
	}
	return out
}

// bearingOn returns, for view, whether restarting p changes round o's
// count (tally.shift): o selects p, or counts p's owner (o selects another
// of its pods in view, or counted it before: round.owners). Answers are
// kept per round and owner, each found once. b.mu must be held.
func bearingOn(view []livePod) func(o *round, p *livePod) bool {
	owned := map[string][]*livePod{}
	for i := range view {
		if p := &view[i]; p.owned() {
			owned[p.owner.uid] = append(owned[p.owner.uid], p)
		}
	}
	type roundOwner struct {
		o     *round
		owner string
	}
	counts := map[roundOwner]bool{}
	return func(o *round, p *livePod) bool {
		if o.sel.selects(p) {
			return true
		}
		if !p.owned() {
			return false
		}
		k := roundOwner{o, p.owner.uid}
		n, ok := counts[k]
		if !ok {
			_, n = o.owners[p.owner.uid]
			n = n || slices.ContainsFunc(owned[p.owner.uid], o.sel.selects)
			counts[k] = n
		}
		return n
	}
}

// needsBudget: restarting p takes from the budget of the rounds that
// select it; a bare pod, or one that serves nothing and will not, does not.
func needsBudget(p *livePod, minReady time.Duration, now time.Time) bool {
	return p.owned() && (p.available(minReady, now) || p.unserving(now) == "")
}

// ownersToRead returns the owners whose desired replicas this wave needs:
// none unless a pending pod needs the budget; then those of every pod that
// r, or another round such a pod's restart bears on, selects.
func (c *Controller) ownersToRead(b *namespaceBudget, r *round, others []*round, view []livePod, pending []int) []ownerRef {
	now := time.Now()
	byUID := make(map[string]*livePod, len(view))
	for i := range view {
		byUID[view[i].uid] = &view[i]
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	bears := bearingOn(view)
	var rounds []*round
	for _, i := range pending {
		p := byUID[r.pods[i].uid]
		if !needsBudget(p, c.cfg.MinReadySeconds, now) {
			continue
		}
		if len(rounds) == 0 {
			rounds = append(rounds, r)
		}
		for _, o := range others {
			if !slices.Contains(rounds, o) && bears(o, p) {
				rounds = append(rounds, o)
			}
		}
	}
	seen := map[string]bool{}
	var list []ownerRef
	for _, p := range view {
		if !p.owned() || seen[p.owner.uid] || !slices.ContainsFunc(rounds, func(o *round) bool { return o.sel.selects(&p) }) {
			continue
		}
		seen[p.owner.uid] = true
		list = append(list, p.owner)
	}
	// An owner none of whose pods the view shows, that a round still
	// counts (round.owners): scaled to zero since, it wants none.
	for _, o := range rounds {
		for uid, ref := range o.owners {
			if !seen[uid] {
				seen[uid] = true
				list = append(list, ref)
			}
		}
	}
	return list
}

// choose returns the pending pods this wave restarts, each with its token
// of MAX_RESTARTS_PER_SECOND, and counts them in flight: a halted round
// whose replacements are not available (frozen) none; else, of those no
// other round is restarting now, every bare pod and every one that serves
// nothing (first), then those that need the budget while every round that
// selects them (otherRounds: begun or not) allows one more unavailable pod
// and it has a token due now (tokenFor): one sent seconds later, after the
// others' tokens, would go on a count that may no longer hold (a
// scale-down meanwhile shrinks a percentage's budget). In a dry run, where
// nothing changes between waves, and at 100 %, it takes them all. Those
// that need no budget (all, at 100 %) it takes only as far as tokens are
// due within wavePoll (soonTokens); then none that needs it. One that
// needs the budget is taken only where the owners' scale was read after
// the view (fresh): else choose takes none and returns stale.
func (c *Controller) choose(b *namespaceBudget, r *round, others []*round, view []livePod, pending []int, now time.Time, fresh bool) (chosen []int, tokens []time.Time, stale bool) {
	r.tokenAt = time.Time{} // set again where soonTokens stops short
	if c.cfg.DryRun || c.cfg.MaxUnavailable.all() {
		tokens = c.soonTokens(r, len(pending))
		return pending[:len(tokens)], tokens, false
	}
	byUID := make(map[string]*livePod, len(view))
	for i := range view {
		byUID[view[i].uid] = &view[i]
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	if r.halted && len(c.unavailableReplacements(r, view, now)) > 0 {
		c.dropToken(r)
		return nil, nil, false // frozen
	}
	// Each round a chosen restart bears on counts it (shift), those
	// counted after it was chosen too.
	tallies := map[*round]*tally{}
	tallyOf := func(o *round) *tally {
		if tallies[o] == nil {
			tallies[o] = c.count(b, o, view, now)
			for _, j := range chosen {
				tallies[o].shift(byUID[r.pods[j].uid], -1)
			}
		}
		return tallies[o]
	}
	var budgeted []int
	for _, i := range pending {
		if other, ok := b.inFlight[r.pods[i].uid]; ok && other.by != r.key {
			continue // another object's round restarts it now: it is done with once the view shows so
		}
		if needsBudget(byUID[r.pods[i].uid], c.cfg.MinReadySeconds, now) {
			budgeted = append(budgeted, i)
		} else {
			chosen = append(chosen, i)
		}
	}
	tokens = c.soonTokens(r, len(chosen))
	chosen = chosen[:len(tokens)]
	if !r.tokenAt.IsZero() {
		budgeted = nil // no token is due now for them either
	}
	// Counted in every wave, a pod budgeted or not: counting keeps the
	// round's estimate.
	tallyOf(r)
	waiting := false // for a token
	bears := bearingOn(view)
	for _, i := range budgeted {
		p := byUID[r.pods[i].uid]
		rules := []*tally{tallyOf(r)}
		for _, o := range others {
			if bears(o, p) {
				rules = append(rules, tallyOf(o))
			}
		}
		if slices.ContainsFunc(rules, func(t *tally) bool { return !t.allows(p) }) {
			continue
		}
		if !fresh {
			if c.restartTokens != nil {
				c.restartTokens.giveBack(len(tokens))
			}
			return nil, nil, true
		}
		if !c.tokenFor(r, now) {
			waiting = true
			break
		}
		for _, t := range tallies {
			t.shift(p, -1)
		}
		chosen, tokens = append(chosen, i), append(tokens, now)
	}
	if !waiting {
		c.dropToken(r)
	}
	for _, i := range chosen {
		p := byUID[r.pods[i].uid]
		node := ""
		if p.replacedOnItsNode() {
			node = p.node
		}
		b.inFlight[p.uid] = restartChosen{at: now, by: r.key, pod: p.name, owner: p.owner.uid, count: b.counts, node: node, shown: *p}
	}
	return chosen, tokens, false
}

// tokenFor takes, for a pod of round r that needs the budget, a token of
// MAX_RESTARTS_PER_SECOND due now: the one r holds once it is due, else
// one due now. Where none is, r reserves the next one (round.token), unless
// it holds one already, and looks again when it is due (nextLook): rounds
// waiting for tokens get them in the order they asked, as restarts that
// wait for theirs do.
func (c *Controller) tokenFor(r *round, now time.Time) bool {
	switch {
	case c.restartTokens == nil:
		return true
	case !r.token.IsZero():
		if r.token.After(now) {
			return false
		}
		r.token = time.Time{}
		return true
	case c.restartTokens.reserveNow():
		return true
	}
	r.token = c.restartTokens.reserve()
	return false
}

// dropToken gives back the token round r holds, if any: no pod of it
// waits for one. (One held by a round that ends is lost: a restart's
// turn later for the others, never a restart more.)
func (c *Controller) dropToken(r *round) {
	if !r.token.IsZero() {
		c.restartTokens.giveBack(1)
		r.token = time.Time{}
	}
}

// unavailableReplacements returns the pods r selects that are not its own
// (created since it began: replacements) and not available.
func (c *Controller) unavailableReplacements(r *round, view []livePod, now time.Time) []livePod {
	ours := make(map[string]bool, len(r.pods))
	for _, p := range r.pods {
		ours[p.uid] = true
	}
	var out []livePod
	for _, p := range view {
		if p.owned() && p.live() && !p.terminating && !ours[p.uid] && r.sel.selects(&p) && !p.available(c.cfg.MinReadySeconds, now) {
			out = append(out, p)
		}
	}
	return out
}

// sayEstimate says once per round that the desired replicas of an owner
// could not be read, and what the round counts instead; and once that a
// read got no answer that tells, and held a pod back.
func (c *Controller) sayEstimate(b *namespaceBudget, obj object, r *round, log *slog.Logger) {
	b.mu.Lock()
	est, unanswered := r.estimate, r.unanswered
	if est != nil && est.said {
		est = nil
	}
	if unanswered != nil && unanswered.said {
		unanswered = nil
	}
	for _, e := range []*estimate{est, unanswered} {
		if e != nil {
			e.said = true
		}
	}
	b.mu.Unlock()
	if unanswered != nil {
		c.metrics.OwnerReadsFailed.Inc("unanswered")
		log.Warn("no pod that needs the budget restarted: its owner's scale got no answer that tells", "owner", unanswered.owner.kind+"/"+unanswered.owner.name, "err", unanswered.err)
		c.event(obj, events.Warning, "ExpectedPodsUnknown", truncate.String(fmt.Sprintf("Cannot read the desired replicas of %s %s (%v): no pod that needs the budget is restarted until a read answers; it is read again every second.",
			unanswered.owner.kind, unanswered.owner.name, unanswered.err), 1024))
	}
	if est == nil {
		return
	}
	typ, result := events.Warning, "error"
	switch {
	case errors.Is(est.err, errNoScale):
		typ, result = events.Normal, "no_scale"
	case apiclient.IsForbidden(est.err):
		result = "forbidden"
	}
	c.metrics.OwnerReadsFailed.Inc(result)
	msg := fmt.Sprintf("Cannot read the desired replicas of %s %s (%v): counting the most of its pods seen since the round began, and those restarted and not replaced yet (%d) instead.",
		est.owner.kind, est.owner.name, est.err, est.pods)
	log.Warn("counting expected pods without their owner's scale", "owner", est.owner.kind+"/"+est.owner.name, "pods", est.pods, "err", est.err)
	c.event(obj, typ, "ExpectedPodsEstimated", truncate.String(msg, 1024))
}

// judgeProgress halts round r once no restart has been possible for
// ProgressDeadline, or at once when it resumed an intent the object shows
// halted, and resumes it at its next restart; done pods were done with
// before this wave, moved says it restarted one, shrank that pods of it
// were done with by other hands since its last wave. Halted, it keeps its
// intent, marks it halted on the object (writeHalt) and goes on looking.
func (c *Controller) judgeProgress(ctx context.Context, key string, obj object, r *round, view []livePod, done int, moved, shrank bool, log *slog.Logger) {
	now := time.Now()
	found := r.haltFound
	r.haltFound = time.Time{}
	if shrank && !moved && !r.halted && found.IsZero() {
		// Its pods restarted by another round over them (which took the
		// budget first), or gone by other hands: the rollout goes on, and
		// no stall is to be told. A halted round stays frozen until a
		// restart of its own is possible.
		r.progress = now
		return
	}
	if moved {
		r.progress = now
		if r.halted {
			c.setHalted(key, r, false)
			log.Info("round resumed", obj.dataAttr())
			c.event(obj, events.Normal, "RolloutResumed", fmt.Sprintf("Resumed after %d of %d pods: a restart became possible again.", done, len(r.pods)))
		}
		return
	}
	if found.IsZero() && (r.halted || now.Sub(r.progress) < c.cfg.ProgressDeadline) {
		return
	}
	c.setHalted(key, r, true)
	why := c.stalled(c.budgetOf(obj.namespace), r, view, now)
	if !found.IsZero() {
		why = fmt.Sprintf("halted since %s, as the object records; %s", found.UTC().Format(time.RFC3339), why)
	} else {
		c.writeHalt(ctx, key, obj, r, now, log)
	}
	log.Error("round halted: no restart possible", obj.dataAttr(), "why", why, "progress_deadline", c.cfg.ProgressDeadline)
	c.event(obj, events.Warning, "RolloutHalted", fmt.Sprintf("Halted after %d of %d pods: %s. The round keeps its intent and goes on by itself when pods become Ready; a new data change restarts the pods that are not Ready first.",
		len(r.pods)-r.count(podPending), len(r.pods), why))
}

// stalled says why round r could restart nothing for ProgressDeadline.
func (c *Controller) stalled(b *namespaceBudget, r *round, view []livePod, now time.Time) string {
	deadline := c.cfg.ProgressDeadline
	if pod := r.blocked.Load(); pod != nil {
		return fmt.Sprintf("the eviction of pod %s refused by a disruption budget for %s", *pod, deadline)
	}
	if notReady := c.unavailableReplacements(r, view, now); len(notReady) > 0 {
		return fmt.Sprintf("%d replacement(s) not Ready for %s: %s (pod %s)", len(notReady), deadline, notReady[0].why, notReady[0].name)
	}
	if owner, err := c.unansweredOwner(b, r); err != nil {
		return fmt.Sprintf("the scale of %s %s got no answer that tells (%v): no pod that needs the budget goes until a read answers", owner.kind, owner.name, err)
	}
	return fmt.Sprintf("no pod could go unavailable for %s within MAX_UNAVAILABLE %s of the pods the owners expect, counting pods down for any reason and other rounds over the same pods", deadline, c.cfg.MaxUnavailable)
}

// unansweredOwner returns an owner round r counts whose last read got no
// answer that tells, and that read's error; nil where none did.
func (c *Controller) unansweredOwner(b *namespaceBudget, r *round) (ownerRef, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, uid := range slices.Sorted(maps.Keys(r.owners)) {
		if _, err := c.owners.desired(uid); errors.Is(err, errUnanswered) {
			return r.owners[uid], err
		}
	}
	return ownerRef{}, nil
}

// setHalted marks round r (of key) halted or not, and keeps the gauge.
func (c *Controller) setHalted(key string, r *round, halted bool) {
	r.halted = halted
	c.mu.Lock()
	defer c.mu.Unlock()
	if halted {
		c.halted[key] = r
		if e := c.entries[key]; e != nil && e.round == r && e.endStormHold() {
			c.queue.Add(key) // its worker lets it go at once, not at its next look
		}
	} else {
		delete(c.halted, key)
	}
	c.pruneHalted()
}

// pruneHalted forgets halted rounds that ended (superseded, recorded, the
// ConfigMap deleted) and sets the gauge. c.mu must be held.
func (c *Controller) pruneHalted() {
	for key, r := range c.halted {
		if e := c.entries[key]; e == nil || e.round != r || e.ended {
			delete(c.halted, key)
		}
	}
	c.metrics.RoundsHalted.Set(float64(len(c.halted)))
}

// lastLook is a finished round's last look: ProgressDeadline after its last
// restart, replacements that are still not Ready, and have not been for at
// least half of it, are reported. With
// MAX_UNAVAILABLE=100% or a single replica no wave waits for them, and this
// is the only signal.
type lastLook struct {
	hash   digest
	at     time.Time
	before map[string]bool // the round's pods: the others are replacements
	// sel is the round's: of the pods that read the object, those that
	// read a key the round restarted for (a reader of another key, not
	// restarted, is no replacement).
	sel *selection
}

func newLastLook(r *round, deadline time.Duration) *lastLook {
	s := &lastLook{hash: r.hash, at: time.Now().Add(deadline), before: make(map[string]bool, len(r.pods)), sel: r.sel}
	for _, p := range r.pods {
		s.before[p.uid] = true
	}
	return s
}

// takeLastLook takes the last look of a finished round when it is due, and
// returns how long until it is.
func (c *Controller) takeLastLook(ctx context.Context, key string, obj object, s *lastLook, log *slog.Logger) (time.Duration, error) {
	if wait := time.Until(s.at); wait > 0 {
		return wait, nil
	}
	live, err := c.selectedNow(ctx, obj.namespace, s.sel)
	if err != nil {
		return 0, fmt.Errorf("list pods: %w", err)
	}
	// A pod not Ready for less than half the deadline has had no time to
	// be: another round's replacement or a scale-up's pod created a moment
	// ago, or a readiness blip, is not this round's data failing.
	longNotReady := time.Now().Add(-c.cfg.ProgressDeadline / 2)
	var notReady []livePod
	for _, p := range live {
		if !p.terminating && p.owned() && p.live() && !p.ready && !s.before[p.uid] && !p.since.After(longNotReady) {
			notReady = append(notReady, p)
		}
	}
	c.mu.Lock()
	if e := c.entries[key]; e != nil && e.last == s {
		e.last = nil
	}
	c.mu.Unlock()
	if len(notReady) > 0 {
		c.metrics.ReplacementsNotReady.Inc()
		why := fmt.Sprintf("%d replacement(s) not Ready %s after the last restart for %s: %s (pod %s)", len(notReady), c.cfg.ProgressDeadline, obj.dataName(), notReady[0].why, notReady[0].name)
		log.Error("replacements not Ready", "why", why)
		c.event(obj, events.Warning, "ReplacementsNotReady", why+". Every selected pod was restarted; check the new data.")
	}
	return 0, nil
}
