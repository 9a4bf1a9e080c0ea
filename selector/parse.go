package selector

import (
	"fmt"
	"strings"
)

type tokenKind int

const (
	tokEOF tokenKind = iota
	tokIdent
	tokNot       // !
	tokEquals    // = or ==
	tokNotEquals // !=
	tokComma
	tokOpen  // (
	tokClose // )
	tokCompare
)

type token struct {
	kind tokenKind
	text string
	pos  int
}

// lexer splits a selector into tokens. Like the API server's lexer, an
// identifier is any run of bytes that are neither blanks nor selector
// punctuation, so characters such as '&', '?', '#' or '%' end up inside an
// identifier and are then refused by the label rules.
type lexer struct {
	in  string
	pos int
}

// punctuation, longest first so that "!=" and "==" win over "!" and "=".
var punctuation = []struct {
	text string
	kind tokenKind
}{
	{"!=", tokNotEquals}, {"==", tokEquals}, {"!", tokNot}, {"=", tokEquals},
	{",", tokComma}, {"(", tokOpen}, {")", tokClose}, {"<", tokCompare}, {">", tokCompare},
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (l *lexer) next() token {
	for l.pos < len(l.in) && isBlank(l.in[l.pos]) {
		l.pos++
	}
	start := l.pos
	if l.pos >= len(l.in) {
		return token{kind: tokEOF, pos: start}
	}
	for _, p := range punctuation {
		if strings.HasPrefix(l.in[l.pos:], p.text) {
			l.pos += len(p.text)
			return token{kind: p.kind, text: p.text, pos: start}
		}
	}
	for l.pos < len(l.in) && !isBlank(l.in[l.pos]) && strings.IndexByte("!=,()<>", l.in[l.pos]) < 0 {
		l.pos++
	}
	return token{kind: tokIdent, text: l.in[start:l.pos], pos: start}
}

type parser struct {
	lex    lexer
	peeked *token
}

func (p *parser) peek() token {
	if p.peeked == nil {
		t := p.lex.next()
		p.peeked = &t
	}
	return *p.peeked
}

func (p *parser) take() token {
	t := p.peek()
	p.peeked = nil
	return t
}

func errAt(t token, format string, args ...any) error {
	return &SyntaxError{Pos: t.pos, Reason: fmt.Sprintf(format, args...)}
}

func describe(t token) string {
	if t.kind == tokEOF {
		return "end of selector"
	}
	return fmt.Sprintf("%q", t.text)
}

func (p *parser) parse() ([]Requirement, error) {
	var reqs []Requirement
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
		switch t := p.take(); t.kind {
		case tokEOF:
			return reqs, nil
		case tokComma:
			continue
		default:
			return nil, errAt(t, "expected ',' or end of selector, found %s", describe(t))
		}
	}
}

func (p *parser) requirement() (Requirement, error) {
	t := p.take()
	if t.kind == tokNot {
		key, err := p.key()
		if err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: key, Operator: DoesNotExist}, nil
	}
	if t.kind != tokIdent {
		return Requirement{}, errAt(t, "expected a label key, found %s", describe(t))
	}
	if err := validateKey(t); err != nil {
		return Requirement{}, err
	}
	key := t.text
	switch op := p.peek(); op.kind {
	case tokEOF, tokComma:
		return Requirement{Key: key, Operator: Exists}, nil
	case tokEquals, tokNotEquals:
		p.take()
		v := p.peek()
		value := ""
		if v.kind == tokIdent {
			p.take()
			if err := validateValue(v); err != nil {
				return Requirement{}, err
			}
			value = v.text
		} else if v.kind != tokEOF && v.kind != tokComma {
			return Requirement{}, errAt(v, "expected a label value, found %s", describe(v))
		}
		operator := Equals
		if op.kind == tokNotEquals {
			operator = NotEquals
		}
		return Requirement{Key: key, Operator: operator, Values: []string{value}}, nil
	case tokIdent:
		p.take()
		var operator Operator
		switch op.text {
		case "in":
			operator = In
		case "notin":
			operator = NotIn
		default:
			return Requirement{}, errAt(op, "expected an operator (=, ==, !=, in, notin), found %s", describe(op))
		}
		values, err := p.valueSet()
		if err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: key, Operator: operator, Values: values}, nil
	case tokCompare:
		return Requirement{}, errAt(op, "numeric comparison %q is not supported", op.text)
	default:
		return Requirement{}, errAt(op, "expected an operator, found %s", describe(op))
	}
}

