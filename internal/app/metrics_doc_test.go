package app

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMetricsDoc ensures the metrics tables of docs/operations.md list every
// series the controller exports, with its labels, and nothing else. It runs
// the program with every optional part that adds series (the pod index, the
// Secret watch, the Namespace watch of WATCH_NAMESPACE=*) and reads /metrics.
func TestMetricsDoc(t *testing.T) {
	exported := exportedMetrics(t)
	for _, name := range []string{"config_watcher_secret_events_total", "config_watcher_pod_index_events_total", "config_watcher_namespace_events_total", "config_watcher_change_to_record_seconds", "process_resident_memory_bytes", "go_goroutines"} {
		require.Contains(t, exported, name, "precondition: the program exports every optional series")
	}
	assert.Equal(t, documentedMetrics(t), exported)
}

// exportedMetrics returns each family /metrics declares, with the sorted
// names of its samples' labels (le of a histogram's buckets aside).
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	api := httptest.NewServer(http.NotFoundHandler()) // lists fail; the series exist all the same
	defer api.Close()
	key := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="), 0o600))
	addr, _ := runWith(t, map[string]string{"API_URL": api.URL, "WATCH_NAMESPACE": "*",
		"WATCH_SECRETS": "true", "DIGEST_KEY_FILE": key, "POD_INDEX": "true", "RESTART_STRATEGY": "delete"})
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()

	families := map[string][]string{}
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			families[strings.Fields(f)[0]] = nil
			continue
		}
		m := sample.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name := m[1]
		if _, ok := families[name]; !ok { // a histogram's _bucket, _sum, _count
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				name = strings.TrimSuffix(name, suffix)
			}
		}
		for _, l := range label.FindAllStringSubmatch(m[2], -1) {
			if l[1] != "le" && !slices.Contains(families[name], l[1]) {
				families[name] = append(families[name], l[1])
			}
		}
	}
	require.NoError(t, sc.Err())
	for name := range families {
		slices.Sort(families[name])
	}
	return families
}

// documentedMetrics returns each metric the first cells of the tables under
// "### Metrics" in docs/operations.md name, with its labels:
// `name{a,b}`, several in a cell.
func documentedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "\n### Metrics\n")
	require.True(t, ok, "docs/operations.md has no section ### Metrics")
	section, _, _ = strings.Cut(section, "\n#")
	families := map[string][]string{}
	name := regexp.MustCompile("`([a-z_:][a-z0-9_:]*)(?:\\{([a-z_,]*)\\})?`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			var labels []string
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
				slices.Sort(labels)
			}
			families[m[1]] = labels
		}
	}
	return families
}
