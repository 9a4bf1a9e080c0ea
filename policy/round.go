package policy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/internal/truncate"
)

// Results of a reconcile, as counted in config_watcher_reconciles_total.
const (
	resultRestarted = "restarted"
	resultAdopted   = "adopted"
	resultUnchanged = "unchanged"
	resultRefused   = "refused"
	resultError     = "error"
	resultGone      = "gone"
	resultWaiting   = "waiting" // a round gave its worker back until pods become Ready
	// resultNotOptedIn: an object of a namespace that did not opt in
	// (NAMESPACE_SELECTOR), ignored.
	resultNotOptedIn = "not_opted_in"
)

// round is the restart of the pods one ConfigMap selects, for one digest.
// It belongs to the worker that runs it (doc.go): key, hash, selector and
// sel never change, so others may read them; the rest is the worker's, but
// for what the namespace budget's lock guards (below).
type round struct {
	key      string // of its object
	hash     digest
	keys     keyDigests // hash's key digests, recorded with it
	selector string     // what sel was made from (object.selectsBy)
	sel      *selection
	resumed  bool // it resumed an intent: earlier rounds restarted some of its pods
	// overMixed: it began over an intent it does not resume (a round cut
	// short, halted or superseded): its pods are mixed, and what it leaves
	// if it undoes its own intent must say so (undoIntent).
	overMixed bool
	sent      atomic.Bool   // a restart request was sent (restart goroutines)
	pods      []podRef      // pods[i].rv is refreshed by its wave and its restart
	state     []podState    // state[i] is pods[i]'s, written by its restart's goroutine
	indexed   *indexed      // set when the round took its pods from the pod index (sweep.go)
	next      time.Duration // when a waiting round looks again (nextLook)
	listedAt  uint64        // the revision of the LIST its wave's view came from (viewOf; 0: the index's)
	token     time.Time     // a token of MAX_RESTARTS_PER_SECOND it reserved for a pod that needs the budget: when it is due (tokenFor)
	tokenAt   time.Time     // its last wave left restarts for want of a token of MAX_RESTARTS_PER_SECOND due soon: when one may be reserved (soonTokens; zero: none left)

	// A round in waves (waves.go), one that did not begin from the index,
	// takes its pods from its first wave's list; listed is set then, under
	// the namespace budget's lock, which also guards mostSeen, live,
	// owners, estimate, unanswered and allowed (other rounds' waves count
	// this one's budget too).
	listed   bool
	only     map[string]bool     // a resumed round's intent: the pods it names (nil: all)
	groups   [][]string          // the same by owner, where the intent tells them apart (oweResumed)
	owes     bool                // it resumed an intent no round of this term took: another process's restarts (oweResumed)
	mostSeen map[string]int      // by owner uid: the most of its live pods seen (budget.go)
	owners   map[string]ownerRef // by uid: the owners of pods it selected at a count (budget.go)
	live     map[string]string   // pod uid → owner uid: the owned live pods of the last count
	left     map[string]leftPod  // by pod uid: pods gone by other hands within leftAfter (budget.go)
	estimate *estimate           // the first owner whose desired replicas could not be read
	// unanswered: the first owner whose read got no answer that tells
	// where that held a pod back (count): said once, as estimate.
	unanswered *estimate
	progress   time.Time // its latest restart, or its first wave
	halted     bool      // no restart possible for ProgressDeadline
	// seen is when this process first saw the data of the round (zero for a
	// resumed round, whose change another process saw); firstRestart is
	// set once its first restart was accepted. For the histograms.
	seen         time.Time
	firstRestart atomic.Bool
	// seenAt is the moment (Controller.moment) its change was seen here,
	// or, resumed or first seen before it, the round began: pods the
	// DELETEs sent after it replaced are not its own (seenAfter); seenFloor
	// as entry.seenFloor.
	seenAt, seenFloor uint64
	// mark is the pod revision of the moment its change was seen, where a
	// round was in progress then (mark.go); nil: none.
	mark *seenMark
	// storm: it began while its object was in a storm, and a data change
	// does not supersede it (storm.go) until its worker clears it, under
	// c.mu, once the storm ends or the round halts (endStormHold).
	storm bool
	// haltFound: it resumed an intent the server shows halted (by a
	// controller before this one): it is halted from its first wave.
	haltFound time.Time
	// blocked names a pod whose eviction a disruption budget refused.
	blocked atomic.Pointer[string]
}

