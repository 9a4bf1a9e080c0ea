package sim

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Pods and their owners: a ReplicaSet keeps its replicas (scaled down in
// its controller's order: not Ready first, then newest), a DaemonSet one
// pod per node up, a bare pod stays gone. Replacements appear and become
// Ready after delays the seed draws; a pod that reads bad data crash-loops.

var apiVersionOf = map[string]string{"ReplicaSet": "apps/v1", "DaemonSet": "apps/v1"}

// podObject is the pod as the API shows it.
func (w *world) podObject(p *pod) object {
	labels := map[string]any{}
	for k, v := range p.labels {
		labels[k] = v
	}
	m := map[string]any{"name": p.name, "namespace": p.ns, "uid": p.uid, "labels": labels,
		"creationTimestamp": w.start.Add(p.created).UTC().Format(time.RFC3339)}
	if p.wl.kind != "" {
		m["ownerReferences"] = []any{map[string]any{"apiVersion": apiVersionOf[p.wl.kind], "kind": p.wl.kind, "name": p.wl.name, "uid": p.wl.uid, "controller": true}}
	}
	var env, envFrom, initEnvFrom, volumes []any
	for _, r := range p.refs {
		refKey, nameKey := "configMapRef", "name"
		if r.kind == "secrets" {
			refKey = "secretRef"
		}
		switch r.how {
		case "envFrom":
			envFrom = append(envFrom, map[string]any{refKey: map[string]any{"name": r.name, "optional": r.opt}})
		case "init":
			initEnvFrom = append(initEnvFrom, map[string]any{refKey: map[string]any{"name": r.name}})
		case "key":
			kr := "configMapKeyRef"
			if r.kind == "secrets" {
				kr = "secretKeyRef"
			}
			env = append(env, map[string]any{"name": "V_" + r.key, "valueFrom": map[string]any{kr: map[string]any{"name": r.name, "key": r.key, "optional": r.opt}}})
		case "volume":
			src := "configMap"
			if r.kind == "secrets" {
				src, nameKey = "secret", "secretName"
			}
			volumes = append(volumes, map[string]any{"name": "v-" + r.name, src: map[string]any{nameKey: r.name, "optional": r.opt}})
		case "projected":
			src := "configMap"
			if r.kind == "secrets" {
				src = "secret"
			}
			volumes = append(volumes, map[string]any{"name": "p-" + r.name, "projected": map[string]any{"sources": []any{map[string]any{src: map[string]any{"name": r.name}}}}})
		}
	}
	container := map[string]any{"name": "app", "image": "app", "env": env, "envFrom": envFrom}
	spec := map[string]any{"containers": []any{container}, "volumes": volumes}
	if p.wl.kind == "DaemonSet" {
		// Bound at creation (a ReplicaSet's pods' nodes are not modelled).
		spec["nodeName"] = fmt.Sprintf("node-%d", p.node)
	}
	if initEnvFrom != nil {
		spec["initContainers"] = []any{map[string]any{"name": "init", "image": "init", "envFrom": initEnvFrom}}
	}
	readyStatus, since := "False", p.created
	if p.ready {
		readyStatus, since = "True", p.readySince
	}
	st := map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": readyStatus,
		"lastTransitionTime": w.start.Add(since).UTC().Format(time.RFC3339)}}}
	cs := map[string]any{"name": "app", "ready": p.ready, "state": map[string]any{"running": map[string]any{}}}
	if p.bad {
		cs["state"] = map[string]any{"waiting": map[string]any{"reason": "CrashLoopBackOff"}}
		cs["lastState"] = map[string]any{"terminated": map[string]any{"reason": "Error"}}
	}
	st["containerStatuses"] = []any{cs}
	return object{"kind": "Pod", "apiVersion": "v1", "metadata": m, "spec": spec, "status": st}
}

func (w *world) storePod(p *pod) {
	w.api.put(key{"pods", p.ns, p.name}, w.podObject(p))
}

// newPod creates a pod of wl now, reading the data of this moment.
func (w *world) newPod(wl *workload, node int) *pod {
	wl.serial++
	w.uids++
	p := &pod{wl: wl, ns: wl.ns, uid: fmt.Sprintf("pod-%d", w.uids), labels: maps.Clone(wl.labels), refs: wl.refs,
		node: node, started: map[string]map[string]string{}, created: w.now(), alive: true}
	p.name = fmt.Sprintf("%s-%d", wl.name, wl.serial)
	if wl.kind == "DaemonSet" {
		p.name = fmt.Sprintf("%s-n%d-%d", wl.name, node, wl.serial)
		p.returned = wl.returning[node]
		delete(wl.returning, node)
	}
	for k := range w.api.objects {
		if (k.res == "configmaps" || k.res == "secrets") && k.ns == wl.ns {
			p.started[k.res+"/"+k.name] = w.dataOf(k.res, k.ns, k.name)
		}
	}
	p.bad = w.readsBad(p)
	wl.pods = append(wl.pods, p)
	w.storePod(p)
	w.logf("world: pod %s/%s created (%s)%s", p.ns, p.name, p.uid, map[bool]string{true: " on bad data: crash-looping"}[p.bad])
	if !p.bad {
		w.after(w.readyDelay(), "ready "+p.name, func() { w.setReady(p, true) })
	}
	return p
}

