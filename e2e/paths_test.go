//go:build e2e

package e2e

// The ambassador's --accept-paths held against what the controller really
// requests: every controller a test starts talks to the API through a
// recorder of this process, and at the end of the run every request must be
// one the ambassador of its build passes, and every branch of the
// ambassador's paths must have been taken by one (go test ./manifests/ does
// the same against the paths apiclient builds; this sees the requests the
// controller sent). kubectl proxy -v=3 logs each request it passes or refuses
// too, but the shared proxy serves the tests' own requests as well, and not
// every controller runs behind a proxy of its own.

import (
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/manifests"
)

// unexercisedBranches are the branches of the ambassador's --accept-paths
// that no controller of the e2e suite requests, each with the reason the
// ambassador still passes it, keyed as the failure prints the branch. A
// branch here that the suite does take is reported too: the list says what
// the suite leaves unchecked. Empty: the suite takes every branch.
var unexercisedBranches = map[string]string{}

// The builds whose ambassador the recorded requests are held against: a
// controller watching every namespace runs as the cluster-wide overlay has it.
const (
	namespacedBuild  = "manifests"
	clusterWideBuild = "manifests/cluster-wide"
)

// filters is the ambassador's --accept-paths and --reject-methods of one build.
type filters struct {
	args    []string // the two flags, as kubectl proxy takes them
	accept  []*regexp.Regexp
	methods *regexp.Regexp
}

// passes says whether kubectl proxy with f lets a request through.
func (f *filters) passes(method, path string) bool {
	return !f.methods.MatchString(method) && slices.ContainsFunc(f.accept, func(re *regexp.Regexp) bool { return re.MatchString(path) })
}

var (
	filtersMu    sync.Mutex
	filtersCache = map[string]*filters{}
)

// buildFilters renders build with `kubectl kustomize` (once per run) and
// returns its ambassador's filters: the install's, not a copy of them.
func buildFilters(build string) (*filters, error) {
	filtersMu.Lock()
	defer filtersMu.Unlock()
	if f := filtersCache[build]; f != nil {
		return f, nil
	}
	cmd := exec.Command(env.kubectl, "kustomize", filepath.Join(repoRoot, build))
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w", build, err)
	}
	f := &filters{}
	for _, m := range ambassadorFilter.FindAllStringSubmatch(string(out), -1) {
		f.args = append(f.args, m[1])
		name, value, _ := strings.Cut(m[1], "=")
		switch name {
		case "--accept-paths":
			for _, p := range strings.Split(value, ",") {
				re, err := regexp.Compile(p)
				if err != nil {
					return nil, fmt.Errorf("%s: --accept-paths %q: %w", build, p, err)
				}
				f.accept = append(f.accept, re)
			}
		case "--reject-methods":
			if f.methods, err = regexp.Compile(value); err != nil {
				return nil, fmt.Errorf("%s: --reject-methods: %w", build, err)
			}
		}
	}
	if f.accept == nil || f.methods == nil {
		return nil, fmt.Errorf("%s: the ambassador has no --accept-paths or no --reject-methods", build)
	}
	filtersCache[build] = f
	return f, nil
}

// usedKey is one kind of request: its method, its path with namespaces and
// names in pattern form, and the build of the controller that sent it.
type usedKey struct{ method, pattern, build string }

type used struct {
	n       int
	tests   []string
	refused string // a path of this kind the build's ambassador refuses, "" if none
}

// requestLog is every request the suite's controllers sent.
var requestLog = struct {
	sync.Mutex
	m map[usedKey]*used
}{m: map[usedKey]*used{}}