// count returns how many of the round's pods are in state st.
func (r *round) count(st podState) int {
	n := 0
	for _, s := range r.state {
		if s == st {
			n++
		}
	}
	return n
}

// podRef is a pod as last seen in a view that selected it: its uid and
// resourceVersion are the preconditions of each restart.
type podRef struct {
	name, uid string
	rv        string // metadata.resourceVersion as seen
	version   uint64 // the same as a number, 0 if it is not one
	ownerUID  string // its controller's uid ("": none): the intent groups its pods by it
}

type podState uint8

const (
	podPending   podState = iota
	podRestarted          // or would be, in a dry run
	podGone               // not found, or terminating or finished since it was selected
	podReplaced           // another pod of its name since it was selected
	podLeft               // changed since selected, and no longer selected
)

var (
	errNotLeader  = errors.New("not the leader: round stopped")
	errSuperseded = errors.New("the object changed: round superseded") // the change queued it again
	// errIntentLost: the round's intent is not on the server (wiped, or
	// the object replaced): write it again, go on.
	errIntentLost = errors.New("the round's intent is not on the object")
)

// current is the one currency check, asked right before every write
// request (intent, each restart and retry, halt, record), after whatever
// that request waited for: nil if this replica may act, the namespace is
// opted in, and round r (nil for an adoption or a record without a round)
// is still the current one for the object as obj shows it.
func (c *Controller) current(ctx context.Context, key string, obj object, r *round) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !c.mayAct() {
		return errNotLeader
	}
	if !c.optedIn(obj.namespace) {
		return fmt.Errorf("namespace %s opted out: %w", obj.namespace, errSuperseded)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.vouched(obj) {
		return errNotVouched
	}
	e := c.entries[key]
	switch {
	case e == nil || !e.exists || e.obj.uid != obj.uid || e.obj.selectsBy() != obj.selectsBy():
		return errSuperseded
	case e.obj.hash != obj.hash && (r == nil || !r.storm): // a storm's round goes on for its data
		return errSuperseded
	case r == nil:
		return nil
	case e.round != r || e.ended:
		return errSuperseded
	case e.ourIntent != "" && e.needsIntent(r, c.recordsOnServer()):
		return errIntentLost
	}
	return nil
}

func (c *Controller) mayAct() bool { return c.cfg.MayAct == nil || c.cfg.MayAct() }

