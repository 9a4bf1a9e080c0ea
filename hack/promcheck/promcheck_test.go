package promcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var (
	repoRoot   = filepath.Join("..", "..")
	monitoring = filepath.Join(repoRoot, "manifests", "monitoring")
	promql     = parser.NewParser(parser.Options{})
)

// runbookBase is where every alert's runbook_url points: a section of
// docs/operations.md.
const runbookBase = "https://github.com/k8spatterns/config-watcher/blob/main/docs/operations.md#"

// targetLabels are the labels Prometheus gives every series of a target
// (job and instance, and the ServiceMonitor's namespace, pod, service,
// endpoint, container): a query may match them whatever the controller
// exports.
var targetLabels = []string{"namespace", "pod", "service", "endpoint", "container", "job", "instance"}

// series is one exported sample's labels, __name__ included.
type series = map[string]string

// exported runs the controller built from this repository with every
// optional part that adds series (the Secret watch, the pod index) and
// returns the series of its /metrics, read by Prometheus's own text parser.
var exported = sync.OnceValues(func() ([]series, error) {
	dir, err := os.MkdirTemp("", "promcheck-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "config-watcher")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="), 0o600); err != nil {
		return nil, err
	}
	api := httptest.NewServer(http.NotFoundHandler()) // its lists fail; its series exist all the same
	defer api.Close()
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "API_URL="+api.URL, "WATCH_NAMESPACE=ns", "HTTP_ADDR="+addr, "LOG_LEVEL=error",
		"WATCH_SECRETS=true", "DIGEST_KEY_FILE="+key, "POD_INDEX=true", "RESTART_STRATEGY=delete", "LEADER_ELECT=false")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()

	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err = http.Get("http://" + addr + "/metrics"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("/metrics does not parse as Prometheus text: %w", err)
	}
	var all []series
	for name, f := range families {
		for _, m := range f.GetMetric() {
			all = append(all, samples(name, f.GetType(), m)...)
		}
	}
	return all, nil
})

