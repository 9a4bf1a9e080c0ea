package policy

// entry is what the controller knows of one annotated ConfigMap.
type entry struct {
	// cm is the latest event's view; its recorded and intent may predate
	// our own writes: r and i are what counts.
	cm configMap
	// r and i are R and I: taken from an event whose annotation differs
	// from the previous event's (someone wrote it), and set by our own
	// writes at once. r outlives a removed annotation and, in a tombstone,
	// the ConfigMap: new data under the same name counts as a change.
	r digest
	i intent
	// written is the resourceVersion of our last write of R or I: older
	// events show them as they were before it.
	written uint64
	// outdated is the text of an intent seen while the data differed from
	// its digest.
	outdated string
	round    *round    // in progress here, for cm.hash
	last     *lastLook // the last round's last look, due later (waves.go)
	exists   bool      // false: a tombstone
	adopted  bool      // r was taken from the first sighting, not from a record
	seen     uint64    // sequence number of the last event about the entry
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
	case e.round != nil:
		return stepContinue
	case e.i.present() && e.i.hash == e.cm.hash && e.i.text != e.outdated:
		return stepResume
	case e.i.present():
		return stepRound // some pods run I's data, some R's
	case e.r.isZero() || (e.r == e.cm.hash && e.adopted):
		return stepAdopt
	case e.r == e.cm.hash && recordsOnServer && e.cm.recorded != e.r:
		return stepRecord
	case e.r == e.cm.hash:
		return stepNothing
	default:
		return stepRound
	}
}

// apply takes an event's view of the ConfigMap into the entry; the caller
// has dropped events older than one applied. It holds the one rule for our
// own writes of R and I against anyone else's: e.cm shows the annotations
// as the server has them after the later of that event and our last write
// (wrote); an event older than our last write is that write's past, and its
// R and I do not count; a newer one shows what others made of them.
func (e *entry) apply(cm configMap) {
	prev := e.cm
	if prev.uid != cm.uid {
		// A new object under this name: its annotations start from
		// nothing, but r still tells what the pods run.
		prev = configMap{}
		e.i, e.outdated, e.written = intent{}, "", 0
	}
	if cm.version != 0 && cm.version < e.written {
		// On its way before our last write (we may have written twice
		// before the first write's event came back).
		cm.recorded, cm.intent = prev.recorded, prev.intent
	}
	recorded := cm.recorded != prev.recorded && !cm.recorded.isZero()
	if recorded {
		e.r = cm.recorded
	}
	intentWritten := cm.intent.text != prev.intent.text
	if recorded || intentWritten {
		e.i = cm.intent // a record ends a round, its intent included
	}
	if e.i.present() && e.i.hash != cm.hash {
		e.outdated = e.i.text
	}
	r := e.round
	// A wipe: our intent gone with no record in its place, the object
	// replaced whole with the same data (kubectl replace, a GitOps tool).
	// The round goes on, and writes I again before its next restart.
	wiped := r != nil && r.intent != "" && prev.intent.text == r.intent && !cm.intent.present() && !recorded
	// The round in memory ends on someone's record, someone else's intent,
	// other data or another selector; every write checks first (current).
	if r != nil && (recorded || (intentWritten && !wiped && !r.wrote(cm.intent.text)) || r.hash != cm.hash || r.selector != cm.selector) {
		e.round = nil
	} else if wiped {
		r.rewrite = true
	}
	e.cm = cm
}

// wrote applies our own write of annotation (R, which removes I, or I) to
// what e.cm shows, the server having answered at revision rv (0: memory
// only), unless an event newer than the write was applied already: that
// one shows the server's state.
func (e *entry) wrote(rv uint64, annotation, value string) {
	if rv == 0 {
		return
	}
	e.written = max(e.written, rv)
	if e.cm.version > rv {
		return
	}
	if annotation == RestartedForAnnotation {
		e.cm.recorded, _ = parseDigest(value)
		e.cm.intent = intent{}
	} else {
		e.cm.intent = parseIntent(value)
	}
}