// reconcile takes one object one step along the state model
// (docs/design.md#state-model). An error means "retry later"; what retrying
// cannot fix returns nil. after, if not 0, is when to look again: a round
// waiting in waves, or a finished round's last look.
func (c *Controller) reconcile(ctx context.Context, key string) (result string, after time.Duration, err error) {
	defer func() {
		if errors.Is(err, errNotVouched) {
			// Nothing was written since current asked; the round, if
			// any, goes on once the watch streams again.
			c.waitForViews(key)
			result, after, err = resultWaiting, 0, nil
		}
	}()
	c.mu.Lock()
	e := c.entries[key]
	if e == nil || !e.exists {
		c.mu.Unlock()
		return resultGone, 0, nil
	}
	now := time.Now()
	news, stormLeft := c.judgeStorm(key, e, now)
	if news != stormSame {
		// Said now, not after this look's wave.
		obj := e.obj
		c.mu.Unlock()
		c.sayStorm(obj, news)
		c.mu.Lock()
		if e = c.entries[key]; e == nil || !e.exists {
			c.mu.Unlock()
			return resultGone, 0, nil
		}
	}
	if stormLeft > 0 {
		// Look again when the storm may end: its Event, and the round
		// that brings every pod to the last data.
		defer func() {
			if err == nil && (after == 0 || after > stormLeft) {
				after = stormLeft
			}
		}()
	}
	if !c.optedIn(e.obj.namespace) {
		// Its namespace opted out after the event that queued it.
		obj := e.obj
		c.mu.Unlock()
		c.ignoreNotOptedIn(obj)
		return resultNotOptedIn, 0, nil
	}
	if e.ended {
		// A view ended the round (someone's record or intent, other
		// data or selector): its worker, here, lets it go.
		gone, undo := e.letGo()
		c.pruneHalted()
		if undo.present() {
			obj := e.obj
			c.mu.Unlock()
			if c.onlyItsPods(ctx, obj.namespace, gone) {
				c.undoIntent(ctx, key, obj, gone, undo, c.log.With("namespace", obj.namespace, obj.kind.logKey(), obj.name))
			}
			c.mu.Lock()
			if e = c.entries[key]; e == nil || !e.exists {
				c.mu.Unlock()
				return resultGone, 0, nil
			}
		}
	}
	step, obj, r, left, last := e.decide(c.recordsOnServer()), e.obj, e.round, e.i, e.last
	seenAt := e.seenAt
	halt := e.shown().halted
	if r != nil && r.storm {
		obj.hash, obj.keys = r.hash, r.keys // it goes on, and records, for its own data
	}
	recordedKeys := e.rKeys
	storm := false
	if r == nil && (step == stepRound || step == stepResume) {
		if wait := c.stormGate(e, now); wait > 0 {
			carry := e.toCarry(c.recordsOnServer())
			c.mu.Unlock()
			if carry != nil {
				if err := c.writeState(ctx, key, obj, nil, stateWrite{carry: carry}, func(*entry) {}); err != nil && !errors.Is(err, errSuperseded) {
					return resultError, 0, err
				}
			}
			return resultWaiting, wait, nil
		}
		storm = e.storm
	}
	c.mu.Unlock()
	log := c.log.With("namespace", obj.namespace, obj.kind.logKey(), obj.name)

	switch step {
	case stepNothing:
		if last != nil && last.hash == obj.hash {
			after, err = c.takeLastLook(ctx, key, obj, last, log)
		}
		return resultUnchanged, after, err
	case stepRecord, stepAdopt:
		err := c.record(ctx, key, obj, nil)
		switch {
		case errors.Is(err, errSuperseded):
			return resultUnchanged, 0, nil
		case err != nil:
			return resultError, 0, err
		case step == stepAdopt:
			log.Info("adopted", obj.dataAttr())
			if obj.kind == kindSecret {
				// Its state lives apart and can be lost apart: never
				// silently.
				c.event(obj, events.Normal, "Adopted", "No state of config-watcher was found for this Secret (first sight, or its state ConfigMap "+stateName(obj.name)+" was deleted or not written by config-watcher): its data is adopted as it is now, and its pods are restarted at its next change.")
			}
			return resultAdopted, 0, nil
		}
		return resultUnchanged, 0, nil
	}

	// stepContinue, stepResume or stepRound.
	sel, err := c.selectionOf(obj)
	if err != nil && step == stepRound {
		c.markRefused(key, seenAt)
	}
	switch {
	case errors.Is(err, errReferencingValue):
		c.metrics.InvalidSelectors.Inc()
		log.Error("refusing to restart pods: invalid annotation", "err", err)
		c.event(obj, events.Warning, "InvalidAnnotation", fmt.Sprintf("Refusing %v. No pod was restarted.", err))
		return resultRefused, 0, nil
	case err != nil:
		// Not retried: the fix comes as an event, and the change is
		// still pending then.
		c.metrics.InvalidSelectors.Inc()
		log.Error("refusing to restart pods: invalid selector", "selector", truncate.String(obj.selector, 256), "err", err)
		c.event(obj, events.Warning, "InvalidSelector", fmt.Sprintf("Refusing selector %q: %v. No pod was restarted.", truncate.String(obj.selector, 256), err))
		return resultRefused, 0, nil
	}
	log = log.With("selector", sel.labels.String())
	if sel.ref != nil {
		log = log.With("references", true)
	}
	if r == nil {
		var resume *intent
		if step == stepResume {
			resume = &left
		}
		if !left.present() {
			c.narrow(sel, obj, recordedKeys)
		}
		if r, err = c.beginRound(ctx, key, obj, sel, resume, halt, storm, log); errors.Is(err, errSuperseded) {
			return resultUnchanged, 0, nil
		}
	}
	if err == nil {
		err = c.runRound(ctx, key, obj, r, log)
	}
	if errors.Is(err, errWaiting) {
		return resultWaiting, r.next, nil
	}
	if err == nil {
		err = c.record(ctx, key, obj, r)
	}
	if errors.Is(err, errSuperseded) {
		log.Info("round superseded by a newer change", obj.dataAttr())
		return resultUnchanged, 0, nil
	}
	if err != nil {
		c.roundFailed(obj, err)
		return resultError, 0, err
	}
	if !r.seen.IsZero() {
		c.metrics.ChangeToRecord.Observe(time.Since(r.seen).Seconds())
	}
	restarted := r.count(podRestarted)
	log.Info("pods restarted", obj.dataAttr(), "pods", restarted)
	if c.cfg.DryRun {
		c.event(obj, events.Normal, "DryRun", fmt.Sprintf("Would restart %d pod(s) %s for %s (dry run: nothing changed)", restarted, sel, obj.dataName()))
	} else {
		c.event(obj, events.Normal, "PodsRestarted", fmt.Sprintf("Restarted %d pod(s) %s for %s", restarted, sel, obj.dataName()))
		return resultRestarted, c.cfg.ProgressDeadline, nil // the last look (lastLook)
	}
	return resultRestarted, 0, nil
}

