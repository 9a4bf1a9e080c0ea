// Package selector parses and validates Kubernetes label selectors locally,
// before any of them reaches the API server. The grammar is the set-based
// one of k8s.io/apimachinery/pkg/labels: comma-separated `key`, `!key`,
// `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`; the
// numeric `key>n` and `key<n` are refused (no pod-restart selector needs
// them). The controller deletes every pod a selector matches, so selectors
// that would match almost every pod (empty, or only negative terms) are
// refused too.
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

// The errors for selectors refused for their breadth or their size.
var (
	ErrEmpty                 = errors.New("selector is empty: it would match every pod")
	ErrTooLong               = fmt.Errorf("selector is longer than %d bytes: no restart needs one so long", MaxLength)
	ErrNoPositiveRequirement = errors.New("selector has no positive requirement (key, key=value or key in (...)): it would match almost every pod")
)

// Parse parses and validates s. The error says what is wrong and where.
func Parse(s string) (*Selector, error) {
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
	if !slices.ContainsFunc(reqs, func(r Requirement) bool { return r.Operator.positive() }) {
		return nil, ErrNoPositiveRequirement
	}
	return &Selector{requirements: reqs}, nil
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
