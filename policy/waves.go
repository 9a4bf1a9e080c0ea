package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/selector"
)

// A round that does not begin from the pod index restarts its pods in
// waves, so that a change is never an outage. Before each wave it lists the
// pods it selects, whole (readiness is in their status), and restarts what
// MaxUnavailable allows: a pod that is not Ready always (it serves nothing,
// and restarting it is how a fix reaches crash-looping pods), those first;
// a Ready one only while the selected, non-terminating, Ready pods stay at
// or above N - MaxUnavailable afterwards, replacements counted. Then it
// gives its worker back and looks again after wavePoll. The waves of one
// namespace pass one gate, under which a Ready pod is restarted only if the
// rule of every round selecting it holds on live counts: ConfigMaps whose
// selectors overlap never together take more than either one's budget. A
// round that could restart nothing for ProgressDeadline halts: it says so
// (RolloutHalted), keeps its intent, and goes on looking. docs/operations.md
// tells it for users.

// Budget is MAX_UNAVAILABLE: a number of pods, or a percentage of N, the
// controller-owned, non-terminating pods a round selects when it begins.
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

// wavePoll is how long a waiting round gives its worker back before it
// lists its pods again; a halted one waits haltedPolls times as long: it
// may wait for hours, and each look is a LIST.
const (
	wavePoll    = time.Second
	haltedPolls = 10
)

// errWaiting: the round restarted what its budget allows and waits for
// replacements; it is queued again after wavePoll, holding no worker.
var errWaiting = errors.New("waiting for replacements to become Ready")

// gate returns the gate of a namespace's waves.
func (c *Controller) gate(namespace string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.gates[namespace]
	if g == nil {
		g = &sync.Mutex{}
		c.gates[namespace] = g
	}
	return g
}

// wave takes round r one wave further: it lists the selected pods, takes
// the round's pods from that list if it has none yet, restarts what the
// budget allows (writing the intent before the first restart), and returns
// errWaiting while pods are left.
func (c *Controller) wave(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	gate := c.gate(obj.namespace)
	gate.Lock()
	defer gate.Unlock()
	r.blocked.Store(nil) // this wave's refusals tell why it stalls
	live, err := c.listWhole(ctx, obj.namespace, r.sel)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	if !r.listed {
		c.take(obj, r, live, log)
	}
	pending, err := c.refresh(ctx, obj.namespace, r, live, log)
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		return nil
	}
	chosen, err := c.choose(ctx, obj.namespace, r, live, pending)
	if err != nil {
		return err
	}
	if len(chosen) > 0 && c.needsIntent(r) {
		// I before the first restart: a round cut short leaves it behind.
		if err := c.writeIntent(ctx, key, obj, r, r.pods, log); err != nil {
			return err
		}
	}
	restarted, done := r.count(podRestarted), len(r.pods)-r.count(podPending)
	err = c.restartAll(ctx, key, obj, r, chosen, log)
	c.judgeProgress(key, obj, r, live, done, r.count(podRestarted) > restarted, log)
	if err != nil {
		return err
	}
	if r.count(podPending) > 0 {
		return errWaiting
	}
	return nil
}

// take makes the first wave's list the round's: its pods (for a resumed
// round, those its intent names), N and the budget.
func (c *Controller) take(obj object, r *round, live []listedPod, log *slog.Logger) {
	for _, p := range live {
		switch {
		case p.terminating:
			continue
		case p.owned:
			r.total++
		}
		if r.only == nil || r.only[p.uid] {
			r.pods = append(r.pods, p.podRef)
			r.owned = append(r.owned, p.owned)
		}
	}
	r.state, r.ready = make([]podState, len(r.pods)), make([]bool, len(r.pods))
	r.budget = c.cfg.MaxUnavailable.of(r.total)
	r.listed, r.progress = true, time.Now()
	if r.resumed {
		log.Info("resuming an interrupted round", obj.dataAttr(), "pods", len(r.pods), "selected", r.total, "max_unavailable", r.budget)
	} else {
		log.Info("data changed; restarting pods", obj.dataAttr(), "pods", len(r.pods), "max_unavailable", r.budget)
	}
}

