package policy

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/podindex"
)

// livePod is a pod as a view of the namespace shows it: what a round
// decides on, of its spec only the objects it reads.
type livePod struct {
	podRef
	labels      map[string]string
	owner       ownerRef // its controller; zero uid: none (a bare pod)
	terminating bool
	// finished: phase Failed or Succeeded (an evicted or completed pod).
	// Its owner has replaced it or needs no replacement: it is neither
	// restarted nor counted.
	finished bool
	ready    bool      // its Ready condition is True
	since    time.Time // when Ready last changed (else its creation); zero: unknown, long ago
	// broken names a state in which the pod serves nothing and will not by
	// itself (CrashLoopBackOff, an image that cannot be pulled,
	// unschedulable): it is restarted outside the budget at once.
	broken string
	why    string // why it is not Ready, for the Events
	// refs are the ConfigMaps and Secrets it reads: a referencing round
	// (refs.go) selects by them.
	refs podindex.Refs
	node string // the node it is bound to; "": not scheduled yet
}

// ownerRef is a pod's controller, as its ownerReferences name it.
type ownerRef struct {
	apiVersion, kind, name, uid string
}

// live: the pod runs, or is about to; finished pods are not counted.
func (p *livePod) live() bool { return !p.finished }

// owned: a controller replaces the pod when it is deleted.
func (p *livePod) owned() bool { return p.owner.uid != "" }

// replacedOnItsNode: its controller is a DaemonSet, which replaces it on
// its node, the one node it runs a pod on.
func (p *livePod) replacedOnItsNode() bool {
	return p.owner.apiVersion == "apps/v1" && p.owner.kind == "DaemonSet"
}

// available is Ready for at least minReady, not terminating, as the
// Deployment controller counts availability.
func (p *livePod) available(minReady time.Duration, now time.Time) bool {
	return p.ready && !p.terminating && p.live() && (minReady == 0 || p.since.IsZero() || !now.Before(p.since.Add(minReady)))
}

// notReadyFor is how long the pod has not been Ready (a very long time if
// unknown); zero if it is Ready.
func (p *livePod) notReadyFor(now time.Time) time.Duration {
	switch {
	case p.ready:
		return 0
	case p.since.IsZero():
		return time.Duration(1<<63 - 1)
	}
	return now.Sub(p.since)
}

// brokenAfter: a pod not Ready for this long serves nothing and is
// restarted outside the budget; one not Ready for less (a readiness probe
// failing for a moment, a slow start) is not: restarting it would take a
// pod that is about to serve again.
const brokenAfter = 10 * time.Second

// unserving reports why p, not available, may be restarted outside the
// budget ("" if it may not yet): it is broken, or not Ready for brokenAfter.
func (p *livePod) unserving(now time.Time) string {
	switch {
	case p.broken != "":
		return p.broken
	case p.notReadyFor(now) >= brokenAfter:
		return "not Ready for " + brokenAfter.String()
	}
	return ""
}

// listNamespace lists every pod of namespace: a view in which a round finds
// its pods, those of the other rounds, and each owner's. A pod the view
// does not show is gone. at is the list's revision (0 if no number).
func (c *Controller) listNamespace(ctx context.Context, namespace string) (pods []livePod, at uint64, err error) {
	at, err = c.eachPod(ctx, namespace, url.Values{}, func(p livePod) { pods = append(pods, p) })
	return pods, at, err
}

// listWhole returns the selected pods but the controller's own and its
// siblings (OwnPod), which are neither restarted nor counted. The server
// selects by labels; what the pods reference is read here, as the index
// reads it.
func (c *Controller) listWhole(ctx context.Context, namespace string, sel *selection) ([]livePod, error) {
	var pods []livePod
	_, err := c.eachPod(ctx, namespace, url.Values{"labelSelector": {sel.labels.String()}}, func(p livePod) {
		if !sel.ref.reads(p.refs) {
			return
		}
		if c.cfg.OwnPod.Spares(namespace, p.name, p.uid, p.owner.uid) {
			c.log.Debug("not deleting own pod", "namespace", namespace, "pod", p.name)
			return
		}
		pods = append(pods, p)
	})
	return pods, err
}

// eachPod lists pods with query q, page by page, and calls visit for each;
// at is the list's revision (0 if no number). The pods are whole:
// readiness and owners are in the object, not in its metadata alone.
func (c *Controller) eachPod(ctx context.Context, namespace string, q url.Values, visit func(livePod)) (at uint64, err error) {
	meta, err := apiclient.List(ctx, c.api, apiclient.CorePath(namespace, "pods", ""), q, "application/json", apiclient.ListPageSize, func(raw []byte) {
		if p, ok := readPod(raw); ok {
			visit(p)
		} else {
			c.log.Warn("skipping pod without name or uid", "namespace", namespace)
		}
	})
	switch {
	case apiclient.IsForbidden(err):
		return 0, fmt.Errorf("RBAC: the controller may not list pods in %s (needs verb list on pods): %w", namespace, err)
	case err != nil:
		return 0, fmt.Errorf("pod list of %s: %w", namespace, err)
	}
	at, _ = strconv.ParseUint(meta.ResourceVersion, 10, 64)
	return at, nil
}

// readPod reads one pod of a list; false if it has no name or uid. What it
// returns does not hold raw. The index reads its watch's pods with the same
// parser (podindex.Parse).
func readPod(raw []byte) (livePod, bool) {
	r, ok := podindex.Parse(raw)
	if !ok {
		return livePod{}, false
	}
	return fromRecord(r), true
}

// fromRecord is a pod as a LIST or the index shows it, as rounds decide on
// it.
func fromRecord(r podindex.Record) livePod {
	p := livePod{podRef: podRef{name: r.Name, uid: r.UID, rv: r.ResourceVersion, ownerUID: r.Owner.UID}, labels: r.Labels,
		owner:       ownerRef{apiVersion: r.Owner.APIVersion, kind: r.Owner.Kind, name: r.Owner.Name, uid: r.Owner.UID},
		terminating: r.Terminating, finished: r.Finished, ready: r.Ready, since: r.Since, why: r.Reason, refs: r.Refs, node: r.Node}
	p.version, _ = strconv.ParseUint(r.ResourceVersion, 10, 64)
	if r.Broken {
		p.broken = r.Reason
	}
	return p
}

// reread returns the pod of pod's name as it is now, through a LIST with a
// metadata.name field selector (the verb the sweep needs; no get); found
// is false if there is none.
func (c *Controller) reread(ctx context.Context, namespace, name string) (p livePod, found bool, err error) {
	_, err = c.eachPod(ctx, namespace, url.Values{"fieldSelector": {"metadata.name=" + name}}, func(l livePod) {
		if l.name == name {
			p, found = l, true
		}
	})
	return p, found, err
}
