package policy

import "time"

// entry is what the controller knows of one annotated ConfigMap or Secret.
// Every field is guarded by Controller.mu; round's fields belong to its
// worker (doc.go has the table).
type entry struct {
	// obj is the latest view of the object; obj.stored is the latest view
	// of R, I and the halt as the server has them (for a Secret, its state
	// ConfigMap's), which may predate our own writes: r and i are what
	// counts.
	obj object
	// rKeys are R's key digests (keys.go), set with r: "" where R has
	// none (written before, or by a controller that keeps none).
	rKeys keyDigests
	// r and i are R and I: taken from a view whose annotation differs from
	// what the server showed before (someone wrote it), and set by our own
	// writes at once. r outlives a removed annotation and, in a tombstone,
	// the object; i outlives the object too: a re-created object's pods
	// are those its round named.
	r digest
	i intent
	// written is our last write of R, I or the halt: the state right after
	// it, at the revision the server answered (of the object holding it).
	// Older views show its past. nil once a view as new as it is applied:
	// most entries never hold one for long.
	written *stored
	// writing is the state our write in flight leaves: its event may come
	// back before its answer, and is ours.
	writing *stored
	// ourIntent is the intent text of round: written, being written, or
	// resumed ("" before any). A view that shows it is ours; one that no
	// longer shows it, with no record in its place, is a wipe.
	ourIntent string
	// tookIntent is the last intent text this term's rounds wrote or
	// resumed: the restarts they chose under it are in the namespace
	// budget's flight already, so a round that resumes it again (a
	// narrowed selector, a retry) owes none of its pods (oweResumed).
	tookIntent string
	// outdated is the text of an intent seen while the data differed from
	// its digest.
	outdated string
	// sawOther: a view showed other data than the round's own after its
	// intent was written, so that replacements of its restarts may run
	// that data (only a round begun in a storm goes on then). beginRound
	// clears it; record reads it.
	sawOther bool
	// round is in progress here, for obj.hash. Only its worker sets and
	// clears it; a view that ends it sets ended, and the worker drops it
	// at its next look (the one place a round ends: reconcile).
	round *round
	ended bool
	// changed is when a view first showed the data as it is now (for the
	// change-to-restart histograms).
	changed time.Time
	// seenAt is the moment (Controller.moment) changed was set: a pod that
	// a DELETE sent after it replaced was created after the change was
	// seen, and is not restarted for it. seenFloor is what the pod index
	// had shown just before: a pod created at or below it came before the
	// change was seen, whatever a DELETE or a mark says later.
	seenAt, seenFloor uint64
	// mark places the moment changed was set among pod revisions, where a
	// round was in progress in the namespace then (mark.go); nil: none.
	mark *seenMark
	// changes are the latest data changes seen (StormChanges+1 of them at
	// most); storm is set, and stormRound (when the latest round begun in
	// the storm began), by the key's worker (storm.go).
	changes    []time.Time
	storm      bool
	stormRound time.Time
	last       *lastLook // the last round's last look, due later (waves.go)
	exists     bool      // false: a tombstone
	// goneFloor is what the pod index had shown when the object's
	// deletion was seen (0: not seen as it happened, or no index): a pod
	// it saw created above it may have started while the object was gone
	// (startedWhileGone).
	goneFloor uint64
	adopted   bool   // r was taken from the first sighting, not from a record
	seen      uint64 // sequence number of the last event about the object
	// stateRefused: a Secret's state write found its name held and waited
	// for a view that shows it ours in vain (waitStateHolder); none has
	// come since.
	stateRefused bool
}

// step is what a reconcile does next: a row of the table in
// docs/design.md#state-model.
type step int

const (
	stepNothing step = iota
	stepRecord
	stepAdopt
	stepContinue
	stepResume
	stepRound
)

// decide maps the entry's state to the next step. recordsOnServer: R and I
// are annotations, not memory only.
func (e *entry) decide(recordsOnServer bool) step {
	switch {
	case !e.obj.stored.known:
		return stepNothing // a Secret whose state has not been listed yet
	case e.round != nil && !e.ended:
		return stepContinue
	case e.i.present() && e.i.hash == e.obj.hash && e.i.text != e.outdated:
		return stepResume
	case e.i.present():
		return stepRound // some pods run I's data, some R's
	case e.r.isZero() || (e.r == e.obj.hash && e.adopted):
		return stepAdopt
	case e.r == e.obj.hash && recordsOnServer && e.shown().recorded != e.r:
		return stepRecord
	case e.r == e.obj.hash && e.obj.keys != "" && (e.rKeys != e.obj.keys || (recordsOnServer && e.shown().recordedKeys != e.obj.keys)):
		// Every pod runs R: its key digests are those of the data now
		// (an R written before, or without them).
		return stepRecord
	case e.r == e.obj.hash:
		return stepNothing
	default:
		return stepRound
	}
}

// verdict is what a view says of R and I: the one judgement of our writes
// against anyone else's.
type verdict uint8

const (
	verdictSame   verdict = iota // R and I as before (or their past)
	verdictOurs                  // our write in flight, or the round's own intent, come back
	verdictTheirs                // someone else's record or intent
	verdictWiped                 // the round's intent gone, no record in its place
)

