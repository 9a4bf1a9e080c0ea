package metrics

import (
	"bufio"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parse reads an exposition back into series name{labels} -> value, failing
// on any line that is not a comment or a well-formed sample.
func parse(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, "sample line %q", line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, "sample line %q", line)
		out[line[:i]] = v
	}
	return out
}

// TestExpositionParsesBack ensures every kind of metric is written in a form
// a Prometheus parser reads back with the right values.
func TestExpositionParsesBack(t *testing.T) {
	r := NewRegistry()
	c := r.NewCounter("x_relists_total", "Relists.")
	cv := r.NewCounterVec("x_events_total", "Events.", "type", "ADDED", "MODIFIED")
	g := r.NewGauge("x_depth", "Depth.")
	r.NewInfo("x_build_info", "Build.", map[string]string{"version": `v1"\`})
	h := r.NewHistogram("x_latency_seconds", "Latency.", []float64{0.005, 1, 60})
	r.NewGaugeFunc("x_read", "Read at scrape.", func() (float64, bool) { return 7, true })
	r.NewCounterFunc("x_unreadable_total", "Not readable here.", func() (float64, bool) { return 0, false })
	c.Inc()
	c.Inc()
	cv.Inc("MODIFIED")
	cv.Inc("weird\"type\n")
	g.Set(2.5)
	for _, v := range []float64{0.001, 0.005, 0.5, 90} {
		h.Observe(v)
	}

	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	assert.Contains(t, rec.Header().Get("Content-Type"), "text/plain")
	got := parse(t, rec.Body.String())

	assert.Equal(t, map[string]float64{
		"x_relists_total":                      2,
		`x_events_total{type="ADDED"}`:         0,
		`x_events_total{type="MODIFIED"}`:      1,
		`x_events_total{type="weird\"type\n"}`: 1,
		"x_depth":                              2.5,
		`x_build_info{version="v1\"\\"}`:       1,
		`x_latency_seconds_bucket{le="0.005"}`: 2, // le is inclusive
		`x_latency_seconds_bucket{le="1"}`:     3,
		`x_latency_seconds_bucket{le="60"}`:    3,
		`x_latency_seconds_bucket{le="+Inf"}`:  4,
		"x_latency_seconds_sum":                90.506,
		"x_latency_seconds_count":              4,
		"x_read":                               7,
	}, got)
	body := rec.Body.String()
	assert.Contains(t, body, "# TYPE x_events_total counter\n")
	assert.Contains(t, body, "# TYPE x_depth gauge\n")
	assert.Contains(t, body, "# TYPE x_latency_seconds histogram\n")
	assert.Contains(t, body, "# TYPE x_unreadable_total counter\n", "a family that cannot be read here is still declared")
	assert.Equal(t, uint64(4), h.Count())
}

// TestHistogramRefusesBucketsThatDoNotAscend ensures a histogram's bounds
// ascend: cumulative buckets out of order would be read as garbage.
func TestHistogramRefusesBucketsThatDoNotAscend(t *testing.T) {
	for name, b := range map[string][]float64{"Descending": {1, 0.5}, "Repeated": {1, 1}} {
		t.Run(name, func(t *testing.T) {
			assert.Panics(t, func() { NewRegistry().NewHistogram("x_seconds", "X.", b) })
		})
	}
}
