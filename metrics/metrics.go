// Package metrics is a small Prometheus text-format registry: counters,
// labelled counters and gauges, written by hand to keep the binary free of
// the client library.
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
		fmt.Fprintf(w, "%s %s\n", name, strconv.FormatFloat(math.Float64frombits(g.bits.Load()), 'g', -1, 64))
	})
	return g
}

// Set replaces the value.
func (g *Gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

// Value returns the current value.
func (g *Gauge) Value() float64 { return math.Float64frombits(g.bits.Load()) }

// NewInfo registers a gauge fixed at 1 carrying constant labels, the
// Prometheus convention for build information.
func (r *Registry) NewInfo(name, help string, labels map[string]string) {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+`="`+labelEscaper.Replace(labels[k])+`"`)
	}
	r.add(name, help, "gauge", func(w io.Writer) { fmt.Fprintf(w, "%s{%s} 1\n", name, strings.Join(parts, ",")) })
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
