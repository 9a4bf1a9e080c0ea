package policy

import (
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
	"github.com/k8spatterns/config-watcher/selector"
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
)

// round is the restart of the pods one ConfigMap selects, for one digest.
// intent, writing and rewrite are guarded by the controller's mu; the rest
// belongs to the worker that runs the round.
type round struct {
	hash     digest
	selector string
	sel      *selector.Selector
	intent   string // the intent it wrote or resumed ("" while none)
	// writing is the intent being written: its event may come before the
	// write's answer, and must not end the round.
	writing string
	// rewrite: the intent was wiped (apply); it is written again before
	// the next restart.
	rewrite bool
	resumed bool       // it resumed an intent: earlier rounds restarted some of its pods
	sent    bool       // a restart was sent (owned by the worker)
	pods    []podRef   // pods[i].rv is refreshed by its wave and its restart
	state   []podState // state[i] is pods[i]'s, owned by its restart
	indexed *indexed   // set when the round began from the pod index

	// A round in waves (waves.go), one that did not begin from the index,
	// takes its pods from its first wave's list; listed is set then, under
	// the namespace budget's lock, which also guards mostSeen, estimate and
	// allowed (other rounds' waves count this one's budget too).
	listed   bool
	only     map[string]bool // a resumed round's intent: the pods it names (nil: all)
	mostSeen map[string]int  // by owner uid: the most of its live pods seen (budget.go)
	estimate *estimate       // the first owner whose desired replicas could not be read
	allowed  int             // how many more pods may go unavailable, as last counted
	progress time.Time       // its latest restart, or its first wave
	halted   bool            // no restart possible for ProgressDeadline
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
}

type podState uint8

const (
	podPending   podState = iota
	podRestarted          // or would be, in a dry run
	podGone               // not found
	podRefused            // replaced by another pod of its name, or (index) changed since seen
	podLeft               // changed since selected, and no longer selected
)

var (
	errNotLeader  = errors.New("not the leader: round stopped")
	errSuperseded = errors.New("the configmap changed: round superseded") // the change queued it again
	// errIntentLost: the round's intent was wiped; write it again, go on.
	errIntentLost = errors.New("the round's intent was removed")
)

// current is the one currency check, asked before every write (intent,
// each restart and retry, record): nil if this replica may act and round
// r (nil for an adoption or a record without a round) is still the current
// one for the ConfigMap as obj shows it.
func (c *Controller) current(ctx context.Context, key string, obj object, r *round) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !c.mayAct() {
		return errNotLeader
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	switch {
	case e == nil || !e.exists || e.obj.uid != obj.uid || e.obj.hash != obj.hash || e.obj.selector != obj.selector:
		return errSuperseded
	case r == nil:
		return nil
	case e.round != r:
		return errSuperseded
	case r.rewrite:
		return errIntentLost
	}
	return nil
}

func (c *Controller) mayAct() bool { return c.cfg.MayAct == nil || c.cfg.MayAct() }

// reconcile takes one ConfigMap one step along the state model (doc.go).
// An error means "retry later"; what retrying cannot fix returns nil. after,
// if not 0, is when to look again: a round waiting in waves, or a finished
// round's last look.
func (c *Controller) reconcile(ctx context.Context, key string) (result string, after time.Duration, err error) {
	c.mu.Lock()
	e := c.entries[key]
	if e == nil || !e.exists {
		c.mu.Unlock()
		return resultGone, 0, nil
	}
	step, obj, r, left, last := e.decide(c.recordsOnServer()), e.obj, e.round, e.i, e.last
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
			return resultAdopted, 0, nil
		}
		return resultUnchanged, 0, nil
	}

	// stepContinue, stepResume or stepRound.
	sel, err := selector.Parse(obj.selector)
	if err != nil {
		// Not retried: the fix comes as an event, and the change is
		// still pending then.
		c.metrics.InvalidSelectors.Inc()
		log.Error("refusing to restart pods: invalid selector", "selector", truncate(obj.selector, 256), "err", err)
		c.event(obj, events.Warning, "InvalidSelector", fmt.Sprintf("Refusing selector %q: %v. No pod was restarted.", truncate(obj.selector, 256), err))
		return resultRefused, 0, nil
	}
	log = log.With("selector", sel.String())
	if r == nil {
		var resume *intent
		if step == stepResume {
			resume = &left
		}
		if r, err = c.beginRound(ctx, key, obj, sel, resume, log); errors.Is(err, errSuperseded) {
			return resultUnchanged, 0, nil
		}
	}
	if err == nil {
		err = c.runRound(ctx, key, obj, r, log)
	}
	if errors.Is(err, errWaiting) {
		if r.halted {
			return resultWaiting, haltedPolls * c.wavePoll, nil
		}
		return resultWaiting, c.wavePoll, nil
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
	restarted := r.count(podRestarted)
	log.Info("pods restarted", obj.dataAttr(), "pods", restarted)
	if c.cfg.DryRun {
		c.event(obj, events.Normal, "DryRun", fmt.Sprintf("Would restart %d pod(s) matching %s for %s (dry run: nothing changed)", restarted, sel, obj.dataName()))
	} else {
		c.event(obj, events.Normal, "PodsRestarted", fmt.Sprintf("Restarted %d pod(s) matching %s for %s", restarted, sel, obj.dataName()))
		return resultRestarted, c.cfg.ProgressDeadline, nil // the last look (lastLook)
	}
	return resultRestarted, 0, nil
}

