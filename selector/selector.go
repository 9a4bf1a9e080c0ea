// Package selector parses and validates Kubernetes label selectors locally,
// before any of them reaches the API server.
//
// The controller deletes every pod a selector matches, so validation is
// stricter than the server's: besides the grammar and the label rules it
// refuses selectors that would match almost every pod (empty, or made only
// of negative terms). The set-based grammar is the one of
// k8s.io/apimachinery/pkg/labels: comma-separated requirements, each one of
// `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`,
// `key notin (a,b)`. The numeric `key>n` and `key<n` forms are refused:
// no pod-restart selector needs them.
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
type Selector struct {
	requirements []Requirement
}

// ErrEmpty is returned for an empty or blank selector, which matches every pod.
var ErrEmpty = errors.New("selector is empty: it would match every pod")

// ErrNoPositiveRequirement is returned for selectors made only of `!key`,
// `!=` and `notin` terms: they match nearly every pod in the namespace.
var ErrNoPositiveRequirement = errors.New("selector has no positive requirement (key, key=value or key in (...)): it would match almost every pod")

// Parse parses and validates s. The error says what is wrong and where.
func Parse(s string) (*Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, ErrEmpty
	}
	p := parser{lex: lexer{in: s}}
	reqs, err := p.parse()
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
	var b strings.Builder
	for i, r := range s.requirements {
		if i > 0 {
			b.WriteByte(',')
		}
		switch r.Operator {
		case Exists:
			b.WriteString(r.Key)
		case DoesNotExist:
			b.WriteString("!" + r.Key)
		case Equals, NotEquals:
			b.WriteString(r.Key + string(r.Operator) + r.Values[0])
		case In, NotIn:
			b.WriteString(r.Key + " " + string(r.Operator) + " (" + strings.Join(r.Values, ",") + ")")
		}
	}
	return b.String()
}

// Matches reports whether a pod with these labels is selected.
func (s *Selector) Matches(labels map[string]string) bool {
	for _, r := range s.requirements {
		v, has := labels[r.Key]
		var ok bool
		switch r.Operator {
		case Exists:
			ok = has
		case DoesNotExist:
			ok = !has
		case Equals:
			ok = has && v == r.Values[0]
		case NotEquals:
			ok = !has || v != r.Values[0]
		case In:
			ok = has && slices.Contains(r.Values, v)
		case NotIn:
			ok = !has || !slices.Contains(r.Values, v)
		}
		if !ok {
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
