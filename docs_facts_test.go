package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shipped docs say what is true of the release a user runs. Two mistakes crept in
// whenever a change was written down by the person who measured it: a figure copied out of
// a bench run into a second doc (where the next run no longer updates it), and a lab
// notebook's commit hashes and dates. A reviewer misses both; a test does not. The rule
// is mechanical on purpose: a figure has a unit, a commit is a hex word, a date is ISO.

// shippedDocs are the files a user reads. BENCHMARKS.md is the one source of figures.
func shippedDocs(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "RELIABILITY.md", "BENCHMARKS.md", "Dockerfile"}
	for _, glob := range []string{"docs/*.md", "manifests/*.yaml", "manifests/*/*.yaml"} {
		m, err := filepath.Glob(glob)
		require.NoError(t, err)
		files = append(files, m...)
	}
	return files
}

var (
	// A commit: a hex word of 7 to 40 characters with a digit and a letter in it. A path
	// (fuzz corpus files are named by a hash) or a sha256: digest is not a commit.
	hexWord = regexp.MustCompile(`(^|[^/:0-9a-zA-Z_.-])([0-9a-f]{7,40})\b`)
	isoDate = regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`)
	// A measured figure: a number with a unit of size or of time below a second, or a
	// ratio ("0.31×"; "40 × 900 KB", spaced, multiplies).
	figure = regexp.MustCompile(`\b[0-9][0-9,]*(\.[0-9]+)?( ?(ms|µs|MiB|KiB|GiB|MB|KB|B per pod|B/pod)|×)`)
)

// notCommits are hex words the docs use as examples, not as commits.
var notCommits = map[string]string{
	"7466656dc8":   "a pod-template-hash value, in the selector refusals' example",
	"0123456789ab": "the short data digest shown in an Event's example",
}

// inputs are sizes and durations the product, its manifests, the bench or a test sets:
// limits, settings and injected faults, not measurements, so BENCHMARKS.md need not hold them.
var inputs = map[string]string{
	"1 MiB":   "the API server's limit on an object (etcd's request size)",
	"256 KiB": "the annotation size limit the controller enforces",
	"16 KiB":  "the cap on the restarted-for-keys annotation (maxKeyDigestsText)",
	"64 MiB":  "the manifests' memory limit",
	"16 MiB":  "apiclient's maxResponseBytes, the largest answer read",
	"900 KB":  "the size of the bench's and the memory test's large ConfigMaps",
	"1 KiB":   "the size of the bench's small ConfigMaps",
	"180 MB":  "the largest amount of ConfigMap data the memory bench stores",
	"100 ms":  "a setting's example",
	"10 ms":   "a setting's example",
	"150 ms":  "the latency TestFaultProxyChaos injects",
	"20 ms":   "the latency TestInterruptedFaultsRestartNothingTwice injects",
	"30 ms":   "how far apart TestSettleRestartsEachPodOnceForChangesTogether changes its objects",
	"100 KB":  "the size of a hostile selector in the bad-input tests",
	"10 KB":   "the size of a garbage record in the bad-input tests",
	"4 MiB":   "the RSS growth make soak allows beyond 50 %",
}

func TestShippedDocsNameNoCommitOrDate(t *testing.T) {
	for _, f := range shippedDocs(t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range hexWord.FindAllStringSubmatch(line, -1) {
				w := m[2]
				if _, ok := notCommits[w]; ok || !strings.ContainsAny(w, "0123456789") || !strings.ContainsAny(w, "abcdef") {
					continue
				}
				assert.Failf(t, "a commit hash in a shipped doc", "%s:%d: %q: a doc says what is true of the release, not which commit was measured (the campaign's commit is in bench/results/campaign.txt)", f, i+1, w)
			}
			for _, d := range isoDate.FindAllString(line, -1) {
				assert.Failf(t, "a date in a shipped doc", "%s:%d: %q: a release's date belongs to its tag", f, i+1, d)
			}
		}
	}
}

func TestFiguresOutsideBenchmarksAreInIt(t *testing.T) {
	bench, err := os.ReadFile("BENCHMARKS.md")
	require.NoError(t, err)
	inBench := map[string]bool{}
	for _, fig := range figure.FindAllString(string(bench), -1) {
		inBench[normaliseFigure(fig)] = true
	}
	for _, f := range shippedDocs(t) {
		if f == "BENCHMARKS.md" || !strings.HasSuffix(f, ".md") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			for _, fig := range figure.FindAllString(line, -1) {
				fig = normaliseFigure(fig)
				if _, ok := inputs[fig]; ok || inBench[fig] {
					continue
				}
				assert.Failf(t, "a figure that BENCHMARKS.md does not hold", "%s:%d: %q: link to BENCHMARKS.md instead, or put the figure there with the command that makes it", f, i+1, fig)
			}
		}
	}
}

// normaliseFigure writes "12.3MiB" and "12.3 MiB" alike.
func normaliseFigure(s string) string {
	n := strings.TrimRight(s, "abcdefghijklmnopqrstuvwxyzKMGBµ/ ")
	if unit := strings.TrimSpace(strings.TrimPrefix(s, n)); unit != "" {
		return n + " " + unit
	}
	return s
}

// TestDocGuardsCatchWhatTheyAreFor keeps the two guards above from passing vacuously.
func TestDocGuardsCatchWhatTheyAreFor(t *testing.T) {
	commits := func(line string) (ws []string) {
		for _, m := range hexWord.FindAllStringSubmatch(line, -1) {
			ws = append(ws, m[2])
		}
		return ws
	}
	assert.Equal(t, []string{"a449331"}, commits("measured at `a449331` against main"))
	assert.Empty(t, commits("selector/testdata/fuzz/FuzzParse/7c381ca7fd7b75df"))
	assert.Empty(t, commits("image@sha256:0123456789abcdef0123456789abcdef"))
	assert.Equal(t, []string{"2026-12-03"}, isoDate.FindAllString("ran on 2026-12-03 at noon", -1))

	var figs []string
	for _, f := range figure.FindAllString("13.3 MiB at 5,000 ConfigMaps, 7.5 ms, 0.31× the informer, 40 × 900 KB, 500 B per pod, 12MiB", -1) {
		figs = append(figs, normaliseFigure(f))
	}
	assert.Equal(t, []string{"13.3 MiB", "7.5 ms", "0.31×", "900 KB", "500 B per pod", "12 MiB"}, figs)
}
