package policy

// The observing half: the watches' handlers (scopes), the entries they keep,
// tombstones, the state of Secrets, and the tracking of the initial lists.
// It records what the server shows and queues keys; it never calls the API.
// The acting half (workers.go, round.go and what they call) takes keys from
// the queue and reads the entries under c.mu.

import (
	"context"
	"runtime/debug"
	"slices"

	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/watch"
)

var _ watch.Handler = (*scope)(nil)

// stateSeen is a state ConfigMap's latest view.
type stateSeen struct {
	namespace string
	st        stored
	seen      uint64 // sequence number of its last event
}

// scope is the watch.Handler of one ListWatcher: of ConfigMaps or Secrets,
// in one namespace or all of them (namespace ""). A list only speaks for the
// objects of its scope.
type scope struct {
	c               *Controller
	kind            kind
	namespace       string
	start           uint64 // seq when the current list began
	counted, listed bool   // in c.unsynced until its first list ends
	// cut: a stream of its watch ended and none is open yet (a cut, the
	// relist after a 410): a selector narrowed or an annotation removed
	// meanwhile may be on its way (errNotVouched).
	cut bool
}

var _ watch.Streamer = (*scope)(nil)

// Streaming implements watch.Streamer.
func (s *scope) Streaming(open bool) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.cut = !open
	if open {
		s.c.vouchedAgain()
	}
}

func (s *scope) covers(namespace string) bool { return s.namespace == "" || s.namespace == namespace }

// ForConfigMaps returns the handler for a ListWatcher of the ConfigMaps of
// one namespace, or of all namespaces when namespace is "".
func (c *Controller) ForConfigMaps(namespace string) watch.Handler {
	return c.forScope(kindConfigMap, namespace)
}

// ForSecrets returns the handler for a ListWatcher of the Secrets of one
// namespace, or of all namespaces when namespace is "". Their state lives
// in ConfigMaps (secret.go): the ConfigMaps of the same namespaces must be
// watched too.
func (c *Controller) ForSecrets(namespace string) watch.Handler {
	return c.forScope(kindSecret, namespace)
}

func (c *Controller) forScope(k kind, namespace string) watch.Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.all[k]
	if namespace != "" {
		s = &scope{c: c, kind: k, namespace: namespace}
		c.namespaced[k][namespace] = s
	}
	if !s.counted {
		s.counted = true
		c.unsynced.Add(1)
	}
	return s
}

func (s *scope) BeginList() {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.start = s.c.seq
}

// EndList: objects of the scope that the complete list did not show were
// deleted while we were not watching. Tombstones stay (maxTombstones bounds
// them): a list that does not show the object says it is still gone, and
// its re-creation, after a relist as before one, is compared with R. A
// list of ConfigMaps tells the state of the scope's Secrets.
func (s *scope) EndList() {
	c := s.c
	c.mu.Lock()
	for key, e := range c.entries {
		if e.obj.kind == s.kind && e.seen <= s.start && s.covers(e.obj.namespace) && e.exists {
			c.entomb(key, e, 0) // its deletion not seen as it happened
		}
	}
	first := !s.listed
	s.listed = true
	c.relisted(s)
	if s.kind == kindConfigMap {
		c.statesListed(s)
	} else {
		c.forgetStatesOfUnknownSecrets(s)
	}
	if s.counted && first {
		if c.unsynced.Add(-1) == 0 {
			c.syncedOnce.Do(func() { close(c.synced) })
		}
	}
	c.mu.Unlock()
	c.releaseAfterSync()
}

// releaseAfterSync returns the memory of the initial sync to the OS once
// every scope has listed and the first term's queue has run dry (at once on
// a standby, which queues nothing): the lists and the adoption records grow
// the heap to several times what is kept, and the runtime would return it
// only slowly (BENCHMARKS.md).
func (c *Controller) releaseAfterSync() {
	if c.released.Load() || c.unsynced.Load() > 0 || (c.mayAct() && (!c.queue.active() || !c.queue.idle())) {
		return
	}
	if c.released.CompareAndSwap(false, true) {
		debug.FreeOSMemory()
	}
}

func (s *scope) Handle(ev watch.Event) { s.c.handle(s.kind, ev) }

