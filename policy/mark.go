package policy

import (
	"context"
	"slices"
	"strconv"
	"time"
)

// A change seen while a round of the same namespace is in flight may be
// acted on later than it was seen: its worker is busy (the same object's
// round, its restarts in flight), or waits (SETTLE). Meanwhile that round's
// replacements are created, after the change was seen, and run its data.
// So may a change seen while every worker is taken (another namespace's
// round, a record's write): pods created before a worker is free (an
// earlier round's replacements, a scale-up) run its data too.
// To tell them apart the moment it was seen is placed among pod revisions
// by a consistent pod LIST with limit=1 sent right after it (a mark): every
// pod created before the moment has a lower revision. Pod revisions and a
// ConfigMap's are never compared; the index's own revision at that moment
// would not do either, for its watch may be milliseconds behind, and a pod
// created just before the change would then be left on the old data. No
// round in flight and a worker free, no mark: the round begins at once and
// its own bound decides, with no LIST more than before; unless it is
// refused, and begins only once the object is fixed (markRefused).

// seenMark is the revision of a pod LIST sent after a change was seen; rv
// is set (0: the LIST failed, or its revision is not a number) before done
// is closed.
type seenMark struct {
	done chan struct{}
	rv   uint64
}

// resolved returns the mark's revision if its LIST has answered.
func (m *seenMark) resolved() (uint64, bool) {
	if m == nil {
		return 0, false
	}
	select {
	case <-m.done:
		return m.rv, m.rv != 0
	default:
		return 0, false
	}
}

// wait returns the mark's revision, waiting up to wait for its LIST.
func (m *seenMark) wait(ctx context.Context, wait time.Duration) (uint64, bool) {
	if m == nil {
		return 0, false
	}
	if rv, ok := m.resolved(); ok || wait <= 0 {
		return rv, ok
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-m.done:
		return m.rv, m.rv != 0
	case <-t.C:
	case <-ctx.Done():
	}
	return 0, false
}

// marker holds the marks of one namespace noted before its sender takes
// them: one LIST for them all. A LIST in flight holds no later mark back
// (a mark sent only once it answered, on a slow server, would come after
// the pods created meanwhile, which run the change: they would be
// restarted), so each sender takes its marks and leaves the next ones to
// a sender of their own.
type marker struct {
	waiting []*seenMark
}

// noteSeen returns a mark for a change of namespace seen now, and sends
// its LIST, if a round of the namespace is in progress, a replacement is
// due, or no worker is free to begin its round (else it begins at once,
// or markRefused marks it); else nil. c.mu must be held: it never blocks.
func (c *Controller) noteSeen(namespace string) *seenMark {
	if !c.roundIn(namespace) && c.queue.busy() < c.cfg.Workers && !c.replacementsDue(namespace) {
		return nil
	}
	return c.sendMark(namespace)
}

// replacementsDue: a round of namespace sent a restart less than leftAfter
// ago (its owner replaces a pod within seconds), though none may be in
// progress now (one that restarted every pod at once ends before their
// replacements exist): a replacement created after a change seen now runs
// its data, and no DELETE sent after it tells so. c.mu must be held.
func (c *Controller) replacementsDue(namespace string) bool {
	b := c.budgets[namespace]
	return b != nil && time.Since(time.Unix(0, b.lastRestart.Load())) < leftAfter
}

// markRefused marks the change pending on key, seen at seenAt, if it has
// no mark: its round is refused (the selector or annotation is invalid),
// and begins only once the object is fixed, however late, while pods are
// created meanwhile (another round's replacements) that run its data. A
// mark sent now, not when the change was seen, is later than that moment:
// a pod created in between counts as older, a restart too many, never a
// pod left on other data. Once per change: a refusal again sends none.
func (c *Controller) markRefused(key string, seenAt uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil && seenAt != 0 && e.seenAt == seenAt && e.mark == nil {
		e.mark = c.sendMark(e.obj.namespace)
	}
}

// sendMark returns a mark for namespace and sends its LIST, if this
// replica acts and watches the namespace's pods; else nil. c.mu must be
// held: it never blocks.
func (c *Controller) sendMark(namespace string) *seenMark {
	ctx := c.acting
	if ctx == nil || c.indexFor(namespace) == nil {
		return nil
	}
	m := &seenMark{done: make(chan struct{})}
	mk := c.markers[namespace]
	if mk == nil {
		mk = &marker{}
		c.markers[namespace] = mk
		go c.sendMarks(ctx, namespace, mk)
	}
	mk.waiting = append(mk.waiting, m)
	return m
}

// shownUpTo returns the revision the pod index of namespace has shown
// everything up to (0: no index). c.mu may be held: the index calls out of
// its lock only.
func (c *Controller) shownUpTo(namespace string) uint64 {
	if x := c.indexFor(namespace); x != nil {
		return x.ShownUpTo()
	}
	return 0
}

// seenCutoff returns the lowest pod revision known to follow the moment
// round r's change was seen (math.MaxUint64: none): the answers of the
// DELETEs sent after it, and its mark. With wait, it waits that long for
// those still in flight, for a lower one; without, it says what is known.
func (c *Controller) seenCutoff(ctx context.Context, namespace string, r *round, wait time.Duration) uint64 {
	low := c.budgetOf(namespace).cutoffAfter(ctx, r.seenAt, wait)
	if rv, ok := r.mark.wait(ctx, wait); ok {
		low = min(low, rv)
	}
	return low
}

// roundIn: a round of namespace is in progress. c.mu must be held. It is
// asked for every object a list shows, so it looks only at the rounds the
// namespace began (a scan of every entry made a start over n objects take
// n² steps), and drops those over: inProgress stays the one judge, and
// nothing else must remember to.
func (c *Controller) roundIn(namespace string) bool {
	rs := slices.DeleteFunc(c.begun[namespace], func(r *round) bool { return !c.inProgress(r) })
	if len(rs) == 0 {
		delete(c.begun, namespace)
		return false
	}
	c.begun[namespace] = rs
	return true
}

// begin notes round r begun in namespace, so that roundIn finds it; the
// rounds over are dropped first, which bounds the list by those in
// progress. c.mu must be held.
func (c *Controller) begin(namespace string, r *round) {
	c.roundIn(namespace)
	c.begun[namespace] = append(c.begun[namespace], r)
}

// sendMarks sends one LIST for the marks waiting when it takes them.
func (c *Controller) sendMarks(ctx context.Context, namespace string, mk *marker) {
	c.mu.Lock()
	batch := mk.waiting
	if c.markers[namespace] == mk {
		delete(c.markers, namespace)
	}
	c.mu.Unlock()
	var rv uint64
	if text, err := c.listRevision(ctx, namespace); err == nil {
		rv, _ = strconv.ParseUint(text, 10, 64)
	}
	for _, m := range batch {
		m.rv = rv
		close(m.done)
	}
}
