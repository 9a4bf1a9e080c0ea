// Package selector parses and validates Kubernetes label selectors locally,
// before any of them reaches the API server. The grammar is the set-based
// one of k8s.io/apimachinery/pkg/labels: comma-separated `key`, `!key`,
// `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`; the
// numeric `key>n` and `key<n` are refused (no pod-restart selector needs
// them). The controller deletes every pod a selector matches, so selectors
// that would match almost every pod are refused too: empty, only negative
// terms, only `key` terms (a label's presence, not a workload), or only
// terms on labels the system puts on every pod of a kind
// (pod-template-hash: every Deployment's pods). docs/operations.md calls
// them "too broad".
package selector

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Operator is the relation a requirement asserts.
type Operator string

const (
	Exists       Operator = "exists"
	DoesNotExist Operator = "!"
	Equals       Operator = "="
	NotEquals    Operator = "!="
	In           Operator = "in"
	NotIn        Operator = "notin"
)

// positive reports whether the operator can only match pods that carry the
// key, which is what keeps a selector from matching unrelated pods.
func (o Operator) positive() bool {
	return o == Exists || o == Equals || o == In
}

// Requirement is one comma-separated term of a selector.
type Requirement struct {
	Key      string
	Operator Operator
	Values   []string // one for Equals/NotEquals, one or more for In/NotIn, none otherwise
}

// Selector is a validated selector: a conjunction of requirements with at
// least one positive requirement.
type Selector struct{ requirements []Requirement }

// MaxLength bounds a selector's text: the longest a restart needs is a
// few terms, and a controller keeps each object's selector in memory.
const MaxLength = 4096

// The errors for selectors refused for their breadth or their size. Each
// says what to give instead: whoever reads it in an Event is fixing one.
var (
	ErrEmpty                 = errors.New("selector is empty: it would match every pod; name the workload's pods, e.g. app=webapp")
	ErrTooLong               = fmt.Errorf("selector is longer than %d bytes: no restart needs one so long", MaxLength)
	ErrNoPositiveRequirement = errors.New("selector has no positive requirement (key, key=value or key in (...)): it would match almost every pod; name the workload's pods, e.g. app=webapp")
	// ErrOnlyExistence: `app` matches every pod that has the label, of
	// whatever workload; only a value names one.
	ErrOnlyExistence = errors.New("selector names no label value (only key or !key terms, or values only of labels the system sets): it would match every pod that merely has the label; give the value, e.g. app=webapp")
	// ErrSystemKeysOnly: the keys of SystemKeys are on every pod of a
	// kind, so a selector of them alone restarts pods whose owners never
	// chose to be restarted (the confused deputy of issue 37).
	ErrSystemKeysOnly = errors.New("selector requires only labels the system sets on every pod of a kind (such as pod-template-hash or controller-revision-hash): it would match pods of every workload of that kind; select by a label of the workload's own, e.g. app=webapp")
)

// SystemKeys are the labels Kubernetes' own controllers (or admission)
// put on every pod they create, whatever the workload: a selector must not
// rest on them alone.
var SystemKeys = []string{
	"pod-template-hash",                        // Deployment → ReplicaSet pods
	"controller-revision-hash",                 // StatefulSet, DaemonSet
	"pod-template-generation",                  // DaemonSet
	"statefulset.kubernetes.io/pod-name",       // StatefulSet
	"apps.kubernetes.io/pod-index",             // StatefulSet (1.28+)
	"controller-uid",                           // Job (legacy)
	"job-name",                                 // Job (legacy)
	"batch.kubernetes.io/controller-uid",       // Job
	"batch.kubernetes.io/job-name",             // Job
	"batch.kubernetes.io/job-completion-index", // indexed Job
	"topology.kubernetes.io/zone",              // copied to pods by PodTopologyLabels admission (1.33+)
	"topology.kubernetes.io/region",            // same
}

