package policy

import (
	"errors"
	"fmt"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/selector"
)

// RestartReferencingAnnotation opts a ConfigMap or Secret in as the
// selector annotation does, selecting the pods of its namespace that
// reference it (docs/design.md#pods-that-reference-the-object): "true" or
// "false"; another value is refused at its next change.
const RestartReferencingAnnotation = "k8spatterns.io/restartReferencingPods"

// maxReferencingText bounds what is kept of the annotation: "false" is the
// longest value read.
const maxReferencingText = len("false") + 1

// selection is what a round restarts, and every wave, budget and re-read
// asks of a pod: the pods its labels select and, for an object with
// RestartReferencingAnnotation, of those the ones that read what changed.
// Both annotations together: the selector narrows the referencing pods, so
// that an object read by several workloads can be made to restart some.
type selection struct {
	labels *selector.Selector // never nil: without a selector, the opt-in label's (or none: every pod)
	ref    *refRule           // nil: by labels alone
}

// refRule selects the pods that read an object: every one that reads it
// whole, and of those that read keys by name those that read one of keys
// (the keys added, removed or changed: keys.go), or all of them when which
// changed is not known.
type refRule struct {
	kind podindex.RefKind
	name string
	all  bool
	keys map[string]bool
	// keyName, if set, is how keys names a pod's key (a Secret's: by a
	// keyed digest of it).
	keyName func(string) string
}

// selects reports whether the round restarts p (or counts it as its own).
func (s *selection) selects(p *livePod) bool {
	return s.labels.Matches(p.labels) && s.ref.reads(p.refs)
}

// mayMatch reports whether a pod with these labels may be selected, its
// references unknown: who hears only labels (podChanged, settle's other
// objects) wakes or waits one round too many, never one too few.
func (s *selection) mayMatch(labels map[string]string) bool { return s.labels.Matches(labels) }

// reads reports whether refs read what rule restarts for; a nil rule reads
// anything.
func (rule *refRule) reads(refs podindex.Refs) bool {
	if rule == nil {
		return true
	}
	ref, found := refs.Reads(rule.kind, rule.name)
	switch {
	case !found:
		return false
	case ref.Whole || rule.all:
		return true
	}
	for _, k := range ref.Keys {
		if rule.keyName != nil {
			k = rule.keyName(k)
		}
		if rule.keys[k] {
			return true
		}
	}
	return false
}

// String names the selection in logs and Events: "matching app=web",
// "referencing ConfigMap web", or both.
func (s *selection) String() string {
	text := ""
	if l := s.labels.String(); l != "" {
		text = "matching " + l
	}
	if s.ref != nil {
		kind := "ConfigMap"
		if s.ref.kind == podindex.RefSecret {
			kind = "Secret"
		}
		if text != "" {
			text += " and "
		}
		text += "referencing " + kind + " " + s.ref.name
	}
	return text
}

// errReferencingValue: the annotation is neither "true" nor "false".
var errReferencingValue = errors.New(`must be "true" or "false"`)

// optedIn: obj carries the selector annotation, or asks for the pods that
// reference it. ("false" alone is no opt-in; another value is, and is
// refused at its next change, so that a typo is told.)
func (obj object) optedIn() bool {
	return obj.hasSelector || (obj.hasReferencing && obj.referencing != "false")
}

// selectsBy is what a round's selection is made from: a change of it ends
// the round. An empty selector is not no selector: it is refused, and
// adding one to an object that selects by reference ends its round.
func (obj object) selectsBy() string {
	by := obj.selector
	if obj.hasSelector {
		by = "=" + by
	}
	if obj.hasReferencing {
		by += "\x00" + obj.referencing
	}
	return by
}

// selectionOf is obj's selection as every round and look uses it: the
// selector refused if too broad, and narrowed to pods that carry the
// opt-in label when one is required (POD_OPT_IN_LABEL), so a workload
// consents where it is defined; the referencing pods, all of them
// (reconcile narrows them to the keys that changed: narrow).
func (c *Controller) selectionOf(obj object) (*selection, error) {
	s := &selection{labels: new(selector.Selector)}
	switch {
	case !obj.hasReferencing || obj.referencing == "false":
	case obj.referencing == "true":
		s.ref = &refRule{kind: refKind(obj.kind), name: obj.name, all: true}
	default:
		return nil, fmt.Errorf("%s %q: %w", RestartReferencingAnnotation, obj.referencing, errReferencingValue)
	}
	if obj.hasSelector {
		sel, err := selector.Parse(obj.selector)
		if err != nil {
			return nil, err
		}
		s.labels = sel
	}
	if c.cfg.PodOptIn != nil {
		s.labels = s.labels.And(c.cfg.PodOptIn)
	}
	return s, nil
}

func refKind(k kind) podindex.RefKind {
	if k == kindSecret {
		return podindex.RefSecret
	}
	return podindex.RefConfigMap
}
