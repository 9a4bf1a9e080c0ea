package policy

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// listedPod is a pod as a LIST shows it: what a round decides on, nothing
// of its spec.
type listedPod struct {
	podRef
	labels      map[string]string
	terminating bool
	ready       bool   // its Ready condition is True
	owned       bool   // a controller owns it: something replaces it
	why         string // why it is not Ready, for the Events
}

// listWhole returns the selected pods but the controller's own, which is
// neither restarted nor counted.
func (c *Controller) listWhole(ctx context.Context, namespace string, sel *selector.Selector) ([]listedPod, error) {
	var pods []listedPod
	err := c.eachPod(ctx, namespace, url.Values{"labelSelector": {sel.String()}}, func(p listedPod) {
		if p.name == c.cfg.OwnPod {
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
func (c *Controller) eachPod(ctx context.Context, namespace string, q url.Values, visit func(listedPod)) error {
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
func readPod(raw []byte) (listedPod, bool) {
	item := gjson.ParseBytes(raw)
	meta := item.Get("metadata")
	p := listedPod{podRef: podRef{name: strings.Clone(meta.Get("name").String()), uid: strings.Clone(meta.Get("uid").String()), rv: strings.Clone(meta.Get("resourceVersion").String())},
		terminating: meta.Get("deletionTimestamp").Exists(),
		ready:       item.Get(`status.conditions.#(type=="Ready").status`).String() == "True",
		owned:       meta.Get(`ownerReferences.#(controller==true)`).Exists(),
	}
	if p.name == "" || p.uid == "" {
		return listedPod{}, false
	}
	p.version, _ = strconv.ParseUint(p.rv, 10, 64)
	if !p.ready {
		p.why = strings.Clone(notReady(item.Get("status")))
	}
	p.labels = map[string]string{}
	meta.Get("labels").ForEach(func(k, v gjson.Result) bool {
		p.labels[strings.Clone(k.String())] = strings.Clone(v.String())
		return true
	})
	return p, true
}

// notReady says why a pod is not Ready, from its status: a container's
// waiting or terminated reason ("CrashLoopBackOff in container app"), else
// why it is not scheduled, else its phase.
func notReady(status gjson.Result) string {
	for _, list := range []string{"initContainerStatuses", "containerStatuses"} {
		why := ""
		status.Get(list).ForEach(func(_, cs gjson.Result) bool {
			if cs.Get("ready").Bool() {
				return true
			}
			name := truncate(cs.Get("name").String(), 63)
			for _, state := range []string{"state.waiting.reason", "state.terminated.reason", "lastState.terminated.reason"} {
				if reason := cs.Get(state).String(); reason != "" {
					why = truncate(reason, 128) + " in container " + name
					return false
				}
			}
			why = "container " + name + " not ready"
			return false
		})
		if why != "" {
			return why
		}
	}
	if scheduled := status.Get(`conditions.#(type=="PodScheduled")`); scheduled.Get("status").String() == "False" {
		return "not scheduled: " + truncate(scheduled.Get("reason").String(), 128)
	}
	if phase := status.Get("phase").String(); phase != "" {
		return "phase " + truncate(phase, 32)
	}
	return "no Ready condition"
}

// reread returns the pod of pod's name as it is now, through a LIST with a
// metadata.name field selector (the verb the sweep needs; no get); found
// is false if there is none.
func (c *Controller) reread(ctx context.Context, namespace, name string) (p listedPod, found bool, err error) {
	err = c.eachPod(ctx, namespace, url.Values{"fieldSelector": {"metadata.name=" + name}}, func(l listedPod) {
		if l.name == name {
			p, found = l, true
		}
	})
	return p, found, err
}