func (p *parser) key() (string, error) {
	t := p.take()
	if t.kind != tokIdent {
		return "", errAt(t, "expected a label key, found %s", describe(t))
	}
	if err := validateKey(t); err != nil {
		return "", err
	}
	return t.text, nil
}

func (p *parser) valueSet() ([]string, error) {
	if t := p.take(); t.kind != tokOpen {
		return nil, errAt(t, "expected '(' to open a value set, found %s", describe(t))
	}
	var values []string
	for {
		t := p.take()
		switch t.kind {
		case tokIdent:
			if err := validateValue(t); err != nil {
				return nil, err
			}
			values = append(values, t.text)
		case tokComma, tokClose:
			// "()", "(a,)", "(,)": an empty value in a set is refused, so
			// that every accepted set renders to a form that parses again.
			return nil, errAt(t, "empty value in a value set")
		default:
			return nil, errAt(t, "expected a value or ')', found %s", describe(t))
		}
		switch t := p.take(); t.kind {
		case tokComma:
			continue
		case tokClose:
			return dedupe(values), nil
		default:
			return nil, errAt(t, "expected ',' or ')' in a value set, found %s", describe(t))
		}
	}
}

func dedupe(values []string) []string {
	seen := make(map[string]bool, len(values))
	out := values[:0]
	for _, v := range values {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func validateKey(t token) error {
	if err := ValidateKey(t.text); err != nil {
		return errAt(t, "label key %q: %v", t.text, err)
	}
	return nil
}

// validateValue checks a label value (never empty in a token): a name of at
// most 63 bytes, with the characters of a key's name part.
func validateValue(t token) error {
	if err := validateName(t.text); err != nil {
		return errAt(t, "label value %q: %v", t.text, err)
	}
	return nil
}

// ValidateKey checks a label (or annotation) key: an optional DNS-1123
// subdomain prefix of at most 253 bytes and a '/', then a name of at most 63
// bytes of alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
func ValidateKey(key string) error {
	name := key
	if i := strings.IndexByte(key, '/'); i >= 0 {
		prefix := key[:i]
		name = key[i+1:]
		if err := ValidateDNSSubdomain(prefix); err != nil {
			return fmt.Errorf("prefix %v", err)
		}
	}
	if name == "" {
		return fmt.Errorf("name part is empty")
	}
	return validateName(name)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func validateName(s string) error {
	if len(s) > 63 {
		return fmt.Errorf("longer than 63 characters")
	}
	if !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return fmt.Errorf("must start and end with a letter or digit")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Errorf("character %q is not allowed (letters, digits, '-', '_', '.')", c)
		}
	}
	return nil
}

// ValidateDNSLabel checks a DNS-1123 label, such as a namespace name: 1 to 63
// lowercase letters, digits and '-', starting and ending alphanumeric.
func ValidateDNSLabel(s string) error {
	if s == "" || len(s) > 63 {
		return fmt.Errorf("%q is not a DNS-1123 label (1 to 63 characters)", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lowerAlnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !lowerAlnum && (c != '-' || i == 0 || i == len(s)-1) {
			return fmt.Errorf("%q is not a DNS-1123 label (lowercase letters, digits, '-')", s)
		}
	}
	return nil
}

// ValidateDNSSubdomain checks a DNS-1123 subdomain, such as a Lease name or a
// key's prefix: DNS-1123 labels joined by '.', at most 253 bytes.
func ValidateDNSSubdomain(s string) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	if len(s) > 253 {
		return fmt.Errorf("longer than 253 characters")
	}
	for _, label := range strings.Split(s, ".") {
		if ValidateDNSLabel(label) != nil {
			return fmt.Errorf("%q is not a DNS-1123 subdomain (lowercase letters, digits, '-', '.')", s)
		}
	}
	return nil
}