// readsBad reports whether p started with bad data from an object that
// selects it (what it reads of it): only then is the controller the one to
// bring it back, once the data is fixed. (A pod crash-looping on data no
// object selects it for would hold every round's budget for good, with no
// promise to check.)
func (w *world) readsBad(p *pod) bool {
	for _, a := range w.annotatedObjects(p.ns) {
		if w.selects(a, p) && hasBad(view(a, p, p.started[a.kind+"/"+a.name])) {
			return true
		}
	}
	return false
}

func (w *world) readyDelay() time.Duration { return w.between(300*time.Millisecond, 4*time.Second) }

func (w *world) setReady(p *pod, ready bool) {
	if !p.alive || p.ready == ready || (ready && p.bad) {
		return
	}
	if !ready {
		p.dropped, p.availAtDrop = w.now(), w.available(p)
	}
	p.ready = ready
	if ready {
		p.readySince = w.now()
	}
	w.storePod(p)
	w.logf("world: pod %s/%s Ready=%v", p.ns, p.name, ready)
}

// podRemoved is told of every pod the server removed, by anyone.
func (w *world) podRemoved(k key) {
	for _, wl := range w.wls {
		for _, p := range wl.pods {
			if p.alive && p.ns == k.ns && p.name == k.name {
				p.dropped, p.availAtDrop = w.now(), p.alive && w.available(p)
				p.alive = false
				w.reconcile(wl)
				return
			}
		}
	}
}

// deletePod deletes p as someone other than the controller does.
func (w *world) deletePod(p *pod, why string) {
	if !p.alive {
		return
	}
	w.logf("world: pod %s/%s deleted (%s)", p.ns, p.name, why)
	w.api.remove(key{"pods", p.ns, p.name})
}

// reconcile is the owner's controller: it schedules the replacements wl
// lacks and deletes what it has too many of.
func (w *world) reconcile(wl *workload) {
	switch wl.kind {
	case "ReplicaSet":
		live := wl.live()
		for n := len(live) + wl.creating; n < wl.replicas; n++ {
			wl.creating++
			w.after(w.createDelay(wl), "create "+wl.name, func() {
				wl.creating--
				if len(wl.live()) < wl.replicas {
					w.newPod(wl, 0)
				}
			})
		}
		if extra := len(live) - wl.replicas; extra > 0 {
			// The ReplicaSet controller's order: not Ready first, then newest.
			slices.SortStableFunc(live, func(a, b *pod) int {
				switch {
				case a.ready != b.ready && !a.ready:
					return -1
				case a.ready != b.ready:
					return 1
				}
				return int(b.created - a.created)
			})
			for _, p := range live[:extra] {
				w.deletePod(p, "scaled down")
			}
		}
	case "DaemonSet":
		for node, up := range wl.nodes {
			if !up {
				continue
			}
			if !slices.ContainsFunc(wl.pods, func(p *pod) bool { return p.alive && p.node == node }) {
				w.after(w.createDelay(wl), "create "+wl.name, func() {
					if wl.nodes[node] && !slices.ContainsFunc(wl.pods, func(p *pod) bool { return p.alive && p.node == node }) {
						w.newPod(wl, node)
					}
				})
			}
		}
	}
}

// createDelay is how long wl's owner's controller takes to create a pod it
// lacks. A real one, idle, does within milliseconds of the deletion it
// watched: the pod index may then show the replacement before the
// deleting request's answer is back, and before a mark sent earlier
// answers. A busy one (its queue long, its API calls throttled) takes up
// to seconds. Which one a workload has is drawn per workload (fastOwner).
func (w *world) createDelay(wl *workload) time.Duration {
	if wl.fast {
		return w.between(5*time.Millisecond, 100*time.Millisecond)
	}
	return w.between(100*time.Millisecond, 1500*time.Millisecond)
}

// fastOwner draws whether wl's owner's controller is fast (createDelay),
// by hash of the seed and its name, not from the world's generator: the
// other draws of a seed stay what they were.
func (w *world) fastOwner(wl *workload) bool {
	return w.hashed(fmt.Sprintf("fast/%s/%s", wl.ns, wl.name)).IntN(2) == 0
}

// scale sets a ReplicaSet's replicas, as kubectl scale does.
func (w *world) scale(wl *workload, n int) {
	w.logf("world: %s/%s scaled %d -> %d", wl.ns, wl.name, wl.replicas, n)
	wl.scaled = append(wl.scaled, scaleChange{at: w.now(), from: wl.replicas})
	wl.replicas = n
	w.reconcile(wl)
}

// relabel changes a pod's labels, as kubectl label does (its owner keeps
// it: the simulation's ReplicaSets do not release pods).
func (w *world) relabel(p *pod, k, v string) {
	if v == "" {
		delete(p.labels, k)
	} else {
		p.labels[k] = v
	}
	w.selChanged[p.ns] = w.now()
	w.storePod(p)
	w.logf("world: pod %s/%s labels now %v", p.ns, p.name, p.labels)
}