// runRound takes the round one wave further; an intent the object no
// longer shows is written again and the round goes on, and pods its
// membership gained are restarted by another wave at once.
func (c *Controller) runRound(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	for rewrites := 0; ; {
		err := c.wave(ctx, key, obj, r, log)
		switch {
		case errors.Is(err, errMembersAdded):
			continue // once: the membership is complete now
		case !errors.Is(err, errIntentLost):
			return err
		}
		if rewrites++; rewrites > maxRewrites {
			return fmt.Errorf("the round's intent was removed %d times: %w", rewrites, errIntentLost)
		}
		log.Info("the round's intent is not on the object as it must read (removed, the object replaced, or its pods mixed since); writing it again")
	}
}

// maxRewrites bounds how often one reconcile writes a wiped intent again:
// something that keeps removing it is not fought without a pause.
const maxRewrites = 3

// ensureIntent writes round r's intent (I) over its pods unless the server
// shows it already: before the round's first restart, or its wait to
// settle, so that a round cut short leaves it behind.
func (c *Controller) ensureIntent(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	switch need, mixed := c.needsIntent(key, r); {
	case !need:
		return nil
	case mixed:
		if err := c.writeIntentText(ctx, key, obj, r, mixedIntent); err != nil {
			return fmt.Errorf("record the round in progress: %w", err)
		}
		return nil
	}
	return c.writeIntent(ctx, key, obj, r, r.pods, log)
}

// needsIntent: r has pods, and the server does not show its intent; mixed
// where that is mixedIntent (entry.mixedDue).
func (c *Controller) needsIntent(key string, r *round) (need, mixed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil {
		return false, false
	}
	return e.needsIntent(r, c.recordsOnServer()), e.mixedDue(r)
}