// recordRequests returns the URL of a reverse proxy to upstream that notes
// each request of test t's controller, built as build has it, in requestLog.
func recordRequests(t *testing.T, upstream, build string) string {
	t.Helper()
	target, err := url.Parse(upstream)
	require.NoError(t, err)
	f, err := buildFilters(build)
	require.NoError(t, err)
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: transport,
		// Watches are streamed line by line, as the ambassador streams them.
		FlushInterval: -1,
		// The upstream down (a test kills the ambassador): the connection
		// fails, as it would to the ambassador itself, rather than a 502
		// the controller would take for the API server's.
		ErrorHandler: func(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) },
	}
	name := t.Name()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := usedKey{r.Method, pathPattern(r.URL.Path), build}
		requestLog.Lock()
		u := requestLog.m[k]
		if u == nil {
			u = &used{}
			requestLog.m[k] = u
		}
		u.n++
		if top, _, _ := strings.Cut(name, "/"); !slices.Contains(u.tests, top) {
			u.tests = append(u.tests, top)
		}
		if u.refused == "" && !f.passes(r.Method, r.URL.Path) {
			u.refused = r.URL.Path
		}
		requestLog.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// pathPattern is path with the namespace as {namespace} and an object's
// name as {name}: /api/v1/namespaces/{namespace}/pods/{name}/eviction.
func pathPattern(path string) string {
	s := strings.Split(path, "/")
	var rest int // the first segment after the group and version
	switch {
	case len(s) >= 3 && s[1] == "api":
		rest = 3
	case len(s) >= 4 && s[1] == "apis":
		rest = 4
	default:
		return path
	}
	if len(s) > rest+1 && s[rest] == "namespaces" {
		s[rest+1] = "{namespace}"
		rest += 2
	}
	if len(s) > rest+1 && s[rest+1] != "" {
		s[rest+1] = "{name}"
	}
	return strings.Join(s, "/")
}

// buildOf is the build a controller started with o runs as: the
// cluster-wide overlay where it watches every namespace.
func buildOf(o controllerOpts) string {
	watched := o.namespace
	for _, e := range o.extraEnv {
		if v, ok := strings.CutPrefix(e, "WATCH_NAMESPACE="); ok {
			watched = v // the last one wins, as in the process's environment
		}
	}
	if watched == "*" {
		return clusterWideBuild
	}
	return namespacedBuild
}

// wholeSuite reports whether this run runs every test: only then must each
// branch of the ambassador's paths have been taken.
func wholeSuite() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// checkAmbassadorPaths, at the end of the run, fails it (returns 1) when a
// controller sent a request its build's ambassador refuses, or, after a
// whole suite that passed, when a branch of either build's --accept-paths
// was taken by no request and is not in unexercisedBranches. It writes the
// recorded requests to a file and prints them when it fails.
func checkAmbassadorPaths(passed bool) int {
	requestLog.Lock()
	defer requestLog.Unlock()
	if len(requestLog.m) == 0 {
		return 0 // no controller ran: no cluster, or no test that starts one
	}
	keys := make([]usedKey, 0, len(requestLog.m))
	for k := range requestLog.m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.pattern+" "+a.method+" "+a.build < b.pattern+" "+b.method+" "+b.build
	})
	var bad []string
	var record strings.Builder
	record.WriteString("# The requests the e2e suite's controllers sent through the ambassador: method, path ({namespace}, {name}),\n")
	record.WriteString("# the build whose ambassador they are held against, how many, the tests that sent them.\n")
	var patterns []string
	for _, k := range keys {
		u := requestLog.m[k]
		tests := u.tests
		if len(tests) > 4 {
			tests = append(slices.Clone(tests[:4]), fmt.Sprintf("and %d more", len(u.tests)-4))
		}
		fmt.Fprintf(&record, "%-6s %-72s %-22s %6d %s\n", k.method, k.pattern, k.build, u.n, strings.Join(tests, ", "))
		patterns = append(patterns, k.pattern)
		if u.refused != "" {
			bad = append(bad, fmt.Sprintf("%s: the ambassador refuses %s %s, which %s sent", k.build, k.method, u.refused, strings.Join(tests, ", ")))
		}
	}
	if passed && wholeSuite() {
		bad = append(bad, unusedBranches(patterns)...)
	}
	path := filepath.Join(os.TempDir(), "config-watcher-e2e-ambassador-paths.txt")
	if dir := os.Getenv("CW_STATE_DIR"); dir != "" {
		path = filepath.Join(dir, "ambassador-paths.txt") // kept when the run fails
	}
	if err := os.WriteFile(path, []byte(record.String()), 0o644); err != nil {
		bad = append(bad, fmt.Sprintf("write the recorded requests: %v", err))
	}
	if len(bad) == 0 {
		fmt.Fprintf(os.Stderr, "e2e: the controllers' requests, each passed by the ambassador: %s\n", path)
		return 0
	}
	fmt.Fprintf(os.Stderr, "--- FAIL: the ambassador's paths against the requests the controllers sent\n    %s\n%s(written to %s)\n",
		strings.Join(bad, "\n    "), record.String(), path)
	return 1
}