// floor is how many selected pods must stay Ready: N - MaxUnavailable,
// where N leaves out the round's pods that left it by other hands (scaled
// down, relabelled, deleted or replaced by someone else): no replacement
// of ours is coming for them, and counting them would halt the round.
func (r *round) floor() int {
	gone := 0
	for i, st := range r.state {
		if r.owned[i] && (st == podGone || st == podLeft || st == podRefused) {
			gone++
		}
	}
	return r.total - gone - r.budget
}

// refresh returns the round's pending pods as live shows them, their
// preconditions taken from it. One live shows terminating is done with: its
// replacement runs the new data. One live does not show is re-read and
// judged as a refused restart is (judgeAgain): gone, replaced, or no
// longer selected (left).
func (c *Controller) refresh(ctx context.Context, namespace string, r *round, live []listedPod, log *slog.Logger) (pending []int, err error) {
	byUID := make(map[string]*listedPod, len(live))
	for i := range live {
		byUID[live[i].uid] = &live[i]
	}
	for i := range r.pods {
		if r.state[i] != podPending {
			continue
		}
		p := byUID[r.pods[i].uid]
		switch {
		case p == nil:
			st, again, err := c.judgeAgain(ctx, namespace, r, &r.pods[i], log.With("pod", r.pods[i].name))
			if err != nil {
				return nil, err
			}
			if !again { // else selected again since the list: the next wave sees it
				r.state[i] = st
			}
			continue
		case p.terminating:
			log.Info("pod terminating since the round began", "pod", p.name)
			r.state[i] = podGone
			continue
		}
		r.pods[i].rv, r.pods[i].version = p.rv, p.version
		r.ready[i] = p.ready && p.owned
		pending = append(pending, i)
	}
	return pending, nil
}

// floorCount is one round's rule in a wave: ready counts its selected,
// non-terminating, controller-owned Ready pods, which must stay >= floor.
type floorCount struct {
	sel          *selector.Selector
	ready, floor int
}

func countReady(sel *selector.Selector, floor int, live []listedPod) *floorCount {
	f := &floorCount{sel: sel, floor: floor}
	for _, p := range live {
		if !p.terminating && p.owned && p.ready {
			f.ready++
		}
	}
	return f
}

// choose returns the pending pods this wave restarts: every one that is not
// Ready (or that nothing replaces), then Ready ones while every round that
// selects the pod keeps its floor. In a dry run nothing changes between
// waves, so it takes them all.
func (c *Controller) choose(ctx context.Context, namespace string, r *round, live []listedPod, pending []int) ([]int, error) {
	if c.cfg.DryRun {
		return pending, nil
	}
	labels := make(map[string]map[string]string, len(live))
	for _, p := range live {
		labels[p.uid] = p.labels
	}
	rules := []*floorCount{countReady(r.sel, r.floor(), live)}
	for _, o := range c.otherRounds(namespace, r) {
		overlaps := false
		for _, i := range pending {
			overlaps = overlaps || (r.ready[i] && o.sel.Matches(labels[r.pods[i].uid]))
		}
		if !overlaps {
			continue
		}
		theirs, err := c.listWhole(ctx, namespace, o.sel)
		if err != nil {
			return nil, fmt.Errorf("list the pods of an overlapping round: %w", err)
		}
		rules = append(rules, countReady(o.sel, o.floor(), theirs))
	}
	var chosen, ready []int
	for _, i := range pending {
		if r.ready[i] {
			ready = append(ready, i)
		} else {
			chosen = append(chosen, i)
		}
	}
	for _, i := range ready {
		podLabels := labels[r.pods[i].uid]
		var apply []*floorCount
		ok := true
		for _, f := range rules {
			if f.sel.Matches(podLabels) {
				apply = append(apply, f)
				ok = ok && f.ready-1 >= f.floor
			}
		}
		if !ok {
			continue
		}
		for _, f := range apply {
			f.ready--
		}
		chosen = append(chosen, i)
	}
	return chosen, nil
}

// otherRounds returns the rounds of the namespace's other ConfigMaps that
// have taken their pods. What their floor reads changes only in their
// waves, under the namespace's gate, which the caller holds.
func (c *Controller) otherRounds(namespace string, r *round) []*round {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*round
	for _, e := range c.entries {
		if o := e.round; o != nil && o != r && e.obj.namespace == namespace && o.listed {
			out = append(out, o)
		}
	}
	return out
}