// beginRound begins a round. It takes its pods from its first wave's view
// (waves.go: the pod index's where one watches, sweep.go): for a resumed
// round, those its intent names (the others were created after it began,
// with this data), halted from the start if the object shows the intent
// halted. The round is kept from here on, so that a retry does not take
// pods created since: they run the new data.
func (c *Controller) beginRound(ctx context.Context, key string, obj object, sel *selection, resume *intent, halt halt, storm bool, log *slog.Logger) (*round, error) {
	r := &round{key: key, hash: obj.hash, keys: obj.keys, selector: obj.selectsBy(), sel: sel, resumed: resume != nil, storm: storm}
	if resume != nil {
		r.only = resume.uids()
		if groups := resume.groups(); len(groups) > 1 {
			r.groups = groups
		}
		if halt.hash == resume.hash && !halt.at.IsZero() {
			r.haltFound = halt.at
		}
	}

	if err := c.current(ctx, key, obj, nil); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || e.round != nil || (resume != nil && e.i.text != resume.text) {
		return nil, errSuperseded
	}
	e.round, e.last, e.ourIntent, e.sawOther = r, nil, "", false
	c.begin(obj.namespace, r)
	r.overMixed = resume == nil && e.i.present()
	r.seenAt, r.seenFloor = e.seenAt, e.seenFloor
	if resume != nil || r.seenAt == 0 {
		r.seenFloor = c.shownUpTo(obj.namespace) // before the moment: no later than it
		r.seenAt = c.moment.Add(1)
	} else {
		r.mark = e.mark
	}
	if resume != nil {
		r.owes = e.tookIntent != resume.text
		e.ourIntent, e.tookIntent = resume.text, resume.text
	} else if !c.cfg.DryRun {
		r.seen = e.changed
	}
	return r, nil
}

// writeIntent writes I: round r for obj.hash over pods. An intent too large
// for the annotations falls back to the form that names no pods.
func (c *Controller) writeIntent(ctx context.Context, key string, obj object, r *round, pods []podRef, log *slog.Logger) error {
	in := newIntent(obj.hash, pods)
	err := c.writeIntentText(ctx, key, obj, r, in)
	if errors.Is(err, errIntentTooLong) && !in.all {
		coarse := parseIntent(obj.hash.text() + "/*")
		log.Warn("intent naming the round's pods is over the annotation size limit; writing the form that names none", "pods", len(pods))
		c.event(obj, events.Warning, "IntentTooLarge", fmt.Sprintf("The intent naming %d pod(s) does not fit in the annotations (256 KiB for all together); wrote the form that names none instead: if this round is cut short, the next one restarts every selected pod.", len(pods)))
		in = coarse
		err = c.writeIntentText(ctx, key, obj, r, in)
	}
	if errors.Is(err, errIntentTooLong) {
		err = c.refused(obj, "patch", "configmaps", roomInAnnotations, err)
	}
	if err != nil {
		return fmt.Errorf("record the round in progress: %w", err)
	}
	return nil
}

// errIntentTooLong: the server refused an intent for the size of the
// annotations.
var errIntentTooLong = errors.New("the intent is over the annotations' size limit")

// roomInAnnotations is what a refusal for their size asks for.
const roomInAnnotations = "room in the annotations: the others fill the 256 KiB"

// writeIntentText writes intent in for round r, removing any halt: a new
// intent has not halted.
func (c *Controller) writeIntentText(ctx context.Context, key string, obj object, r *round, in intent) error {
	return c.writeState(ctx, key, obj, r, stateWrite{intent: &in}, func(e *entry) {
		e.i = in
		if e.obj.hash != in.hash {
			e.outdated = in.text // the data moved on while we wrote
			if e.round == r {
				e.sawOther = true
			}
		}
		if e.round == r {
			e.ourIntent, e.tookIntent = in.text, in.text
		}
	})
}

// onlyItsPods: the pods r's selection picks now are all pods r took. One
// created since it took them (a scale-up while it settled) runs its data:
// the pods are mixed, and its intent stays. Where the pods cannot be seen,
// it stays too: a restart too many, not a pod left on other data.
func (c *Controller) onlyItsPods(ctx context.Context, namespace string, r *round) bool {
	live, err := c.selectedNow(ctx, namespace, r.sel)
	if err != nil {
		return false
	}
	taken := make(map[string]bool, len(r.pods))
	for _, p := range r.pods {
		taken[p.uid] = true
	}
	for _, p := range live {
		if !p.terminating && p.live() && !taken[p.uid] {
			return false
		}
	}
	return true
}