// runRound takes the round one wave further, or, begun from the index,
// restarts its pods at once and sweeps; a wiped intent is written again and
// the round goes on.
func (c *Controller) runRound(ctx context.Context, key string, obj object, r *round, log *slog.Logger) error {
	for rewrites := 0; ; rewrites++ {
		if rewrites > maxRewrites {
			return fmt.Errorf("the round's intent was removed %d times: %w", rewrites, errIntentLost)
		}
		var err error
		if r.indexed == nil {
			err = c.wave(ctx, key, obj, r, log)
		} else {
			err = c.restartIndexed(ctx, key, obj, r, log)
		}
		if !errors.Is(err, errIntentLost) {
			return err
		}
		log.Info("the round's intent was removed (the object replaced?); writing it again")
	}
}

// maxRewrites bounds how often one reconcile writes a wiped intent again:
// something that keeps removing it is not fought without a pause.
const maxRewrites = 3

// needsIntent: r has pods and no intent on the server (none yet, or wiped).
func (c *Controller) needsIntent(r *round) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(r.pods) > 0 && (r.intent == "" || r.rewrite)
}

// wrote reports whether the intent text is the round's own: written, or
// being written. A removed intent ("") is ours only before we wrote one.
func (r *round) wrote(text string) bool {
	return text == r.intent || (r.writing != "" && text == r.writing)
}

// beginRound begins a round. With MAX_UNAVAILABLE=100%, a new round takes
// the pods the pod index selects, if it can answer now (sweep.go); any other
// takes them from its first wave's list (waves.go): for a resumed round,
// those its intent names (the others were created after it began, with this
// data). The round is kept from here on, so that a retry does not take pods
// created since: they run the new data.
func (c *Controller) beginRound(ctx context.Context, key string, obj object, sel *selector.Selector, resume *intent, log *slog.Logger) (*round, error) {
	r := &round{hash: obj.hash, selector: obj.selector, sel: sel, resumed: resume != nil}
	if resume != nil {
		r.intent, r.only = resume.text, resume.uids()
	} else if c.cfg.MaxUnavailable.Percent == 100 {
		r.pods, r.indexed = c.fromIndex(obj.namespace, sel)
	}
	if r.indexed != nil {
		r.state = make([]podState, len(r.pods))
		log.Info("data changed; restarting pods", obj.dataAttr(), "pods", len(r.pods), "from_index", true)
	}

	if err := c.current(ctx, key, obj, nil); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || (resume != nil && e.i.text != r.intent) {
		return nil, errSuperseded
	}
	e.round, e.last = r, nil
	return r, nil
}

// writeIntent writes I: round r for obj.hash over pods. An intent too large
// for the annotations falls back to the form that names no pods. Found
// superseded after the write, a round that has restarted nothing removes
// the intent again: no pod ran its data, and left behind it would read as
// pods mixed.
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
	if err := c.current(ctx, key, obj, r); err != nil {
		if errors.Is(err, errSuperseded) && !r.resumed && !r.sent {
			c.undoIntent(ctx, key, obj, in, log)
		}
		return err
	}
	return nil
}

// errIntentTooLong: the server refused an intent for the size of the
// annotations.
var errIntentTooLong = errors.New("the intent is over the annotations' size limit")

// roomInAnnotations is what a refusal for their size asks for.
const roomInAnnotations = "room in the annotations: the others fill the 256 KiB"