// judgeProgress halts round r once no restart has been possible for
// ProgressDeadline, and resumes it at its next restart; done pods were done
// with before this wave. Halted, it keeps its intent and goes on looking.
func (c *Controller) judgeProgress(key string, obj object, r *round, live []listedPod, done int, moved bool, log *slog.Logger) {
	now := time.Now()
	if moved {
		r.progress = now
		if r.halted {
			c.setHalted(key, r, false)
			log.Info("round resumed", obj.dataAttr())
			c.event(obj, events.Normal, "RolloutResumed", fmt.Sprintf("Resumed after %d of %d pods: a restart became possible again.", done, len(r.pods)))
		}
		return
	}
	if r.halted || now.Sub(r.progress) < c.cfg.ProgressDeadline {
		return
	}
	c.setHalted(key, r, true)
	why := c.stalled(r, live)
	log.Error("round halted: no restart possible", obj.dataAttr(), "why", why, "progress_deadline", c.cfg.ProgressDeadline)
	c.event(obj, events.Warning, "RolloutHalted", fmt.Sprintf("Halted after %d of %d pods: %s. The round keeps its intent and goes on by itself when pods become Ready; a new data change restarts the pods that are not Ready first.",
		len(r.pods)-r.count(podPending), len(r.pods), why))
}

// stalled says why round r could restart nothing for ProgressDeadline.
func (c *Controller) stalled(r *round, live []listedPod) string {
	deadline := c.cfg.ProgressDeadline
	if pod := r.blocked.Load(); pod != nil {
		return fmt.Sprintf("the eviction of pod %s refused by a disruption budget for %s", *pod, deadline)
	}
	ours := make(map[string]bool, len(r.pods))
	for _, p := range r.pods {
		ours[p.uid] = true
	}
	var notReady []listedPod
	ready := 0
	for _, p := range live {
		switch {
		case p.terminating || !p.owned:
		case p.ready:
			ready++
		case !ours[p.uid]:
			notReady = append(notReady, p)
		}
	}
	if len(notReady) > 0 {
		return fmt.Sprintf("%d replacement(s) not Ready for %s: %s (pod %s)", len(notReady), deadline, notReady[0].why, notReady[0].name)
	}
	return fmt.Sprintf("%d selected pod(s) Ready for %s, and %d must stay Ready (MAX_UNAVAILABLE %s of %d)", ready, deadline, r.floor(), c.cfg.MaxUnavailable, r.total)
}

// setHalted marks round r (of key) halted or not, and keeps the gauge.
func (c *Controller) setHalted(key string, r *round, halted bool) {
	r.halted = halted
	c.mu.Lock()
	defer c.mu.Unlock()
	if halted {
		c.halted[key] = r
	} else {
		delete(c.halted, key)
	}
	c.pruneHalted()
}

// pruneHalted forgets halted rounds that ended (superseded, recorded, the
// ConfigMap deleted) and sets the gauge. c.mu must be held.
func (c *Controller) pruneHalted() {
	for key, r := range c.halted {
		if e := c.entries[key]; e == nil || e.round != r {
			delete(c.halted, key)
		}
	}
	c.metrics.RoundsHalted.Set(float64(len(c.halted)))
}

// lastLook is a finished round's last look: ProgressDeadline after its last
// restart, replacements that are still not Ready are reported. With
// MAX_UNAVAILABLE=100% or a single replica no wave waits for them, and this
// is the only signal.
type lastLook struct {
	hash   digest
	at     time.Time
	before map[string]bool // the round's pods: the others are replacements
}

func newLastLook(r *round, deadline time.Duration) *lastLook {
	s := &lastLook{hash: r.hash, at: time.Now().Add(deadline), before: make(map[string]bool, len(r.pods))}
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
	sel, err := selector.Parse(obj.selector)
	if err != nil {
		return 0, nil // the next round says so
	}
	live, err := c.listWhole(ctx, obj.namespace, sel)
	if err != nil {
		return 0, fmt.Errorf("list pods: %w", err)
	}
	var notReady []listedPod
	for _, p := range live {
		if !p.terminating && p.owned && !p.ready && !s.before[p.uid] {
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
