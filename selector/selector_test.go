package selector

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseAccepts ensures every form of the grammar parses and renders to a
// canonical string the API server accepts.
func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"Equality", "app=webapp", "app=webapp"},
		{"DoubleEquals", "app==webapp", "app=webapp"},
		{"BlanksAroundTokens", "  app = webapp , tier  in ( a , b ) ", "app=webapp,tier in (a,b)"},
		{"ExistsBesideAValue", "app=webapp,tier", "app=webapp,tier"},
		{"SystemKeyBesideAWorkloadLabel", "app=webapp,pod-template-hash=7466656dc8", "app=webapp,pod-template-hash=7466656dc8"},
		{"SetOfAWorkloadLabel", "app in (webapp,api)", "app in (webapp,api)"},
		{"PrefixedKey", "k8spatterns.io/app=web_app-1.2", "k8spatterns.io/app=web_app-1.2"},
		{"EmptyValue", "app=", "app="},
		{"PositivePlusNegative", "app=webapp,!canary,tier!=db,env notin (dev)", "app=webapp,!canary,tier!=db,env notin (dev)"},
		{"SetDeduplicated", "tier in (a,b,a)", "tier in (a,b)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, s.String())
			again, err := Parse(s.String())
			require.NoError(t, err, "canonical form must parse again")
			assert.Equal(t, s.String(), again.String())
		})
	}
}

// TestParseRefuses ensures each class of dangerous or malformed selector is
// refused with a reason, so no request is ever built from it.
func TestParseRefuses(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr error  // a sentinel, or nil to expect a *SyntaxError
		reason  string // part of the message
	}{
		{"Empty", "", ErrEmpty, ""},
		{"Blank", " \t\n", ErrEmpty, ""},
		{"TooLong", "app in (" + strings.Repeat("x,", MaxLength/2) + "webapp)", ErrTooLong, ""},
		{"OnlyNotExists", "!app", ErrNoPositiveRequirement, ""},
		{"OnlyNotEquals", "app!=webapp", ErrNoPositiveRequirement, ""},
		{"OnlyNotIn", "app notin (a,b)", ErrNoPositiveRequirement, ""},
		{"OnlyNegativesCombined", "!a,b!=c,d notin (e)", ErrNoPositiveRequirement, ""},
		{"OnlyExistence", "app", ErrOnlyExistence, ""},
		{"OnlyExistenceSeveral", "app,tier", ErrOnlyExistence, ""},
		{"ExistenceAndNegatives", "app,!canary,tier!=db", ErrOnlyExistence, ""},
		{"ExistenceAndASystemValue", "app,pod-template-hash=7466656dc8", ErrOnlyExistence, ""},
		{"DeploymentPods", "pod-template-hash", ErrSystemKeysOnly, ""},
		{"OneReplicaSet", "pod-template-hash=7466656dc8", ErrSystemKeysOnly, ""},
		{"StatefulSetAndDaemonSetPods", "controller-revision-hash", ErrSystemKeysOnly, ""},
		{"StatefulSetPodName", "statefulset.kubernetes.io/pod-name", ErrSystemKeysOnly, ""},
		{"StatefulSetPodIndex", "apps.kubernetes.io/pod-index in (0,1)", ErrSystemKeysOnly, ""},
		{"DaemonSetGeneration", "pod-template-generation=3", ErrSystemKeysOnly, ""},
		{"JobPods", "batch.kubernetes.io/job-name,job-name", ErrSystemKeysOnly, ""},
		{"JobControllerUID", "controller-uid,batch.kubernetes.io/controller-uid", ErrSystemKeysOnly, ""},
		{"SystemKeysAndNegatives", "pod-template-hash,app!=webapp", ErrSystemKeysOnly, ""},
		{"UnclosedSet", "app in (", nil, "expected a value or ')'"},
		{"UnclosedSetAfterValue", "app in (a", nil, "expected ',' or ')'"},
		{"EmptySet", "app in ()", nil, "empty value in a value set"},
		{"EmptyValueInSet", "app in (a,)", nil, "empty value in a value set"},
		{"OnlyEmptyValuesInSet", "0 in(,)", nil, "empty value in a value set"},
		{"SetWithoutParens", "app in a", nil, "expected '('"},
		{"UnknownOperator", "app is webapp", nil, "expected an operator"},
		{"NumericComparison", "replicas>1", nil, "not supported"},
		{"TrailingComma", "app=webapp,", nil, "expected a label key"},
		{"LeadingComma", ",app=webapp", nil, "expected a label key"},
		{"DoubleOperator", "app==!webapp", nil, "expected a label value"},
		{"AmpersandInjection", "app=webapp&fieldSelector=x", nil, "not allowed"},
		{"QueryInjection", "app=webapp?x", nil, "not allowed"},
		{"FragmentInjection", "app=web#x", nil, "not allowed"},
		{"PercentEscape", "app=web%26x", nil, "not allowed"},
		{"SlashInValue", "app=a/b", nil, "not allowed"},
		{"NonASCIIValue", "app=wébapp", nil, "not allowed"},
		{"ValueTooLong", "app=" + strings.Repeat("a", 64), nil, "longer than 63"},
		{"KeyNameTooLong", strings.Repeat("k", 64) + "=v", nil, "longer than 63"},
		{"PrefixTooLong", strings.Repeat("a", 254) + "/k=v", nil, "longer than 253"},
		{"UppercasePrefix", "Example.com/k=v", nil, "DNS-1123"},
		{"EmptyKeyName", "example.com/=v", nil, "name part is empty"},
		{"ValueStartsWithDash", "app=-web", nil, "start and end"},
		{"MissingSeparator", "app=webapp tier=db", nil, "expected ','"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.in)
			require.Error(t, err)
			assert.Nil(t, s)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			var se *SyntaxError
			require.True(t, errors.As(err, &se), "want *SyntaxError, got %T: %v", err, err)
			assert.Contains(t, err.Error(), tt.reason)
		})
	}
}