// samples are the series one metric of a family exports: a histogram's
// _bucket (one per le), _sum and _count.
func samples(name string, typ dto.MetricType, m *dto.Metric) []series {
	base := series{model.MetricNameLabel: name}
	for _, l := range m.GetLabel() {
		base[l.GetName()] = l.GetValue()
	}
	if typ != dto.MetricType_HISTOGRAM {
		return []series{base}
	}
	var out []series
	for _, suffix := range []string{"_sum", "_count"} {
		s := maps.Clone(base)
		s[model.MetricNameLabel] = name + suffix
		out = append(out, s)
	}
	bounds := []string{"+Inf"}
	for _, b := range m.GetHistogram().GetBucket() {
		bounds = append(bounds, strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
	}
	for _, le := range bounds {
		s := maps.Clone(base)
		s[model.MetricNameLabel], s["le"] = name+"_bucket", le
		out = append(out, s)
	}
	return out
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// checkQuery reports what in query names nothing the controller exports: a
// selector no exported series matches, a label none of them has, a value
// of it none has (each alternative of a regex of literals, "a|b").
func checkQuery(t *testing.T, query string) []string {
	t.Helper()
	all, err := exported()
	require.NoError(t, err)
	expr, err := promql.ParseExpr(query)
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	for _, matchers := range parser.ExtractSelectors(expr) {
		sel := fmt.Sprint(matchers)
		var names []*labels.Matcher
		for _, m := range matchers {
			if m.Name == model.MetricNameLabel {
				names = append(names, m)
			}
		}
		matched := slices.DeleteFunc(slices.Clone(all), func(s series) bool {
			return !slices.ContainsFunc(names, func(m *labels.Matcher) bool { return m.Matches(s[model.MetricNameLabel]) })
		})
		if len(names) == 0 || len(matched) == 0 {
			bad = append(bad, "selector "+sel+" names no series the controller exports")
			continue
		}
		for _, m := range matchers {
			if m.Name == model.MetricNameLabel || slices.Contains(targetLabels, m.Name) {
				continue
			}
			var values []string
			for _, s := range matched {
				if v, ok := s[m.Name]; ok {
					values = append(values, v)
				}
			}
			switch {
			case len(values) == 0:
				bad = append(bad, fmt.Sprintf("selector %s: no series it names has the label %s", sel, m.Name))
			case m.Type == labels.MatchEqual || m.Type == labels.MatchRegexp:
				for _, want := range literals(m) {
					if !slices.Contains(values, want) {
						bad = append(bad, fmt.Sprintf("selector %s: no series has %s=%q (it has %v)", sel, m.Name, want, slices.Compact(slices.Sorted(slices.Values(values)))))
					}
				}
				if !slices.ContainsFunc(values, m.Matches) {
					bad = append(bad, fmt.Sprintf("selector %s: %s matches no value of the label (%v)", sel, m, values))
				}
			}
		}
	}
	return bad
}

// literals are the values an equality matcher, or a regex made only of
// literals and |, asks for; nil for other regexes.
func literals(m *labels.Matcher) []string {
	if m.Type == labels.MatchEqual {
		return []string{m.Value}
	}
	alts := strings.Split(m.Value, "|")
	for _, a := range alts {
		if regexp.QuoteMeta(a) != a {
			return nil
		}
	}
	return alts
}

// rules reads the PrometheusRule's groups with Prometheus's rule file
// parser, which also validates them (each expression, each label and
// annotation template).
func rules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(monitoring, "prometheusrule.yaml"))
	require.NoError(t, err)
	var cr struct {
		Kind string    `yaml:"kind"`
		Spec yaml.Node `yaml:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cr))
	require.Equal(t, "PrometheusRule", cr.Kind)
	spec, err := yaml.Marshal(&cr.Spec)
	require.NoError(t, err)
	groups, errs := rulefmt.Parse(spec, false, model.LegacyValidation, promql, slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "the PrometheusRule's groups are not a valid rule file")
	var out []rulefmt.Rule
	for _, g := range groups.Groups {
		out = append(out, g.Rules...)
	}
	require.NotEmpty(t, out)
	return out
}

// TestAlertsQueryWhatTheControllerExports ensures every alert's expression
// parses and names only series, labels and label values the controller
// exports.
func TestAlertsQueryWhatTheControllerExports(t *testing.T) {
	for _, r := range rules(t) {
		t.Run(r.Alert, func(t *testing.T) {
			require.NotEmpty(t, r.Alert, "a recording rule: this file holds alerts only")
			assert.Empty(t, checkQuery(t, r.Expr))
		})
	}
}

// TestAlertsHaveARunbook ensures every alert says how bad it is, what
// happened, and links to a section of docs/operations.md that exists.
func TestAlertsHaveARunbook(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, h := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[strings.ToLower(strings.ReplaceAll(strings.TrimSpace(h[1]), " ", "-"))] = true
	}
	for _, r := range rules(t) {
		t.Run(r.Alert, func(t *testing.T) {
			assert.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"])
			assert.NotEmpty(t, r.Annotations["summary"])
			assert.NotEmpty(t, r.Annotations["description"])
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookBase)
			require.True(t, ok, "runbook_url %q is not a section of docs/operations.md", r.Annotations["runbook_url"])
			assert.True(t, anchors[anchor], "docs/operations.md has no section #%s", anchor)
		})
	}
}

// TestDashboardQueriesWhatTheControllerExports ensures every panel of the
// Grafana dashboard queries the chosen data source for series the
// controller exports.
func TestDashboardQueriesWhatTheControllerExports(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(monitoring, "dashboard.json"))
	require.NoError(t, err)
	var dashboard struct{ Panels []panel }
	require.NoError(t, json.Unmarshal(raw, &dashboard))
	// Grafana's variables, as Grafana would fill them in.
	vars := strings.NewReplacer("$__rate_interval", "2m", "$namespace", "default")
	queries := 0
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			walk(p.Panels)
			for _, q := range p.Targets {
				queries++
				t.Run(p.Title+"/"+q.RefID, func(t *testing.T) {
					assert.Equal(t, "${datasource}", q.Datasource.UID, "the dashboard's data source variable")
					assert.Empty(t, checkQuery(t, vars.Replace(q.Expr)), q.Expr)
				})
			}
		}
	}
	walk(dashboard.Panels)
	assert.Greater(t, queries, 10)
}

// panel is the part of a Grafana panel the test reads; a row holds panels.
type panel struct {
	Title   string
	Panels  []panel
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string
		Datasource struct{ UID string }
	}
}

// TestQueriesAreChecked ensures the check reports the mistakes it is for,
// so that the tests above cannot pass for a check that sees nothing.
func TestQueriesAreChecked(t *testing.T) {
	for name, query := range map[string]string{
		"UnknownSeries":        `config_watcher_rounds_halt > 0`,
		"UnknownLabel":         `config_watcher_rounds_halted{result="x"} > 0`,
		"UnknownValue":         `increase(config_watcher_writes_refused_total{resource="pod"}[5m]) > 0`,
		"UnknownAlternative":   `increase(config_watcher_writes_refused_total{resource=~"pods|evictions"}[5m]) > 0`,
		"RegexMatchingNothing": `increase(config_watcher_writes_refused_total{resource=~"secret.*"}[5m]) > 0`,
		"HistogramOfACounter":  `histogram_quantile(0.9, rate(config_watcher_reconciles_total_bucket[5m]))`,
		"Syntax":               `sum by (namespace (config_watcher_leader)`,
	} {
		t.Run(name, func(t *testing.T) { assert.NotEmpty(t, checkQuery(t, query)) })
	}
	assert.Empty(t, checkQuery(t, `histogram_quantile(0.9, sum by (le) (rate(config_watcher_change_to_first_restart_seconds_bucket{namespace="a",le!="1"}[5m])))`))
}

// alertCases are, for each alert, series in which it must fire and series
// in which it must not, in promqltest's load syntax at one sample a minute
// (a+bxN: N+1 samples from a, b apart); each is judged at the 20th minute.
// The namespace and pod labels are those the ServiceMonitor adds.
var alertCases = map[string]struct{ fires, quiet string }{
	"ConfigWatcherRolloutHalted": {
		fires: `config_watcher_rounds_halted{namespace="a",pod="leader"} 0+0x10 1+0x10
		        config_watcher_rounds_halted{namespace="a",pod="standby"} 0+0x20`,
		quiet: `config_watcher_rounds_halted{namespace="a",pod="leader"} 0+0x20
		        config_watcher_rounds_halted{namespace="a",pod="standby"} 0+0x20`,
	},
	"ConfigWatcherChangeStorm": {
		fires: `config_watcher_objects_in_storm{namespace="a",pod="leader"} 0+0x5 1+0x15
		        config_watcher_objects_in_storm{namespace="a",pod="standby"} 0+0x20`,
		quiet: `config_watcher_objects_in_storm{namespace="a",pod="leader"} 0+0x20
		        config_watcher_objects_in_storm{namespace="a",pod="standby"} 0+0x20`,
	},
	"ConfigWatcherReplacementsNotReady": {
		fires: `config_watcher_replacements_not_ready_total{namespace="a",pod="leader"} 0+0x15 1+0x5`,
		quiet: `config_watcher_replacements_not_ready_total{namespace="a",pod="leader"} 0+0x20`,
	},
	"ConfigWatcherRestartsRefused": {
		fires: `config_watcher_writes_refused_total{namespace="a",pod="leader",resource="pods/eviction"} 0+0x15 2+0x5
		        config_watcher_writes_refused_total{namespace="a",pod="leader",resource="configmaps"} 0+0x20`,
		quiet: `config_watcher_writes_refused_total{namespace="a",pod="leader",resource="pods"} 0+0x20
		        config_watcher_writes_refused_total{namespace="a",pod="leader",resource="configmaps"} 0+0x15 2+0x5`,
	},
	"ConfigWatcherWritesRefused": {
		fires: `config_watcher_writes_refused_total{namespace="a",pod="leader",resource="configmaps"} 0+0x15 2+0x5
		        config_watcher_writes_refused_total{namespace="a",pod="leader",resource="pods"} 0+0x20`,
		quiet: `config_watcher_writes_refused_total{namespace="a",pod="leader",resource="configmaps"} 0+0x20
		        config_watcher_writes_refused_total{namespace="a",pod="leader",resource="pods"} 0+0x15 2+0x5`,
	},
	"ConfigWatcherStateUntrusted": {
		fires: `config_watcher_state_untrusted_total{namespace="a",pod="leader"} 0+0x15 1+0x5`,
		quiet: `config_watcher_state_untrusted_total{namespace="a",pod="leader"} 0+0x5 1+0x15`,
	},
	"ConfigWatcherWatchDown": { // the gauge holds the Unix time of the last event; the test's clock starts at 0
		fires: `config_watcher_last_event_timestamp_seconds{namespace="a",pod="leader"} 0+0x20`,
		quiet: `config_watcher_last_event_timestamp_seconds{namespace="a",pod="leader"} 0+60x20`,
	},
	"ConfigWatcherSecretWatchDown": {
		fires: `config_watcher_secret_last_event_timestamp_seconds{namespace="a",pod="leader"} 0+60x4 240+0x16`,
		quiet: `config_watcher_secret_last_event_timestamp_seconds{namespace="a",pod="leader"} 0+60x15 900+60x5`,
	},
	"ConfigWatcherNoLeader": {
		fires: `config_watcher_leader{namespace="a",pod="one"} 1+0x10 0+0x10
		        config_watcher_leader{namespace="a",pod="two"} 0+0x20`,
		quiet: `config_watcher_leader{namespace="a",pod="one"} 1+0x10 0+0x10
		        config_watcher_leader{namespace="a",pod="two"} 0+0x10 1+0x10`,
	},
	"ConfigWatcherInvalidSelector": {
		fires: `config_watcher_invalid_selectors_total{namespace="a",pod="leader"} 0+0x15 1+0x5`,
		quiet: `config_watcher_invalid_selectors_total{namespace="a",pod="leader"} 0+0x20`,
	},
}

// TestAlertsFireWhenTheyShould ensures each alert's expression returns a
// series in the situation it is for and none in the normal one (the
// expression alone: a rule's `for` is Prometheus's to apply).
func TestAlertsFireWhenTheyShould(t *testing.T) {
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 1e6)
	at := time.Unix(20*60, 0)
	var alerts []string
	for _, r := range rules(t) {
		alerts = append(alerts, r.Alert)
		c, ok := alertCases[r.Alert]
		require.True(t, ok, "alert %s has no case in alertCases", r.Alert)
		for want, load := range map[bool]string{true: c.fires, false: c.quiet} {
			t.Run(fmt.Sprintf("%s/fires=%v", r.Alert, want), func(t *testing.T) {
				storage := promqltest.LoadedStorage(t, "load 1m\n"+load)
				q, err := engine.NewInstantQuery(context.Background(), storage, nil, r.Expr, at)
				require.NoError(t, err)
				defer q.Close()
				res := q.Exec(context.Background())
				require.NoError(t, res.Err)
				v, err := res.Vector()
				require.NoError(t, err)
				assert.Equal(t, want, len(v) > 0, "%s at %s returned %v", r.Expr, at.UTC().Format(time.TimeOnly), v)
			})
		}
	}
	assert.ElementsMatch(t, alerts, slices.Collect(maps.Keys(alertCases)), "a case for an alert that does not exist")
}