// apply takes a view of the object (obj, and obj.stored of R and I) into
// the entry and returns what it says of R and I; the caller has dropped
// views older than one applied. It is the one place that tells our writes
// from anyone else's. shown is R and I as the server has them after the
// later of the views applied and our last write (written); a view older
// than our last write is that write's past, and its R and I do not count; a
// newer one shows what others made of them. A round in progress ends on
// someone else's record or intent, other data or another selector: apply
// sets ended, and never touches the round itself. A wipe (kubectl replace
// with the same data) ends nothing: the round writes its intent again
// before its next restart (needsIntent).
func (e *entry) apply(obj object) verdict {
	prev := e.shown()
	if e.obj.uid != "" && e.obj.uid != obj.uid && obj.kind == kindConfigMap {
		// A new ConfigMap under this name: the server holds none of our
		// annotations on it, but r and i still tell what the pods run.
		// (A Secret's state ConfigMap outlives a replaced Secret.)
		prev, e.written = stored{}, nil
	}
	now := obj.stored
	if e.written != nil && now.before(*e.written) {
		// On its way before our last write (we may have written twice
		// before the first write's event came back).
		now.recorded, now.intent, now.halted = prev.recorded, prev.intent, prev.halted
	}
	recorded := now.recordsAnew(prev)
	intentChanged := now.intent.text != prev.intent.text
	v := verdictSame
	switch {
	case !recorded && !intentChanged:
	case e.writing != nil && now.recorded == e.writing.recorded && now.intent.text == e.writing.intent.text,
		!recorded && now.intent.present() && now.intent.text == e.ourIntent:
		v = verdictOurs
	case !recorded && !now.intent.present() && e.ourIntent != "" && prev.intent.text == e.ourIntent:
		v = verdictWiped
	default:
		v = verdictTheirs
	}
	if recorded {
		e.r, e.rKeys = now.recorded, now.recordedKeys
	}
	if recorded || intentChanged {
		e.i = now.intent // a record ends a round, its intent included
	}
	if e.i.present() && e.i.hash != obj.hash {
		e.outdated = e.i.text
	}
	if e.round != nil && e.round.hash != obj.hash && e.ourIntent != "" {
		e.sawOther = true
	}
	if obj.hash != e.obj.hash || e.changed.IsZero() {
		e.changed = time.Now()
	}
	if r := e.round; r != nil && (v == verdictTheirs || (r.hash != obj.hash && !r.storm) || r.selector != obj.selectsBy()) {
		// A round begun in a storm goes on for its data (storm.go).
		e.ended = true // r.hash and r.selector never change: any goroutine may read them
	}
	obj.stored = now
	e.obj = obj
	if e.written != nil && now.version >= e.written.version {
		e.written = nil // shown() is the view from now on
	}
	return v
}

// letGo drops the round a view ended, and returns it with its intent if
// that may be removed: the round was superseded before its first restart
// (right after its intent's write, while it settled, or while its budget
// allowed none), so none of its pods ran its data, and left behind the
// intent would read as pods mixed and restart every pod (reconcile asks
// onlyItsPods first). A resumed round's intent is an earlier round's,
// which may have restarted some.
func (e *entry) letGo() (r *round, undo intent) {
	r, ours := e.round, e.ourIntent
	e.round, e.ended, e.ourIntent = nil, false, ""
	if r == nil || r.sent.Load() || r.resumed || ours == "" || e.i.text != ours || e.shown().intent.text != ours {
		return r, intent{}
	}
	return r, e.i
}

// shown is R and I as the server has them, as far as the entry knows: the
// latest view applied, or our last write if it is newer.
func (e *entry) shown() stored {
	if e.written != nil && e.written.version > e.obj.stored.version {
		return *e.written
	}
	return e.obj.stored
}

// toCarry returns R, its keys and I as the entry holds them where a
// ConfigMap's annotations lack them (one created again: they are its
// tombstone's), for a worker whose round must wait (the storm gate):
// written there, they tell a successor that never saw the tombstone what
// the pods run, which it would otherwise adopt as a first sight. I alone
// (no round recorded since the object was adopted) says as much: the pods
// are mixed. nil where the server shows them, there is neither R nor I, or
// the state is a Secret's (its state ConfigMap outlives it) or lives in
// memory only.
func (e *entry) toCarry(onServer bool) *stored {
	st := e.shown()
	if !onServer || e.obj.kind != kindConfigMap || (e.r.isZero() && !e.i.present()) || (st.recorded == e.r && st.intent.text == e.i.text) {
		return nil
	}
	return &stored{recorded: e.r, recordedKeys: e.rKeys, intent: e.i}
}

// needsIntent: round r has pods, and its intent is not written (none yet,
// or, on the server, wiped or the object replaced since). onServer: R and
// I are annotations, not memory only.
func (e *entry) needsIntent(r *round, onServer bool) bool {
	return len(r.pods) > 0 && (e.ourIntent == "" || (e.mixedDue(r) && e.ourIntent != mixedIntent.text) || (onServer && e.shown().intent.text != e.ourIntent))
}

// mixedDue: round r, begun in a storm, goes on for its data after a view
// showed other data (sawOther): its replacements may run that data, so
// its intent must read as pods mixed before its next restart. Written
// only with its record, a kill before it would leave an intent for data
// later set back to the round's own, which a successor resumes as if
// every replacement ran it.
func (e *entry) mixedDue(r *round) bool { return e.round == r && r.storm && e.sawOther }

// before: st was on its way before write w, and shows w's past.
func (st stored) before(w stored) bool { return st.version != 0 && st.version < w.version }

// recordsAnew: st holds a record that prev did not, someone's (ours come
// back as events too).
func (st stored) recordsAnew(prev stored) bool {
	return !st.recorded.isZero() && st.recorded != prev.recorded
}

// wrote takes our own write, which leaves st on the server at revision rv
// (0: memory only), as our last write, and clears writing.
func (e *entry) wrote(rv uint64, st stored) {
	e.writing = nil
	if rv == 0 || rv <= e.obj.stored.version || (e.written != nil && rv < e.written.version) {
		return // not kept, or its event already applied: shown() is the view
	}
	st.version, st.known = rv, true
	e.written = &st
}
