package selector

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/k8spatterns/config-watcher/internal/k8sname"
)

// tokenRE finds the tokens between blanks. Like the API server's lexer, an
// identifier is any run of bytes that are neither blanks nor punctuation, so
// '&', '?', '#' or '%' end up inside an identifier and the label rules
// refuse them.
var tokenRE = regexp.MustCompile(`[^ \t\n\r!=,()<>]+|!=|==|[!=,()<>]`)

type token struct {
	text string // "" at the end of the selector
	pos  int
}

// ident reports whether t is a key, a value or a word operator (in, notin).
func (t token) ident() bool { return t.text != "" && strings.IndexByte("!=,()<>", t.text[0]) < 0 }

func (t token) String() string {
	if t.text == "" {
		return "end of selector"
	}
	return strconv.Quote(t.text)
}

func errAt(t token, format string, args ...any) error {
	return &SyntaxError{Pos: t.pos, Reason: fmt.Sprintf(format, args...)}
}

type parser struct {
	toks []token // ends with the end-of-selector token
	i    int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	p.i = min(p.i+1, len(p.toks)-1) // stays on the end-of-selector token
	return t
}

func parse(s string) ([]Requirement, error) {
	p := parser{}
	for _, m := range tokenRE.FindAllStringIndex(s, -1) {
		p.toks = append(p.toks, token{s[m[0]:m[1]], m[0]})
	}
	p.toks = append(p.toks, token{"", len(s)})
	var reqs []Requirement
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
		switch t := p.next(); t.text {
		case "":
			return reqs, nil
		case ",":
		default:
			return nil, errAt(t, "expected ',' or end of selector, found %s", t)
		}
	}
}

func (p *parser) requirement() (Requirement, error) {
	if p.peek().text == "!" {
		p.next()
		key, err := p.word("label key", ValidateKey)
		return Requirement{Key: key, Operator: DoesNotExist}, err
	}
	key, err := p.word("label key", ValidateKey)
	if err != nil {
		return Requirement{}, err
	}
	r := Requirement{Key: key, Operator: Exists}
	op := p.peek()
	if op.text == "" || op.text == "," {
		return r, nil
	}
	p.next()
	switch op.text {
	case "=", "==", "!=":
		r.Operator, r.Values = Equals, []string{""} // "key=" selects the empty value
		if op.text == "!=" {
			r.Operator = NotEquals
		}
		if v := p.peek(); v.text != "" && v.text != "," {
			r.Values[0], err = p.word("label value", validateName)
		}
	case "in", "notin":
		r.Operator = Operator(op.text)
		r.Values, err = p.valueSet()
	case "<", ">":
		err = errAt(op, "numeric comparison %q is not supported", op.text)
	default:
		err = errAt(op, "expected an operator (=, ==, !=, in, notin), found %s", op)
	}
	return r, err
}

// word takes a key or a value and checks it with valid.
func (p *parser) word(what string, valid func(string) error) (string, error) {
	t := p.next()
	if !t.ident() {
		return "", errAt(t, "expected a %s, found %s", what, t)
	}
	if err := valid(t.text); err != nil {
		return "", errAt(t, "%s %q: %v", what, t.text, err)
	}
	return t.text, nil
}

// valueSet parses "(a,b,...)" and drops repeated values.
func (p *parser) valueSet() ([]string, error) {
	if t := p.next(); t.text != "(" {
		return nil, errAt(t, "expected '(' to open a value set, found %s", t)
	}
	var values []string
	seen := map[string]bool{}
	for {
		switch t := p.peek(); {
		case t.text == "," || t.text == ")":
			// "()", "(a,)", "(,)": refused, so that every accepted set
			// renders to a form that parses again.
			return nil, errAt(t, "empty value in a value set")
		case !t.ident():
			return nil, errAt(t, "expected a value or ')', found %s", t)
		}
		v, err := p.word("label value", validateName)
		if err != nil {
			return nil, err
		}
		if !seen[v] {
			seen[v] = true
			values = append(values, v)
		}
		switch t := p.next(); t.text {
		case ")":
			return values, nil
		case ",":
		default:
			return nil, errAt(t, "expected ',' or ')' in a value set, found %s", t)
		}
	}
}

// nameRE is the rule of k8s.io/apimachinery/pkg/util/validation for a
// key's name part and a label value.
var nameRE = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)

// ValidateKey checks a label (or annotation) key: an optional DNS-1123
// subdomain prefix and a '/', then a name as validateName wants it.
func ValidateKey(key string) error {
	prefix, name, found := strings.Cut(key, "/")
	if !found {
		name = key
	} else if err := k8sname.Subdomain(prefix); err != nil {
		return fmt.Errorf("prefix %v", err)
	}
	if name == "" {
		return errors.New("name part is empty")
	}
	return validateName(name)
}

// validateName checks a key's name part or a label value (never empty here).
func validateName(s string) error {
	if len(s) > 63 {
		return errors.New("longer than 63 characters")
	}
	if !nameRE.MatchString(s) {
		return errors.New("must be letters, digits, '-', '_' or '.' (other characters are not allowed), and start and end with a letter or digit")
	}
	return nil
}
