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
	// written is the resourceVersion of our last write of R or I (of the
	// object holding them): older events show them as they were before it.
	written uint64
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
	case e.r == e.obj.hash && recordsOnServer && e.obj.stored.recorded != e.r:
		return stepRecord
	case e.r == e.obj.hash:
		return stepNothing
	default:
		return stepRound
	}
}

// apply takes a view of the object and of its stored R and I into the
// entry; the caller has dropped views older than one applied. It holds the
// one rule for our own writes of R and I against anyone else's: e.obj shows
// them as the server has them after the later of that view and our last
// write (wrote); a view older than our last write is that write's past, and
// its R and I do not count; a newer one shows what others made of them.
func (e *entry) apply(obj object) {
	prev := e.obj.stored
	if e.obj.uid != obj.uid && obj.kind == kindConfigMap {
		// A new ConfigMap under this name: its annotations start from
		// nothing, but r still tells what the pods run. (A Secret's
		// state ConfigMap outlives a replaced Secret.)
		prev = stored{}
		e.i, e.outdated, e.written = intent{}, "", 0
	}
	now := obj.stored
	if now.version != 0 && now.version < e.written {
		// On its way before our last write (we may have written twice
		// before the first write's event came back).
		now.recorded, now.intent = prev.recorded, prev.intent
		obj.stored = now
	}
	recorded := now.recorded != prev.recorded && !now.recorded.isZero()
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
	r := e.round
	// A wipe: our intent gone with no record in its place, the object
	// replaced whole with the same data (kubectl replace, a GitOps tool).
	// The round goes on, and writes I again before its next restart.
	wiped := r != nil && r.intent != "" && prev.intent.text == r.intent && !now.intent.present() && !recorded
	// The round in memory ends on someone's record, someone else's intent,
	// other data or another selector; every write checks first (current).
	if r != nil && (recorded || (intentWritten && !wiped && !r.wrote(now.intent.text)) || r.hash != obj.hash || r.selector != obj.selector) {
		e.round = nil
	} else if wiped {
		r.rewrite = true
	}
	e.obj = obj
}

// wrote applies our own write of annotation (R, which removes I, or I) to
// what e.obj shows, the server having answered at revision rv (0: memory
// only), unless an event newer than the write was applied already: that
// one shows the server's state.
func (e *entry) wrote(rv uint64, annotation, value string) {
	if rv == 0 {
		return
	}
	e.written = max(e.written, rv)
	if e.obj.stored.version > rv {
		return
	}
	if annotation == RestartedForAnnotation {
		e.obj.stored.recorded, _ = parseDigest(value)
		e.obj.stored.intent = intent{}
	} else {
		e.obj.stored.intent = parseIntent(value)
	}
}