// handle takes an event of any scope. It only records state and queues
// work.
func (c *Controller) handle(k kind, ev watch.Event) {
	defer c.notify()
	obj, err := parseObject(ev.Object, k, c.cfg.SelectorAnnotation, c.cfg.DigestKey)
	if err != nil {
		c.metrics.SkippedObjects.Inc()
		c.log.Warn("skipping object", "kind", k.String(), "type", string(ev.Type), "rv", ev.ResourceVersion, "err", err)
		return
	}
	switch {
	case c.isState(obj):
		c.observeState(obj, ev.Type == watch.Deleted)
	case ev.Type == watch.Deleted:
		c.forget(obj.key())
	case !obj.optedIn():
		c.drop(obj.key()) // not (or no longer) ours: adopted afresh if it comes back
	case !c.optedIn(obj.namespace):
		c.ignoreNotOptedIn(obj)
		c.metrics.Reconciles.Inc(resultNotOptedIn)
	case c.observe(obj):
		c.queue.Add(obj.key())
	}
}

// observe stores obj and reports whether it may need action.
func (c *Controller) observe(obj object) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := obj.key()
	e := c.entries[key]
	first := e == nil
	if first {
		e = &entry{}
		c.entries[key] = e
	}
	c.seq++
	e.seen = c.seq
	if e.obj.uid == obj.uid && obj.version != 0 && obj.version <= e.obj.version {
		// Replayed by a watch resumed from an earlier resourceVersion.
		c.setExists(e, true)
		return false
	}
	if obj.kind == kindSecret {
		// A Secret's event says nothing of its state: that is the last
		// view of its state ConfigMap (not our write, which no view of
		// it may have caught up with yet), or, new, what that shows.
		obj.stored = e.obj.stored
		if first {
			obj.stored = c.stateOf(obj.key(), obj.namespace)
		}
	}
	reborn := !first && !e.exists && e.obj.uid != obj.uid
	gone := e.obj.hash // the data it had when it was deleted
	seenAt := e.seenAt
	c.takeView(e, obj)
	if reborn && (e.r == e.obj.hash || e.i.hash == e.obj.hash || gone == e.obj.hash) && c.startedWhileGone(e) {
		// Created again with the data its pods were restarted for, that
		// its interrupted round was restarting them for, or that it had
		// when it was deleted (a change seen, its round not begun: a
		// storm's gate), but a pod that started while it was gone read
		// none of it (or waited for it: which, nothing tells): the pods
		// are mixed, beyond what an intent names, since the re-creation,
		// which the round's membership counts from (a pod created after
		// the change was seen is otherwise taken to run it). Other data
		// is a change seen now, before which such a pod was created; so
		// is the same data: every round over these mixed pods counts
		// from here, not only the first (one superseded before its first
		// restart, by a selector refused then fixed, leaves mixedIntent,
		// and the next begins later, when a pod created meanwhile runs
		// the data).
		e.i = mixedIntent
		if e.seenAt == seenAt {
			c.seenNow(e)
		}
	}
	c.setExists(e, true)
	return e.decide(c.recordsOnServer()) != stepNothing
}

// startedWhileGone reports whether a pod that the object of e, created
// again, selects may have started while it was gone, reading none of its
// data. Only the pod index tells when a pod was created (its ADDED event,
// above what it had shown when the deletion was seen); without it, or
// where the deletion was not seen as it happened (a relist's), that is
// not known, and taken for yes: a restart too many, not a pod left on
// other data. c.mu must be held.
func (c *Controller) startedWhileGone(e *entry) bool {
	x := c.indexFor(e.obj.namespace)
	if x == nil || e.goneFloor == 0 {
		return true
	}
	recs, ok := x.View(e.obj.namespace)
	if !ok {
		return true
	}
	sel, err := c.selectionOf(e.obj)
	if err != nil {
		return false // refused at its next change: no round
	}
	for _, rec := range recs {
		p := fromRecord(rec)
		if !sel.selects(&p) {
			continue
		}
		if created, known := x.Created(context.Background(), e.obj.namespace, p.uid, 0); known && created > e.goneFloor {
			return true
		}
	}
	return false
}

// takeView applies a view of the object to its entry, and adopts the data
// if nothing tells which the pods run. c.mu must be held.
func (c *Controller) takeView(e *entry, obj object) {
	changed := e.changed
	verdict := e.apply(obj)
	if !e.changed.Equal(changed) {
		c.seenNow(e)
		if !changed.IsZero() {
			c.noteChange(e, e.changed)
		}
	}
	if verdict == verdictWiped {
		c.log.Info("the round's intent was removed from the object (replaced whole?); the round writes it again before its next restart",
			"namespace", obj.namespace, obj.kind.logKey(), obj.name)
	}
	c.pruneHalted() // apply may have ended a round
	if e.obj.stored.known && e.r.isZero() && !e.i.present() {
		// Nothing tells which data the pods run: adopt it as it is now.
		e.r, e.rKeys, e.adopted = e.obj.hash, e.obj.keys, true
	}
}