func (c *Controller) writeIntentText(ctx context.Context, key string, obj object, r *round, in intent) error {
	c.mu.Lock()
	r.writing = in.text
	c.mu.Unlock()
	return c.writeState(ctx, key, obj, r, RestartingAnnotation, in.text, func(e *entry) {
		e.i = in
		if e.obj.hash != in.hash {
			e.outdated = in.text // the data moved on while we wrote
		}
		if e.round == r {
			r.intent, r.rewrite = in.text, false
		}
	})
}

// undoIntent removes intent in, written for a round found superseded
// before it restarted anything, unless someone wrote another since. It is
// the one write that does not ask current: it undoes.
func (c *Controller) undoIntent(ctx context.Context, key string, obj object, in intent, log *slog.Logger) {
	c.mu.Lock()
	e := c.entries[key]
	ours := e != nil && e.i.text == in.text
	c.mu.Unlock()
	if !ours || !c.mayAct() {
		return
	}
	var rv uint64
	if c.recordsOnServer() {
		var err error
		if rv, err = c.writeAnnotations(ctx, obj, map[string]any{RestartingAnnotation: nil}); err != nil {
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
		e.i = intent{}
		e.wrote(rv, RestartingAnnotation, "")
	}
}

// record writes R = obj.hash and removes I, ending round r (nil for an
// adoption) unless r is no longer the current one.
func (c *Controller) record(ctx context.Context, key string, obj object, r *round) error {
	return c.writeState(ctx, key, obj, r, RestartedForAnnotation, obj.hash.text(), func(e *entry) {
		e.r, e.i, e.adopted = obj.hash, intent{}, false
		// The round ends here, unless the record's own event came back
		// first and ended it already (apply): its last look is due either
		// way, but not if another round has begun since.
		if r != nil && (e.round == r || e.round == nil) {
			e.round = nil
			if !c.cfg.DryRun {
				e.last = newLastLook(r, c.cfg.ProgressDeadline)
			}
		}
	})
}

// writeState patches R (removing I) or I on the ConfigMap, or on a Secret's
// state ConfigMap, if round r is still current, then applies the write to
// the entry. Without RECORD_HASH, or in a dry run, the state lives in
// memory only.
func (c *Controller) writeState(ctx context.Context, key string, obj object, r *round, annotation, value string, apply func(e *entry)) error {
	if err := c.current(ctx, key, obj, r); err != nil && !errors.Is(err, errIntentLost) {
		return err
	}
	var written uint64
	if c.recordsOnServer() {
		annotations := map[string]any{annotation: value}
		if annotation == RestartedForAnnotation {
			annotations[RestartingAnnotation] = nil
		}
		var err error
		written, err = c.writeAnnotations(ctx, obj, annotations)
		need := "verb patch on configmaps, or RECORD_HASH=false"
		if obj.kind == kindSecret {
			need = "verbs patch and create on configmaps (the manifests/secrets component), or RECORD_HASH=false"
		}
		switch classify(err) {
		case answerOK:
		case answerGone, answerConflict:
			// Deleted or replaced meanwhile: the new object gets its own round.
			return fmt.Errorf("%s gone or replaced: %w", obj.kind.logKey(), errSuperseded)
		case answerTooLong:
			if annotation == RestartingAnnotation {
				return fmt.Errorf("%w: %w", errIntentTooLong, err) // writeIntent decides
			}
			return c.refused(obj, "patch", "configmaps", roomInAnnotations, err)
		case answerRefused:
			return c.refused(obj, "patch", "configmaps", need, err)
		default:
			return fmt.Errorf("write %s for %s %s/%s: %w", annotation, obj.kind.logKey(), obj.namespace, obj.name, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		e.wrote(written, annotation, value) // older events show R and I as they were before
		apply(e)
	}
	return nil
}

// writeAnnotations writes R or I (nil removes one) where the object's kind
// keeps them, and returns the revision the server answered.
func (c *Controller) writeAnnotations(ctx context.Context, obj object, annotations map[string]any) (uint64, error) {
	if obj.kind == kindSecret {
		return c.writeSecretState(ctx, obj, annotations) // apiclient hides the digest in refusals
	}
	return c.patchAnnotations(ctx, obj, annotations)
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
	if errors.Is(err, errNotLeader) || errors.Is(err, errSuperseded) || errors.Is(err, context.Canceled) {
		return
	}
	if _, ok := errors.AsType[*refusal](err); ok {
		return // its Event is out already
	}
	c.event(obj, events.Warning, "RestartFailed", truncate(err.Error(), 512)+" (will retry)")
}
