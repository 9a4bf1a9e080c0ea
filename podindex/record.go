package podindex

import (
	"strings"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/internal/truncate"
)

// Record is what a view of the pods keeps of one: what a round of restarts
// decides on, of the spec only the objects it reads. The index keeps one per pod, and a LIST
// is read into the same (Parse), so that a round decides alike with or
// without the index.
type Record struct {
	Name, UID, ResourceVersion string
	// Labels are shared with the index: never written to.
	Labels map[string]string
	Owner  Owner // its controller; an empty UID: none (a bare pod)
	// Terminating: it has a deletionTimestamp.
	Terminating bool
	// Finished: phase Failed or Succeeded (an evicted or completed pod). Its
	// owner has replaced it or needs no replacement.
	Finished bool
	Ready    bool      // its Ready condition is True
	Since    time.Time // when Ready last changed (else its creation); zero: unknown, long ago
	// Reason says why it is not Ready: a container's waiting or terminated
	// reason ("CrashLoopBackOff in container app"), else why it is not
	// scheduled, else its phase. Empty when Ready.
	Reason string
	// Broken: Reason names a state in which the pod serves nothing and
	// will not by itself (CrashLoopBackOff, an image that cannot be pulled,
	// unschedulable).
	Broken bool
	// Refs are the ConfigMaps and Secrets its containers read (ParseRefs):
	// interned, shared by the pods of one template.
	Refs Refs
	// Node is the node it is bound to (spec.nodeName); "": not scheduled
	// yet. A DaemonSet replaces a pod on its node: the budget tells a
	// replacement from a pod on a node come back by it.
	Node string
}

// Owner is a pod's controller, as its ownerReferences name it.
type Owner struct {
	APIVersion, Kind, Name, UID string
}

// Parse reads a pod, a LIST item or a watch event's object; false if it has
// no name or uid. What it returns does not hold raw.
func Parse(raw []byte) (Record, bool) {
	var r Record
	// A view of raw: whatever is kept is cloned out of it (reuse,
	// readLabels, MakeRefs).
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(raw), len(raw)))
	ok := parse(doc.Get("metadata"), doc.Get("spec"), doc.Get("status"), &r, nil)
	if ok {
		r.Refs = ParseRefs(doc.Get("spec"))
	}
	return r, ok
}

// parse reads a pod's metadata, node and status into r, reusing old's
// strings and labels where they did not change (old may be nil): the events
// a pod gets most are status updates that change none of them.
func parse(meta, spec, status gjson.Result, r *Record, old *Record) bool {
	if old == nil {
		old = &Record{}
	}
	r.Name = reuse(meta.Get("name").String(), old.Name)
	r.UID = reuse(meta.Get("uid").String(), old.UID)
	if r.Name == "" || r.UID == "" {
		return false
	}
	r.ResourceVersion = reuse(meta.Get("resourceVersion").String(), old.ResourceVersion)
	r.Terminating = meta.Get("deletionTimestamp").Type != gjson.Null // absent or null
	r.Owner = Owner{}
	if o := meta.Get(`ownerReferences.#(controller==true)`); o.Exists() {
		r.Owner = Owner{APIVersion: reuse(o.Get("apiVersion").String(), old.Owner.APIVersion), Kind: reuse(o.Get("kind").String(), old.Owner.Kind),
			Name: reuse(o.Get("name").String(), old.Owner.Name), UID: reuse(o.Get("uid").String(), old.Owner.UID)}
	}
	switch status.Get("phase").String() {
	case "Failed", "Succeeded":
		r.Finished = true
	default:
		r.Finished = false
	}
	ready := status.Get(`conditions.#(type=="Ready")`)
	r.Ready = ready.Get("status").String() == "True"
	since := meta.Get("creationTimestamp")
	if ready.Exists() {
		since = ready.Get("lastTransitionTime")
	}
	r.Since, _ = time.Parse(time.RFC3339, since.String())
	r.Reason, r.Broken = "", false
	if !r.Ready {
		reason, broken := brokenState(status)
		r.Reason, r.Broken = reuse(reason, old.Reason), broken
	}
	r.Labels = readLabels(meta.Get("labels"), old.Labels)
	r.Node = reuse(spec.Get("nodeName").String(), old.Node)
	return true
}

// reuse returns old if s equals it, else a copy of s that does not hold
// the buffer s was read from.
func reuse(s, old string) string {
	if s == old {
		return old
	}
	return strings.Clone(s)
}

// brokenReasons are the container waiting reasons of a pod that will not
// serve by itself.
var brokenReasons = map[string]bool{
	"CrashLoopBackOff": true, "ImagePullBackOff": true, "ErrImagePull": true, "CreateContainerConfigError": true,
}

// brokenState says, from a pod's status, why it is not Ready and whether
// that is broken (see Record.Broken): a container's waiting or terminated
// reason, else why it is not scheduled, else its phase. Every part is
// bounded: the reason goes into Events and halt messages.
func brokenState(status gjson.Result) (why string, broken bool) {
	for _, list := range []string{"initContainerStatuses", "containerStatuses"} {
		status.Get(list).ForEach(func(_, cs gjson.Result) bool {
			if cs.Get("ready").Bool() {
				return true
			}
			name := truncate.String(cs.Get("name").String(), 63)
			waiting := cs.Get("state.waiting.reason").String()
			for _, reason := range []string{waiting, cs.Get("state.terminated.reason").String(), cs.Get("lastState.terminated.reason").String()} {
				if reason != "" {
					why = truncate.String(reason, 128) + " in container " + name
					break
				}
			}
			if why == "" {
				why = "container " + name + " not ready"
			}
			broken = brokenReasons[waiting]
			return false
		})
		if why != "" {
			return why, broken
		}
	}
	if scheduled := status.Get(`conditions.#(type=="PodScheduled")`); scheduled.Get("status").String() == "False" {
		return "not scheduled: " + truncate.String(scheduled.Get("reason").String(), 128), scheduled.Get("reason").String() == "Unschedulable"
	}
	if phase := status.Get("phase").String(); phase != "" {
		return "phase " + truncate.String(phase, 32), false
	}
	return "no Ready condition", false
}