// seenNow takes this moment as the one e's change was seen at (entry.seenAt).
// c.mu must be held.
func (c *Controller) seenNow(e *entry) {
	e.seenFloor = c.shownUpTo(e.obj.namespace) // before the moment: no later than it
	e.seenAt = c.moment.Add(1)
	e.mark = c.noteSeen(e.obj.namespace)
}

// stateOf returns a Secret's state as its state ConfigMap shows it: none if
// there is none, unknown until its namespace's ConfigMaps were listed.
// c.mu must be held.
func (c *Controller) stateOf(key, namespace string) stored {
	if s := c.states[key]; s != nil {
		return s.st
	}
	return stored{known: c.scopeOf(kindConfigMap, namespace).listed}
}

// scopeOf returns the scope that watches objects of kind k in namespace.
// c.mu must be held.
func (c *Controller) scopeOf(k kind, namespace string) *scope {
	if s := c.namespaced[k][namespace]; s != nil {
		return s
	}
	return c.all[k]
}

// isState: obj is the state ConfigMap of a Secret, as we write them, if
// Secrets are watched. One of the name that is not ours is no state: it is
// never read, nor written (writeSecretState).
func (c *Controller) isState(obj object) bool {
	return len(c.cfg.DigestKey) > 0 && obj.stateOf != "" && obj.name == stateName(obj.stateOf) && obj.ours
}

// observeState takes a state ConfigMap's view (deleted: it is gone) to its
// Secret's entry: all of it if it is ours, nothing otherwise (stateIsOurs).
// A view not ours, and a deletion while the Secret is ours, are told, on
// the Secret.
func (c *Controller) observeState(obj object, deleted bool) {
	key := keyOf(kindSecret, obj.namespace, obj.stateOf)
	ours := c.stateIsOurs(obj)
	st := fromStateConfigMap(obj, ours)
	st.holder = obj.uid
	c.mu.Lock()
	c.seq++
	if !deleted && c.entries[key] == nil && c.scopeOf(kindSecret, obj.namespace).listed && (!c.awaitsSecrets(obj.namespace) || !c.optedIn(obj.namespace)) {
		// No Secret of ours holds this state: kept, it would only cost
		// memory (anyone who may write ConfigMaps can make one). One
		// whose Secret gains the selector is adopted, as a ConfigMap is.
		// In a namespace that opted in since, its Secrets' relist may
		// come after its ConfigMaps': dropped, the state of a Secret of
		// ours would be refused as not ours (errForeignState). While it
		// is opted out, none is kept: the relist at its opt-in shows it.
		delete(c.states, key)
		c.mu.Unlock()
		return
	}
	if s := c.states[key]; s != nil && !deleted && st.version != 0 && st.version <= s.st.version {
		s.seen = c.seq // replayed by a resumed watch
		c.mu.Unlock()
		return
	}
	if deleted {
		st = stored{known: true} // a wipe: R stays in memory, I is written again
		delete(c.states, key)
	} else {
		c.states[key] = &stateSeen{namespace: obj.namespace, st: st, seen: c.seq}
	}
	if e := c.entries[key]; e != nil {
		e.stateRefused = false // a write refused waits for a view again
	}
	c.takeState(key, st)
	var secret object // the Secret, if it is ours now
	if e := c.entries[key]; e != nil && e.exists {
		secret = e.obj
	}
	c.mu.Unlock()
	c.tellState(obj, secret, ours, deleted)
}

// tellState makes a state ConfigMap's view visible where it needs a person:
// one that was not written by this controller under its key, or the state
// of a Secret still ours deleted. secret is that Secret (zero if none is
// ours).
func (c *Controller) tellState(obj, secret object, ours, deleted bool) {
	log := c.log.With("namespace", obj.namespace, "secret", obj.stateOf, "state_configmap", obj.name)
	held := !obj.stored.recorded.isZero() || obj.stored.intent.present() || !obj.stored.halted.hash.isZero()
	switch {
	case deleted && secret.name != "" && obj.stateOwner != "" && obj.stateOwner != secret.uid:
		// The state of the Secret of this name before it was created
		// again, removed by the garbage collector with its owner.
		log.Info("the state ConfigMap of an earlier Secret of this name was removed")
	case deleted && secret.name != "":
		log.Warn("the state ConfigMap of this Secret was deleted: the controller keeps its record in memory and writes it again at the next round; had it been down, the Secret would have been adopted as it is")
		c.event(secret, events.Warning, "StateRemoved", "The state ConfigMap "+obj.name+" of this Secret was deleted. Its record is kept in memory and written again at the next round.")
	case deleted || ours || !held:
	default:
		c.metrics.StateUntrusted.Inc()
		log.Warn("the state of this Secret was not written by this controller under its digest key (forged, edited, or another key): it is ignored, the Secret's data is adopted as it is now, and its pods are restarted at its next change")
		if secret.name != "" {
			c.event(secret, events.Warning, "StateUntrusted", "The state ConfigMap "+obj.name+" of this Secret was not written by config-watcher under its digest key (forged, or another key): it is ignored. The Secret's data is adopted as it is now; its pods are restarted at its next change.")
		}
	}
}

