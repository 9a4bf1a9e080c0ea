package policy

// entry is what the controller knows of one annotated ConfigMap or Secret.
type entry struct {
	// obj is the latest event's view; its stored R and I may predate our
	// own writes: r and i are what counts.
	obj object
	// r and i are R and I: taken from an event whose annotation differs
	// from the previous event's (someone wrote it), and set by our own
	// writes at once. r outlives a removed annotation and, in a tombstone,
	// the ConfigMap: new data under the same name counts as a change.
	r digest
	i intent
	// written is our last write of R or I: R and I as they were right
	// after it, at the revision the server answered (of the object holding
	// them). Older views show them as they were before it. nil once a view
	// as new as it is applied: most entries never hold one for long.
	written *stored
	// outdated is the text of an intent seen while the data differed from
	// its digest.
	outdated string
	round    *round    // in progress here, for obj.hash
	last     *lastLook // the last round's last look, due later (waves.go)
	exists   bool      // false: a tombstone
	adopted  bool      // r was taken from the first sighting, not from a record
	seen     uint64    // sequence number of the last event about the object
}

// step is what a reconcile does next: a row of the table in doc.go.
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
	case e.round != nil:
		return stepContinue
	case e.i.present() && e.i.hash == e.obj.hash && e.i.text != e.outdated:
		return stepResume
	case e.i.present():
		return stepRound // some pods run I's data, some R's
	case e.r.isZero() || (e.r == e.obj.hash && e.adopted):
		return stepAdopt
	case e.r == e.obj.hash && recordsOnServer && e.shown().recorded != e.r:
		return stepRecord
	case e.r == e.obj.hash:
		return stepNothing
	default:
		return stepRound
	}
}

// apply takes a view of the object and of its stored R and I into the
// entry; the caller has dropped views older than one applied. It holds the
// one rule for our own writes of R and I against anyone else's: shown is R
// and I as the server has them after the later of the views applied and
// our last write (written); a view older than our last write is that
// write's past, and its R and I do not count; a newer one shows what
// others made of them.
func (e *entry) apply(obj object) {
	prev := e.shown()
	if e.obj.uid != obj.uid && obj.kind == kindConfigMap {
		// A new ConfigMap under this name: its annotations start from
		// nothing, but r still tells what the pods run. (A Secret's
		// state ConfigMap outlives a replaced Secret.)
		prev = stored{}
		e.i, e.outdated, e.written = intent{}, "", nil
	}
	now := obj.stored
	if e.written != nil && now.before(*e.written) {
		// On its way before our last write (we may have written twice
		// before the first write's event came back).
		now.recorded, now.intent = prev.recorded, prev.intent
	}
	recorded := now.recordsAnew(prev)
	if recorded {
		e.r = now.recorded
	}
	intentWritten := now.intent.text != prev.intent.text
	if recorded || intentWritten {
		e.i = now.intent // a record ends a round, its intent included
	}
	if e.i.present() && e.i.hash != obj.hash {
		e.outdated = e.i.text
	}
	if r := e.round; r != nil {
		wiped := r.wipedBy(prev, now, recorded)
		if r.endedBy(obj, now, recorded, intentWritten && !wiped) {
			e.round = nil
		} else if wiped {
			r.rewrite = true
		}
	}
	obj.stored = now
	e.obj = obj
	if e.written != nil && now.version >= e.written.version {
		e.written = nil // shown() is the view from now on
	}
}

// shown is R and I as the server has them, as far as the entry knows: the
// latest view applied, or our last write if it is newer.
func (e *entry) shown() stored {
	if e.written != nil && e.written.version > e.obj.stored.version {
		return *e.written
	}
	return e.obj.stored
}

// before: st was on its way before write w, and shows w's past.
func (st stored) before(w stored) bool { return st.version != 0 && st.version < w.version }

// recordsAnew: st holds a record that prev did not, someone's (ours come
// back as events too).
func (st stored) recordsAnew(prev stored) bool {
	return !st.recorded.isZero() && st.recorded != prev.recorded
}

// wipedBy: the round's intent is gone with no record in its place, the
// object replaced whole with the same data (kubectl replace, a GitOps
// tool). The round goes on, and writes I again before its next restart.
func (r *round) wipedBy(prev, now stored, recorded bool) bool {
	return r.intent != "" && prev.intent.text == r.intent && !now.intent.present() && !recorded
}

// endedBy: the round in memory is no longer current after view obj, whose
// R and I are now: someone's record, someone else's intent (othersIntent:
// an intent written that is not a wipe), other data or another selector.
// Every write checks first (current).
func (r *round) endedBy(obj object, now stored, recorded, othersIntent bool) bool {
	return recorded || (othersIntent && !r.wrote(now.intent.text)) || r.hash != obj.hash || r.selector != obj.selector
}

// wrote takes our own write of annotation (R, which removes I, or I), the
// server having answered at revision rv (0: memory only), as our last
// write: R and I as they are right after it.
func (e *entry) wrote(rv uint64, annotation, value string) {
	if rv == 0 || rv <= e.obj.stored.version || (e.written != nil && rv < e.written.version) {
		return // not kept, or its event already applied: shown() is the view
	}
	st := e.shown()
	if annotation == RestartedForAnnotation {
		st.recorded, _ = parseDigest(value)
		st.intent = intent{}
	} else {
		st.intent = parseIntent(value)
	}
	st.version = rv
	e.written = &st
}
