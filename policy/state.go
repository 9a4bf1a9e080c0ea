package policy

// entry is the controller's memory of one annotated ConfigMap: the state of
// the model in doc.go as last known.
type entry struct {
	// cm is the latest state observed. Its recorded and intent are the
	// annotations as that event showed them, which may predate our own
	// writes; r and i are what counts.
	cm configMap
	// r and i are R and I: taken from an event when its annotation differs
	// from the previous event's (someone wrote it), and set by our own
	// writes at once. An event that was on its way before our write shows
	// the old, unchanged value and cannot undo the write. r outlives a
	// removed annotation and a re-created ConfigMap (a tombstone keeps it),
	// so new data under the same name counts as a change.
	r digest
	i intent
	// written is the resourceVersion of our last write of R or I: an event
	// older than it shows them as they were before, and is not taken.
	written uint64
	// outdated is the text of an intent observed while the data differed
	// from its digest: pods created meanwhile run that other data.
	outdated string
	// round is the round in progress here, for cm.hash; nil when none.
	round  *round
	exists bool // false: a tombstone
	// adopted: r was taken from the first sighting, not from a record.
	adopted bool
	seen    uint64 // sequence number of the last event about the entry
}

// step is what a reconcile does next; see the table in doc.go.
type step int

const (
	stepNothing  step = iota // the pods run the current data
	stepRecord               // they do, but the record is missing
	stepAdopt                // first sight: record the data as what the pods run
	stepContinue             // a round for the current data runs here
	stepResume               // an intent for the current data is left: restart its pods
	stepRound                // restart every selected pod
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
		// Some pods run I's data, some R's: none can be taken to run D.
		return stepRound
	case e.r.isZero():
		return stepAdopt
	case e.r == e.cm.hash:
		switch {
		case e.adopted:
			return stepAdopt
		case recordsOnServer && e.cm.recorded != e.r:
			return stepRecord
		}
		return stepNothing
	default:
		return stepRound
	}
}

// apply takes an event's view of the ConfigMap into the entry. Events older
// than one applied were filtered by the caller.
func (e *entry) apply(cm configMap) {
	prev := e.cm
	if prev.uid != cm.uid {
		// A new object under this name: its annotations start from
		// nothing, but r (from the object it replaces) still tells what
		// the pods run, so different data counts as a change.
		prev = configMap{}
		e.i, e.outdated, e.written = intent{}, "", 0
	}
	if cm.version != 0 && cm.version < e.written {
		// On its way before our last write: its R and I are older than
		// ours. (Comparing with the previous event is not enough when we
		// wrote twice before the first write's event came back.)
		cm.recorded, cm.intent = prev.recorded, prev.intent
	}
	// A record written ends a round, its intent included.
	recorded := cm.recorded != prev.recorded && !cm.recorded.isZero()
	if recorded {
		e.r = cm.recorded
	}
	intentWritten := cm.intent.text != prev.intent.text
	if recorded || intentWritten {
		e.i = cm.intent
	}
	if e.i.present() && e.i.hash != cm.hash {
		e.outdated = e.i.text
	}
	if r := e.round; r != nil && (recorded || (intentWritten && !r.wrote(cm.intent.text)) || r.hash != cm.hash || r.selector != cm.selector) {
		// Someone's record, someone else's intent, other data or another
		// selector: the round is not the current one any more.
		e.round = nil
	}
	e.cm = cm
}