// takeState applies a Secret's state, as now known, to its entry and queues
// it if it may need action. c.mu must be held.
func (c *Controller) takeState(key string, st stored) {
	e := c.entries[key]
	if e == nil || !e.exists {
		return
	}
	view := e.obj
	view.stored = st
	c.takeView(e, view)
	if e.decide(c.recordsOnServer()) != stepNothing {
		c.queue.Add(key) // lock order: c.mu, then the queue's
	}
}

// statesListed: a complete list of scope s's ConfigMaps tells the state of
// its Secrets: state ConfigMaps it did not show are gone. c.mu must be held.
func (c *Controller) statesListed(s *scope) {
	gone := map[string]bool{}
	for key, st := range c.states {
		if st.seen <= s.start && s.covers(st.namespace) {
			delete(c.states, key)
			gone[key] = true
		}
	}
	var keys []string
	for key, e := range c.entries {
		if e.obj.kind == kindSecret && s.covers(e.obj.namespace) && (!e.obj.stored.known || gone[key]) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys) // the order they are queued in
	for _, key := range keys {
		c.takeState(key, c.stateOf(key, c.entries[key].obj.namespace))
	}
}

// forgetStatesOfUnknownSecrets: once scope s of Secrets has listed, the
// state ConfigMaps kept meanwhile (they may come first) whose Secret it did
// not show as ours are forgotten. c.mu must be held.
func (c *Controller) forgetStatesOfUnknownSecrets(s *scope) {
	for key, st := range c.states {
		if s.covers(st.namespace) && c.entries[key] == nil {
			delete(c.states, key)
		}
	}
}

// drop forgets a ConfigMap that is not ours.
func (c *Controller) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.setExists(e, false)
		delete(c.entries, key)
	}
}

// forget turns a deleted ConfigMap's entry into a tombstone, so that one
// re-created under its name with other data is a change for its pods.
func (c *Controller) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || !e.exists {
		return
	}
	c.entomb(key, e, c.shownUpTo(e.obj.namespace))
}

// entomb makes e, under key, a tombstone whose deletion was seen when the
// pod index had shown goneFloor (0: not known), ends its round, and
// forgets the oldest tombstone beyond maxTombstones. c.mu must be held.
func (c *Controller) entomb(key string, e *entry, goneFloor uint64) {
	c.setExists(e, false)
	e.goneFloor = goneFloor
	if e.ended = e.round != nil; e.ended {
		// The others may have waited on its budget, which holds no
		// more (otherRounds).
		c.wakeRounds(e.obj.namespace, nil)
	}
	e.last = nil
	c.pruneHalted()
	c.seq++
	e.seen = c.seq
	c.tombstones = append(c.tombstones, key)
	for len(c.tombstones) > maxTombstones {
		old := c.tombstones[0]
		c.tombstones = c.tombstones[1:]
		if t := c.entries[old]; t != nil && !t.exists {
			delete(c.entries, old)
		}
	}
}

// maxTombstones bounds the memory of deleted ConfigMaps: a name re-created
// after this many other deletions is adopted, not acted on. (Generated
// names, as kustomize makes them, are never re-created.)
const maxTombstones = 1024

// setExists marks e as existing or deleted and keeps c.annotated. c.mu must
// be held.
func (c *Controller) setExists(e *entry, exists bool) {
	if e.exists == exists {
		return
	}
	e.exists = exists
	ns := e.obj.namespace
	if exists {
		c.annotated[ns]++
	} else {
		c.annotated[ns]--
	}
	n := c.annotated[ns]
	if n == 0 {
		delete(c.annotated, ns)
	}
	if c.cfg.Pods != nil && (n == 0 || (n == 1 && exists)) { // the last lost, or the first gained
		c.cfg.Pods.Annotated(ns, exists)
	}
}