// TestMatchesAgreesWithTheAPIServer ensures local matching agrees with the API server's semantics,
// including that negative terms match pods without the key.
func TestMatchesAgreesWithTheAPIServer(t *testing.T) {
	web := map[string]string{"app": "webapp", "tier": "front"}
	tests := []struct {
		name, sel string
		labels    map[string]string
		want      bool
	}{
		{"EqualsMatches", "app=webapp", web, true},
		{"EqualsOtherValue", "app=db", web, false},
		{"EqualsMissingKey", "team=x", web, false},
		{"ExistsMatches", "tier", web, true},
		{"NotExistsExcludes", "app,!tier", web, false},
		{"NotEqualsAbsentKeyMatches", "app,team!=x", web, true},
		{"InMatches", "tier in (back,front)", web, true},
		{"InMissingKey", "team in (a)", web, false},
		{"NotInExcludes", "app,tier notin (front)", web, false},
		{"AllMustHold", "app=webapp,tier=back", web, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseAny(tt.sel) // matching, not breadth
			require.NoError(t, err)
			assert.Equal(t, tt.want, s.Matches(tt.labels))
		})
	}
}

// TestEverySystemKeyAloneIsRefused ensures no label the system sets on every
// pod of a kind makes a selector on its own, with or without a value.
func TestEverySystemKeyAloneIsRefused(t *testing.T) {
	for _, key := range SystemKeys {
		for _, in := range []string{key, key + "=x", key + " in (x,y)"} {
			_, err := Parse(in)
			assert.ErrorIs(t, err, ErrSystemKeysOnly, in)
		}
	}
}

// TestRefusalsHintAtAWorkloadSelector ensures each refusal for breadth says
// what to write instead, as the InvalidSelector Event shows it.
func TestRefusalsHintAtAWorkloadSelector(t *testing.T) {
	for _, err := range []error{ErrEmpty, ErrNoPositiveRequirement, ErrOnlyExistence, ErrSystemKeysOnly} {
		assert.Contains(t, err.Error(), "e.g. app=webapp")
	}
}

// TestParseAnyTakesWhatParseRefusesForBreadth ensures the grammar-only parse
// (for Namespaces) accepts a label's presence but still refuses bad syntax.
func TestParseAnyTakesWhatParseRefusesForBreadth(t *testing.T) {
	s, err := ParseAny("config-watcher.k8spatterns.io/enabled")
	require.NoError(t, err)
	assert.True(t, s.Matches(map[string]string{"config-watcher.k8spatterns.io/enabled": "yes"}))
	_, err = ParseAny("a&b")
	assert.Error(t, err)
	_, err = ParseAny(" ")
	assert.ErrorIs(t, err, ErrEmpty)
}

// TestParseLabelTakesOneKeyValue ensures a required label is one key=value,
// and anything else is refused with the form to give.
func TestParseLabelTakesOneKeyValue(t *testing.T) {
	s, err := ParseLabel("config-watcher.k8spatterns.io/restart=true")
	require.NoError(t, err)
	assert.Equal(t, "config-watcher.k8spatterns.io/restart=true", s.String())
	for _, in := range []string{"restart", "restart=", "restart!=true", "a=b,c=d", "restart in (true)", "!restart"} {
		_, err := ParseLabel(in)
		assert.ErrorContains(t, err, "key=value", in)
	}
	_, err = ParseLabel("a b")
	assert.Error(t, err)
}

// TestAndRequiresBoth ensures a joined requirement (POD_OPT_IN_LABEL) must
// hold too, is rendered for the server, and leaves both selectors as they were.
func TestAndRequiresBoth(t *testing.T) {
	app, err := Parse("app=webapp")
	require.NoError(t, err)
	optIn, err := ParseAny("config-watcher.k8spatterns.io/restart=true")
	require.NoError(t, err)
	both := app.And(optIn)
	assert.Equal(t, "app=webapp,config-watcher.k8spatterns.io/restart=true", both.String())
	assert.False(t, both.Matches(map[string]string{"app": "webapp"}))
	assert.True(t, both.Matches(map[string]string{"app": "webapp", "config-watcher.k8spatterns.io/restart": "true"}))
	assert.Equal(t, "app=webapp", app.String())
	again, err := Parse(both.String())
	require.NoError(t, err)
	assert.Equal(t, both.String(), again.String())
}

// FuzzParse ensures the parser never panics and that whatever it accepts has
// a positive requirement and a canonical form that parses to itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"app=webapp", "a in (b,c),!d", "x notin (", "k8spatterns.io/a==b", "!", "a>1", "(", "a=b,c!=d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			return
		}
		again, err := Parse(s.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", s.String(), in, err)
		}
		if again.String() != s.String() {
			t.Fatalf("canonical form not stable: %q -> %q", s.String(), again.String())
		}
	})
}

// BenchmarkParse measures parsing a typical selector.
func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("app=webapp,tier in (front,back),!canary"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMatches measures what a round from the pod index does for each
// pod of the namespace: match its labels (a Deployment's pod: three).
func BenchmarkMatches(b *testing.B) {
	sel, err := Parse("app=webapp,tier in (front,back),!canary")
	if err != nil {
		b.Fatal(err)
	}
	labels := map[string]string{"app": "webapp", "tier": "front", "pod-template-hash": "7466656dc8"}
	b.ReportAllocs()
	for b.Loop() {
		if !sel.Matches(labels) {
			b.Fatal("no match")
		}
	}
}
