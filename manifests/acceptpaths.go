package manifests

import (
	"regexp"
	"regexp/syntax"
	"slices"
)

// UnusedBranches returns each branch of the accept-paths regexp expr (one
// pattern of kubectl proxy's comma-separated --accept-paths) that no path
// of used matches: a branch is the pattern with one of its choice points
// settled one way (an alternative of an alternation, an optional part
// present or absent), and the pattern whole. A branch no request takes is
// a path the ambassador passes for nothing. go test ./manifests/ holds it
// against the paths apiclient builds, the e2e suite against the requests
// its controllers sent.
func UnusedBranches(expr string, used []string) ([]string, error) {
	parsed, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil, err
	}
	var unused []string
	for _, b := range append(choices(parsed), parsed) {
		re, err := regexp.Compile(b.String())
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(used, re.MatchString) && !slices.Contains(unused, b.String()) {
			unused = append(unused, b.String())
		}
	}
	return unused, nil
}

// choices returns re with each of its choice points settled one way.
func choices(re *syntax.Regexp) []*syntax.Regexp {
	var out []*syntax.Regexp
	for i, sub := range re.Sub {
		for _, v := range choices(sub) {
			c := *re
			c.Sub = slices.Clone(re.Sub)
			c.Sub[i] = v
			out = append(out, &c)
		}
	}
	switch re.Op {
	case syntax.OpAlternate:
		out = append(out, re.Sub...)
	case syntax.OpQuest:
		out = append(out, re.Sub[0], &syntax.Regexp{Op: syntax.OpEmptyMatch})
	}
	return out
}