// unusedBranches are the branches of the builds' --accept-paths that no
// pattern of used takes and unexercisedBranches does not list, and the
// entries of unexercisedBranches that are taken or no branch at all.
func unusedBranches(used []string) []string {
	var bad []string
	taken := map[string]bool{}    // each branch of either build: whether a request took it
	reported := map[string]bool{} // a branch of both builds is reported once
	for _, build := range []string{namespacedBuild, clusterWideBuild} {
		f, err := buildFilters(build)
		if err != nil {
			return []string{err.Error()}
		}
		for _, re := range f.accept {
			all, err := manifests.UnusedBranches(re.String(), nil)
			if err != nil {
				return []string{fmt.Sprintf("%s: --accept-paths %s: %v", build, re, err)}
			}
			unused, _ := manifests.UnusedBranches(re.String(), used)
			for _, b := range all {
				taken[b] = taken[b] || !slices.Contains(unused, b)
			}
			for _, b := range unused {
				if _, ok := unexercisedBranches[b]; !ok && !reported[b] {
					reported[b] = true
					bad = append(bad, fmt.Sprintf("%s: --accept-paths %s passes %s, which no request of the suite took", build, re, b))
				}
			}
		}
	}
	for b := range unexercisedBranches {
		switch t, ok := taken[b]; {
		case !ok:
			bad = append(bad, fmt.Sprintf("unexercisedBranches lists %s, which is no branch of the ambassador's paths", b))
		case t:
			bad = append(bad, fmt.Sprintf("unexercisedBranches lists %s, which the suite took: remove it", b))
		}
	}
	return bad
}

// sent reports whether test t's controllers sent a request of method on the
// path of pattern (pathPattern's form).
func sent(t *testing.T, method, pattern string) bool {
	requestLog.Lock()
	defer requestLog.Unlock()
	top, _, _ := strings.Cut(t.Name(), "/")
	for k, u := range requestLog.m {
		if k.method == method && k.pattern == pattern && slices.Contains(u.tests, top) {
			return true
		}
	}
	return false
}

// TestPathPatternNamesNamespacesAndObjects ensures the recorded paths name
// a namespace and an object the way the ambassador's patterns do, and keep
// groups, versions, resources and subresources.
func TestPathPatternNamesNamespacesAndObjects(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1":                       "/api/v1",
		"/apis/apps/v1":                 "/apis/apps/v1",
		"/api/v1/configmaps":            "/api/v1/configmaps",
		"/api/v1/namespaces":            "/api/v1/namespaces",
		"/api/v1/namespaces/e2e-x/pods": "/api/v1/namespaces/{namespace}/pods",
		"/api/v1/namespaces/e2e-x/pods/webapp-1/eviction":                     "/api/v1/namespaces/{namespace}/pods/{name}/eviction",
		"/apis/apps/v1/namespaces/e2e-x/replicasets/w/scale":                  "/apis/apps/v1/namespaces/{namespace}/replicasets/{name}/scale",
		"/apis/coordination.k8s.io/v1/namespaces/e2e-x/leases/config-watcher": "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
		"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":              "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
		"/version": "/version",
	} {
		if got := pathPattern(path); got != want {
			t.Errorf("pathPattern(%q) = %q, want %q", path, got, want)
		}
	}
}
