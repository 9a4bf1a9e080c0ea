package policy

import (
	"time"
)

// SETTLE: changes that arrive together (a Helm upgrade or a GitOps sync
// that changes an app's three ConfigMaps) restart each pod once. A round's
// first restart waits until no annotated object of its namespace that
// selects any of its pods has changed for Settle. Meanwhile the rounds of
// the others begin too: each takes its pods, writes its own intent and
// sends its membership bound, and waits as well. Then a pod one round
// restarts is done with for the others (they see it terminating: choose
// and refresh), and its replacement, created after every one of those
// changes was seen, is not taken by any (the bound and the cutoff,
// sweep.go). Each object keeps its own R and I: killed at any point, each
// is in a state of the table, and a resumed intent names only pods that
// existed when its round began.

// settleWait returns how long round r, which began from view and has sent
// no restart, must wait before its first: until Settle after the latest
// change of an object of its namespace that selects one of its pods (its
// own included). 0: it may restart now.
func (c *Controller) settleWait(obj object, r *round, view []livePod, now time.Time) time.Duration {
	if c.cfg.Settle <= 0 || r.sent.Load() || r.resumed {
		return 0
	}
	type other struct {
		obj     object
		changed time.Time
	}
	var recent []other
	c.mu.Lock()
	for _, e := range c.entries {
		if e.exists && e.obj.namespace == obj.namespace && now.Sub(e.changed) < c.cfg.Settle {
			recent = append(recent, other{e.obj, e.changed})
		}
	}
	c.mu.Unlock()
	var ours []*livePod // r's pods
	for i := range view {
		if p := &view[i]; !p.terminating && p.live() && r.sel.selects(p) {
			ours = append(ours, p)
		}
	}
	var latest time.Time
	for _, o := range recent {
		if o.changed.Before(latest) {
			continue
		}
		var sel *selection
		if o.obj.key() == r.key {
			sel = r.sel
		} else if s, err := c.selectionOf(o.obj); err == nil {
			sel = s
		} else {
			continue // refused: it restarts nothing
		}
		for _, p := range ours {
			if sel.selects(p) {
				latest = o.changed
				break
			}
		}
	}
	if latest.IsZero() {
		return 0
	}
	return max(latest.Add(c.cfg.Settle).Sub(now), 0)
}