// systemKey reports whether the system sets key on every pod of a kind.
func systemKey(key string) bool { return slices.Contains(SystemKeys, key) }

// Parse parses and validates s. The error says what is wrong and where.
func Parse(s string) (*Selector, error) {
	sel, err := ParseAny(s)
	if err != nil {
		return nil, err
	}
	if err := tooBroad(sel.requirements); err != nil {
		return nil, err
	}
	return sel, nil
}

// tooBroad says why a selector of reqs would match pods of workloads that
// never chose it, nil if it would not: it needs a term pinning the value
// (key=v or key in (...)) of a label that is not the system's.
func tooBroad(reqs []Requirement) error {
	if !slices.ContainsFunc(reqs, func(r Requirement) bool { return r.Operator.positive() }) {
		return ErrNoPositiveRequirement
	}
	if slices.ContainsFunc(reqs, func(r Requirement) bool {
		return (r.Operator == Equals || r.Operator == In) && !systemKey(r.Key)
	}) {
		return nil
	}
	if !slices.ContainsFunc(reqs, func(r Requirement) bool { return r.Operator.positive() && !systemKey(r.Key) }) {
		return ErrSystemKeysOnly
	}
	return ErrOnlyExistence
}

// ParseAny parses s by the grammar alone, refusing only what is malformed,
// empty or too long: for selectors that do not choose pods to delete (the
// Namespaces of NAMESPACE_SELECTOR), where a label's presence is a fine
// choice.
func ParseAny(s string) (*Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, ErrEmpty
	}
	if len(s) > MaxLength {
		return nil, ErrTooLong
	}
	reqs, err := parse(s)
	if err != nil {
		return nil, err
	}
	return &Selector{requirements: reqs}, nil
}

// ParseLabel parses one label as `key=value` (a non-empty value), the form
// of a label every selected pod must carry (POD_OPT_IN_LABEL), into a
// selector of it alone.
func ParseLabel(s string) (*Selector, error) {
	sel, err := ParseAny(s)
	if err != nil {
		return nil, err
	}
	if r := sel.requirements; len(r) != 1 || r[0].Operator != Equals || r[0].Values[0] == "" {
		return nil, errors.New("must be one label as key=value, e.g. config-watcher.k8spatterns.io/restart=true")
	}
	return sel, nil
}

// And returns the conjunction of s and o: how a required label
// (POD_OPT_IN_LABEL) joins every selector. Neither is changed.
func (s *Selector) And(o *Selector) *Selector {
	return &Selector{requirements: append(slices.Clip(s.requirements), o.requirements...)}
}

// String renders the selector in a canonical form the API server accepts.
// It is what the controller sends, so the server evaluates exactly what was
// validated here.
func (s *Selector) String() string {
	terms := make([]string, len(s.requirements))
	for i, r := range s.requirements {
		switch r.Operator {
		case Exists:
			terms[i] = r.Key
		case DoesNotExist:
			terms[i] = "!" + r.Key
		case Equals, NotEquals:
			terms[i] = r.Key + string(r.Operator) + r.Values[0]
		case In, NotIn:
			terms[i] = r.Key + " " + string(r.Operator) + " (" + strings.Join(r.Values, ",") + ")"
		}
	}
	return strings.Join(terms, ",")
}

// Matches reports whether a pod with these labels is selected. A negative
// operator is its positive twin negated: as on the API server, a pod
// without the key matches `!key`, `key!=v` and `key notin (...)`.
func (s *Selector) Matches(labels map[string]string) bool {
	for _, r := range s.requirements {
		v, found := labels[r.Key]
		if r.Operator != Exists && r.Operator != DoesNotExist {
			found = found && slices.Contains(r.Values, v)
		}
		if found != r.Operator.positive() {
			return false
		}
	}
	return true
}

// SyntaxError locates a grammar or label-rule violation in the input.
type SyntaxError struct {
	Pos    int // byte offset in the selector
	Reason string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid selector at byte %d: %s", e.Pos, e.Reason)
}
