package policy

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// livePod is a pod as a view of the namespace shows it: what a round
// decides on, nothing of its spec.
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
}

// ownerRef is a pod's controller, as its ownerReferences name it.
type ownerRef struct {
	apiVersion, kind, name, uid string
}

// live: the pod runs, or is about to; finished pods are not counted.
func (p *livePod) live() bool { return !p.finished }

// owned: a controller replaces the pod when it is deleted.
func (p *livePod) owned() bool { return p.owner.uid != "" }

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
// does not show is gone.
func (c *Controller) listNamespace(ctx context.Context, namespace string) ([]livePod, error) {
	var pods []livePod
	err := c.eachPod(ctx, namespace, url.Values{}, func(p livePod) { pods = append(pods, p) })
	return pods, err
}

// listWhole returns the selected pods but the controller's own and its
// siblings (OwnPod), which are neither restarted nor counted.
func (c *Controller) listWhole(ctx context.Context, namespace string, sel *selector.Selector) ([]livePod, error) {
	var pods []livePod
	err := c.eachPod(ctx, namespace, url.Values{"labelSelector": {sel.String()}}, func(p livePod) {
		if c.cfg.OwnPod.Spares(namespace, p.name, p.uid, p.owner.uid) {
			c.log.Debug("not deleting own pod", "namespace", namespace, "pod", p.name)
			return
		}
		pods = append(pods, p)
	})
	return pods, err
}

// podPage is the page size of pod lists. Pages are read item by item:
// memory follows the largest pod, not the page.
const podPage = "250"

// eachPod lists pods with query q, page by page, and calls visit for each.
// The pods are whole: readiness and owners are in the object, not in its
// metadata alone.
func (c *Controller) eachPod(ctx context.Context, namespace string, q url.Values, visit func(livePod)) error {
	q.Set("limit", podPage)
	path := apiclient.CorePath(namespace, "pods", "")
	for {
		body, err := c.api.GetBody(ctx, path, q, "application/json")
		if err != nil {
			if apiclient.IsForbidden(err) {
				return fmt.Errorf("RBAC: the controller may not list pods in %s (needs verb list on pods): %w", namespace, err)
			}
			return err
		}
		meta, err := watch.ReadPage(body, func(raw []byte) {
			if p, ok := readPod(raw); ok {
				visit(p)
			} else {
				c.log.Warn("skipping pod without name or uid", "namespace", namespace)
			}
		})
		body.Close()
		if err != nil {
			return fmt.Errorf("pod list of %s: %w", namespace, err)
		}
		if meta.Continue == "" {
			return nil
		}
		q.Set("continue", meta.Continue)
	}
}

// readPod reads one pod of a list; false if it has no name or uid. What it
// returns does not hold raw.
func readPod(raw []byte) (livePod, bool) {
	item := gjson.ParseBytes(raw)
	meta, status := item.Get("metadata"), item.Get("status")
	p := livePod{podRef: podRef{name: strings.Clone(meta.Get("name").String()), uid: strings.Clone(meta.Get("uid").String()), rv: strings.Clone(meta.Get("resourceVersion").String())},
		terminating: meta.Get("deletionTimestamp").Exists(),
	}
	if p.name == "" || p.uid == "" {
		return livePod{}, false
	}
	p.version, _ = strconv.ParseUint(p.rv, 10, 64)
	if o := meta.Get(`ownerReferences.#(controller==true)`); o.Exists() {
		p.owner = ownerRef{apiVersion: strings.Clone(o.Get("apiVersion").String()), kind: strings.Clone(o.Get("kind").String()),
			name: strings.Clone(o.Get("name").String()), uid: strings.Clone(o.Get("uid").String())}
	}
	switch status.Get("phase").String() {
	case "Failed", "Succeeded":
		p.finished = true
	}
	ready := status.Get(`conditions.#(type=="Ready")`)
	p.ready = ready.Get("status").String() == "True"
	since := meta.Get("creationTimestamp")
	if ready.Exists() {
		since = ready.Get("lastTransitionTime")
	}
	p.since, _ = time.Parse(time.RFC3339, since.String())
	if !p.ready {
		p.broken, p.why = brokenState(status)
		p.broken, p.why = strings.Clone(p.broken), strings.Clone(p.why)
	}
	p.labels = map[string]string{}
	meta.Get("labels").ForEach(func(k, v gjson.Result) bool {
		p.labels[strings.Clone(k.String())] = strings.Clone(v.String())
		return true
	})
	return p, true
}

// brokenReasons are the container waiting reasons of a pod that will not
// serve by itself.
var brokenReasons = map[string]bool{
	"CrashLoopBackOff": true, "ImagePullBackOff": true, "ErrImagePull": true, "CreateContainerConfigError": true,
}

// brokenState says, from a pod's status, whether it is broken (see
// livePod.broken) and why it is not Ready: a container's waiting or
// terminated reason ("CrashLoopBackOff in container app"), else why it is
// not scheduled, else its phase.
func brokenState(status gjson.Result) (broken, why string) {
	for _, list := range []string{"initContainerStatuses", "containerStatuses"} {
		status.Get(list).ForEach(func(_, cs gjson.Result) bool {
			if cs.Get("ready").Bool() {
				return true
			}
			name := truncate(cs.Get("name").String(), 63)
			waiting := cs.Get("state.waiting.reason").String()
			for _, reason := range []string{waiting, cs.Get("state.terminated.reason").String(), cs.Get("lastState.terminated.reason").String()} {
				if reason != "" {
					why = truncate(reason, 128) + " in container " + name
					break
				}
			}
			if why == "" {
				why = "container " + name + " not ready"
			}
			if brokenReasons[waiting] {
				broken = why
			}
			return false
		})
		if why != "" {
			return broken, why
		}
	}
	if scheduled := status.Get(`conditions.#(type=="PodScheduled")`); scheduled.Get("status").String() == "False" {
		why = "not scheduled: " + truncate(scheduled.Get("reason").String(), 128)
		if scheduled.Get("reason").String() == "Unschedulable" {
			broken = why
		}
		return broken, why
	}
	if phase := status.Get("phase").String(); phase != "" {
		return "", "phase " + truncate(phase, 32)
	}
	return "", "no Ready condition"
}

// reread returns the pod of pod's name as it is now, through a LIST with a
// metadata.name field selector (the verb the sweep needs; no get); found
// is false if there is none.
func (c *Controller) reread(ctx context.Context, namespace, name string) (p livePod, found bool, err error) {
	err = c.eachPod(ctx, namespace, url.Values{"fieldSelector": {"metadata.name=" + name}}, func(l livePod) {
		if l.name == name {
			p, found = l, true
		}
	})
	return p, found, err
}