// undoIntent removes intent in, written for a round superseded before it
// restarted anything (letGo, onlyItsPods), unless someone wrote another
// since. A round that began over mixed pods leaves mixedIntent instead:
// the intent it replaced said so, and removed, the next round would take
// every pod for one on R. It is the one write that does not ask current:
// it undoes.
func (c *Controller) undoIntent(ctx context.Context, key string, obj object, r *round, in intent, log *slog.Logger) {
	w := stateWrite{undo: true, mixed: r.overMixed}
	c.mu.Lock()
	e := c.entries[key]
	ours := e != nil && e.i.text == in.text
	var after stored
	if ours {
		after = w.after(e.shown(), obj.hash, obj.keys)
	}
	c.mu.Unlock()
	if !ours || !c.mayAct() {
		return
	}
	var rv uint64
	if c.recordsOnServer() {
		var err error
		leads := func() error {
			if !c.mayAct() {
				return errNotLeader
			}
			return nil
		}
		if rv, after.holder, err = c.writeAnnotations(ctx, obj, w, after, leads); err != nil {
			// The next round writes its own intent; until then the
			// model reads this one as pods mixed, which errs on a
			// restart too many.
			log.Warn("cannot remove the intent of a superseded round", "err", err)
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil && e.i.text == in.text {
		e.i = w.leaves()
		e.wrote(rv, after)
	}
}

// record writes R = obj.hash (and its key digests, obj.keys) and removes I
// and the halt, ending round r (nil for an adoption) unless r is no longer
// the current one. A round that saw the data change while it ran leaves
// mixedIntent for I instead.
func (c *Controller) record(ctx context.Context, key string, obj object, r *round) error {
	w := stateWrite{record: true}
	c.mu.Lock()
	if e := c.entries[key]; e != nil && r != nil {
		w.mixed = e.round == r && e.sawOther
	}
	c.mu.Unlock()
	if w.mixed {
		c.log.Info("the data changed while the round ran: its replacements may run other data, and the next round restarts every pod",
			"namespace", obj.namespace, obj.kind.logKey(), obj.name)
	}
	return c.writeState(ctx, key, obj, r, w, func(e *entry) {
		e.r, e.rKeys, e.i, e.adopted = obj.hash, obj.keys, w.leaves(), false
		if w.mixed {
			c.queue.Add(key) // the next round is due (its storm gate permitting)
		}
		if r != nil && e.round == r {
			e.round, e.ended, e.ourIntent = nil, false, ""
			if !c.cfg.DryRun {
				e.last = newLastLook(r, c.cfg.ProgressDeadline)
			}
		}
	})
}

// writeHalt marks round r's intent halted on the object, so that a
// controller that resumes it (after a restart or a failover) is halted at
// once. A failure is only logged: the round stays halted here.
func (c *Controller) writeHalt(ctx context.Context, key string, obj object, r *round, at time.Time, log *slog.Logger) {
	h := halt{hash: r.hash, at: at}
	if err := c.writeState(ctx, key, obj, r, stateWrite{halt: &h}, func(*entry) {}); err != nil && !errors.Is(err, errSuperseded) && !errors.Is(err, errNotLeader) {
		log.Warn("cannot mark the halted round on the object; a controller that takes it over will find it halted only after PROGRESS_DEADLINE", "err", err)
	}
}

// stateWrite is one write of the state: a record (R = the data, removing I
// and the halt), an intent (removing the halt), a halt, an undo (removing I
// and the halt), or a carry (R, its keys and I as the entry holds them:
// toCarry). A record or an undo with mixed leaves mixedIntent for I
// instead of none.
type stateWrite struct {
	record bool
	mixed  bool
	intent *intent
	halt   *halt
	undo   bool
	carry  *stored
}

// leaves is the intent a record or an undo leaves.
func (w stateWrite) leaves() intent {
	if w.mixed {
		return mixedIntent
	}
	return intent{}
}

// annotations returns the write as a merge patch of annotations, for data
// hash with key digests keys; had: the object shows key digests (which a
// record without any removes).
func (w stateWrite) annotations(hash digest, keys keyDigests, had bool) map[string]any {
	switch {
	case w.record:
		a := map[string]any{RestartedForAnnotation: hash.text(), RestartingAnnotation: orNil(w.leaves().text), HaltedAnnotation: nil}
		if keys != "" || had {
			a[RestartedForKeysAnnotation] = orNil(string(keys))
		}
		return a
	case w.intent != nil:
		return map[string]any{RestartingAnnotation: w.intent.text, HaltedAnnotation: nil}
	case w.undo:
		return map[string]any{RestartingAnnotation: orNil(w.leaves().text), HaltedAnnotation: nil}
	case w.carry != nil:
		a := map[string]any{RestartedForAnnotation: orNil(w.carry.recorded.text()), RestartingAnnotation: orNil(w.carry.intent.text)}
		if w.carry.recordedKeys != "" || had {
			a[RestartedForKeysAnnotation] = orNil(string(w.carry.recordedKeys))
		}
		return a
	}
	return map[string]any{HaltedAnnotation: w.halt.text()}
}

// after returns the state the write leaves, from the state before it.
func (w stateWrite) after(st stored, hash digest, keys keyDigests) stored {
	switch {
	case w.record:
		st.recorded, st.recordedKeys, st.intent, st.halted = hash, keys, w.leaves(), halt{}
	case w.intent != nil:
		st.intent, st.halted = *w.intent, halt{}
	case w.undo:
		st.intent, st.halted = w.leaves(), halt{}
	case w.carry != nil:
		st.recorded, st.recordedKeys, st.intent = w.carry.recorded, w.carry.recordedKeys, w.carry.intent
	default:
		st.halted = *w.halt
	}
	return st
}

// writeState writes w on the object (or a Secret's state ConfigMap) if
// round r is still current, then applies it to the entry. Without
// RECORD_HASH, or in a dry run, the state lives in memory only. The answers
// that mean the object was replaced or deleted supersede the round only
// once an event shows it so (within c.replacedWait): a 409 or 404 that no
// replacement caused (an admission webhook's) is retried.
func (c *Controller) writeState(ctx context.Context, key string, obj object, r *round, w stateWrite, apply func(e *entry)) error {
	may := func() error {
		if err := c.current(ctx, key, obj, r); err != nil && !errors.Is(err, errIntentLost) {
			return err
		}
		return nil
	}
	if err := may(); err != nil {
		return err
	}
	c.mu.Lock()
	e := c.entries[key]
	if e == nil {
		c.mu.Unlock()
		return errSuperseded
	}
	after := w.after(e.shown(), obj.hash, obj.keys)
	e.writing = &after
	c.mu.Unlock()
	var written uint64
	if c.recordsOnServer() {
		var err error
		written, after.holder, err = c.writeAnnotations(ctx, obj, w, after, may)
		what := "the record"
		if w.intent != nil {
			what = "the intent"
		} else if w.halt != nil {
			what = "the halt"
		}
		need := "verb patch on configmaps, or RECORD_HASH=false"
		if obj.kind == kindSecret {
			need = "verbs patch and create on configmaps (the manifests/secrets component), or RECORD_HASH=false"
		}
		switch classify(err) {
		case answerOK:
		case answerNotFound, answerConflict:
			c.doneWriting(key, &after)
			if !c.waitReplaced(ctx, key, obj) {
				return fmt.Errorf("write %s on %s %s/%s: %w; no event shows it replaced or deleted, so it is written again", what, obj.kind.logKey(), obj.namespace, obj.name, err)
			}
			if w.record && r != nil {
				c.credit(key, obj)
			}
			return fmt.Errorf("%s gone or replaced: %w", obj.kind.logKey(), errSuperseded)
		case answerTooLong:
			c.doneWriting(key, &after)
			if w.intent != nil {
				return fmt.Errorf("%w: %w", errIntentTooLong, err) // writeIntent decides
			}
			return c.refused(obj, "patch", "configmaps", roomInAnnotations, err)
		case answerRefused:
			c.doneWriting(key, &after)
			return c.refused(obj, "patch", "configmaps", need, err)
		default:
			c.doneWriting(key, &after)
			return fmt.Errorf("write %s for %s %s/%s: %w", what, obj.kind.logKey(), obj.namespace, obj.name, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		e.wrote(written, after) // older events show R and I as they were before
		apply(e)
	}
	return nil
}

// doneWriting forgets a write in flight that failed.
func (c *Controller) doneWriting(key string, w *stored) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil && e.writing == w {
		e.writing = nil
	}
}

// defaultReplacedWait bounds the wait for the event that explains a 404 or
// 409 on our write of the state: a watch delivers it within milliseconds,
// even under load within seconds.
const defaultReplacedWait = 5 * time.Second

// waitReplaced reports whether an event shows obj deleted or replaced (its
// entry a tombstone, or of another uid), waiting up to c.replacedWait for
// one.
func (c *Controller) waitReplaced(ctx context.Context, key string, obj object) bool {
	return c.waitFor(ctx, c.replacedWait, func() bool {
		e := c.entries[key]
		return e == nil || !e.exists || e.obj.uid != obj.uid
	})
}

// credit: the record of a round whose pods were all restarted found obj
// deleted. Its tombstone takes the round's digest as R, which is what the
// pods run now: one re-created with the same data is no change for them.
func (c *Controller) credit(key string, obj object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil && !e.exists && e.obj.uid == obj.uid {
		e.r, e.rKeys, e.i, e.adopted = obj.hash, obj.keys, intent{}, false
	}
}

// writeAnnotations writes w, which leaves after, where the object's kind
// keeps R and I, and returns the revision the server answered and the uid
// of the object that holds them (after.holder when not told); may is asked
// again before a request that follows a wait.
func (c *Controller) writeAnnotations(ctx context.Context, obj object, w stateWrite, after stored, may func() error) (uint64, string, error) {
	if obj.kind == kindSecret {
		rv, holder, err := c.writeSecretState(ctx, obj, after.holder, after, may) // apiclient hides the digest in refusals
		return rv, cmp.Or(holder, after.holder), err
	}
	rv, err := c.patchAnnotations(ctx, obj, w.annotations(obj.hash, obj.keys, obj.stored.recordedKeys != ""))
	return rv, after.holder, err
}

// patchAnnotations merge-patches annotations of the ConfigMap, naming its
// uid so that a re-created one of the same name is not marked, and returns
// the revision the server answered.
func (c *Controller) patchAnnotations(ctx context.Context, obj object, annotations map[string]any) (uint64, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": obj.uid, "annotations": annotations}})
	if err != nil {
		return 0, fmt.Errorf("build patch: %w", err)
	}
	answer, err := c.api.MergePatch(ctx, apiclient.CorePath(obj.namespace, "configmaps", obj.name), patch)
	if err != nil {
		return 0, err
	}
	return gjson.GetBytes(answer, "metadata.resourceVersion").Uint(), nil
}

func (c *Controller) event(obj object, typ, reason, message string) {
	if c.cfg.Events == nil {
		return
	}
	c.cfg.Events.Event(events.Object{APIVersion: "v1", Kind: obj.kind.String(), Namespace: obj.namespace, Name: obj.name, UID: obj.uid}, typ, reason, message)
}

// roundFailed reports a failed round, but not a stop for losing the lease
// or for a newer change.
func (c *Controller) roundFailed(obj object, err error) {
	if errors.Is(err, errNotLeader) || errors.Is(err, errSuperseded) || errors.Is(err, errNotVouched) || errors.Is(err, context.Canceled) {
		return
	}
	if _, ok := errors.AsType[*refusal](err); ok {
		return // its Event is out already
	}
	c.event(obj, events.Warning, "RestartFailed", truncate.String(err.Error(), 512)+" (will retry)")
}
