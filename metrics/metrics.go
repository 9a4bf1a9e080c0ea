// Package metrics is a small Prometheus text-format registry: counters,
// labelled counters, gauges and histograms, and the process_* and go_*
// series of the client library (process.go, goruntime.go), with its names
// and meanings, written by hand to keep the binary free of the library.
package metrics

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds metrics in registration order.
type Registry struct {
	mu     sync.Mutex
	writes []func(w io.Writer)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

// add registers a metric: its HELP and TYPE lines, then what write writes.
func (r *Registry) add(name, help, kind string, write func(w io.Writer)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, func(w io.Writer) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
		write(w)
	})
}

// ServeHTTP writes every metric in the Prometheus text exposition format, so
// a Registry is the /metrics handler.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	r.mu.Lock()
	writes := slices.Clone(r.writes)
	r.mu.Unlock()
	for _, write := range writes {
		write(w)
	}
}

// Counter only goes up.
type Counter struct{ v atomic.Uint64 }

// NewCounter registers a counter.
func (r *Registry) NewCounter(name, help string) *Counter {
	c := &Counter{}
	r.add(name, help, "counter", func(w io.Writer) { fmt.Fprintf(w, "%s %d\n", name, c.Value()) })
	return c
}

// Inc adds one.
func (c *Counter) Inc() { c.v.Add(1) }

// Value returns the current count.
func (c *Counter) Value() uint64 { return c.v.Load() }

// CounterVec is a family of counters told apart by one label.
type CounterVec struct {
	mu     sync.Mutex
	values map[string]uint64
}

// NewCounterVec registers a labelled counter family. Values listed in
// initial are exported as 0 from the start, so rate() works from the first
// scrape.
func (r *Registry) NewCounterVec(name, help, label string, initial ...string) *CounterVec {
	c := &CounterVec{values: map[string]uint64{}}
	for _, v := range initial {
		c.values[v] = 0
	}
	r.add(name, help, "counter", func(w io.Writer) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, k := range slices.Sorted(maps.Keys(c.values)) {
			fmt.Fprintf(w, "%s{%s=\"%s\"} %d\n", name, label, labelEscaper.Replace(k), c.values[k])
		}
	})
	return c
}

// Inc adds one to the counter with the given label value.
func (c *CounterVec) Inc(value string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.values[value]++
}

// Value returns the count for one label value.
func (c *CounterVec) Value(value string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.values[value]
}

// Gauge goes up and down.
type Gauge struct{ bits atomic.Uint64 }

// NewGauge registers a gauge.
func (r *Registry) NewGauge(name, help string) *Gauge {
	g := &Gauge{}
	r.add(name, help, "gauge", func(w io.Writer) {
		fmt.Fprintf(w, "%s %s\n", name, formatFloat(g.Value()))
	})
	return g
}

// Set replaces the value.
func (g *Gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

// Value returns the current value.
func (g *Gauge) Value() float64 { return math.Float64frombits(g.bits.Load()) }

// NewGaugeFunc registers a gauge whose value value reads at each scrape; a
// family whose value cannot be read (ok false) is written without a sample.
func (r *Registry) NewGaugeFunc(name, help string, value func() (v float64, ok bool)) {
	r.newFunc(name, help, "gauge", value)
}

// NewCounterFunc is NewGaugeFunc for a value that only goes up.
func (r *Registry) NewCounterFunc(name, help string, value func() (v float64, ok bool)) {
	r.newFunc(name, help, "counter", value)
}

func (r *Registry) newFunc(name, help, kind string, value func() (float64, bool)) {
	r.add(name, help, kind, func(w io.Writer) {
		if v, ok := value(); ok {
			fmt.Fprintf(w, "%s %s\n", name, formatFloat(v))
		}
	})
}

// Histogram counts observations in buckets, the Prometheus histogram: a
// cumulative count per upper bound (le), the sum and the count.
type Histogram struct {
	upper  []float64 // ascending; +Inf is implied
	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; the last is +Inf's
	sum    float64
}

// NewHistogram registers a histogram with the given bucket upper bounds,
// which must ascend (a fixed list in the code, not input).
func (r *Registry) NewHistogram(name, help string, buckets []float64) *Histogram {
	if !slices.IsSorted(buckets) || len(slices.Compact(slices.Clone(buckets))) != len(buckets) {
		panic(fmt.Sprintf("metrics: the buckets of %s do not ascend: %v", name, buckets))
	}
	h := &Histogram{upper: slices.Clone(buckets), counts: make([]uint64, len(buckets)+1)}
	r.add(name, help, "histogram", func(w io.Writer) {
		h.mu.Lock()
		counts, sum := slices.Clone(h.counts), h.sum
		h.mu.Unlock()
		var cumulative uint64
		for i, n := range counts {
			cumulative += n
			le := "+Inf"
			if i < len(h.upper) {
				le = formatFloat(h.upper[i])
			}
			fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", name, le, cumulative)
		}
		fmt.Fprintf(w, "%s_sum %s\n%s_count %d\n", name, formatFloat(sum), name, cumulative)
	})
	return h
}

// Observe adds one observation, v, to its bucket and to the sum.
func (h *Histogram) Observe(v float64) {
	i, _ := slices.BinarySearch(h.upper, v) // the first bound >= v: le is inclusive
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[i]++
	h.sum += v
}

// Count returns how many observations there were.
func (h *Histogram) Count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n uint64
	for _, c := range h.counts {
		n += c
	}
	return n
}

// NewInfo registers a gauge fixed at 1 carrying constant labels, the
// Prometheus convention for build information.
func (r *Registry) NewInfo(name, help string, labels map[string]string) {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+`="`+labelEscaper.Replace(labels[k])+`"`)
	}
	r.add(name, help, "gauge", func(w io.Writer) { fmt.Fprintf(w, "%s{%s} 1\n", name, strings.Join(parts, ",")) })
}

// formatFloat writes a sample value or bound as Prometheus's own clients do.
func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
