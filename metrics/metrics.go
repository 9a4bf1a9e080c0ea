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

// Registry holds metrics in registration order and writes them as text.
type Registry struct {
	mu      sync.Mutex
	metrics []writer
}

type writer interface {
	write(w io.Writer)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

func (r *Registry) add(m writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.metrics = append(r.metrics, m)
}

// Write writes every metric in the Prometheus text exposition format.
func (r *Registry) Write(w io.Writer) {
	r.mu.Lock()
	ms := slices.Clone(r.metrics)
	r.mu.Unlock()
	for _, m := range ms {
		m.write(w)
	}
}

// ServeHTTP serves the exposition, so a Registry is the /metrics handler.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	r.Write(w)
}

func header(w io.Writer, name, help, kind string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
}

// Counter only goes up.
type Counter struct {
	name, help string
	v          atomic.Uint64
}

// NewCounter registers a counter.
func (r *Registry) NewCounter(name, help string) *Counter {
	c := &Counter{name: name, help: help}
	r.add(c)
	return c
}

// Inc adds one.
func (c *Counter) Inc() { c.v.Add(1) }

// Value returns the current count.
func (c *Counter) Value() uint64 { return c.v.Load() }

func (c *Counter) write(w io.Writer) {
	header(w, c.name, c.help, "counter")
	fmt.Fprintf(w, "%s %d\n", c.name, c.v.Load())
}

// CounterVec is a family of counters told apart by one label.
type CounterVec struct {
	name, help, label string
	mu                sync.Mutex
	values            map[string]uint64
}

// NewCounterVec registers a labelled counter family. Values listed in
// initial are exported as 0 from the start, so rate() works from the first
// scrape.
func (r *Registry) NewCounterVec(name, help, label string, initial ...string) *CounterVec {
	c := &CounterVec{name: name, help: help, label: label, values: map[string]uint64{}}
	for _, v := range initial {
		c.values[v] = 0
	}
	r.add(c)
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

func (c *CounterVec) write(w io.Writer) {
	header(w, c.name, c.help, "counter")
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(c.values)) {
		fmt.Fprintf(w, "%s{%s=\"%s\"} %d\n", c.name, c.label, escapeLabel(k), c.values[k])
	}
}

// Gauge goes up and down.
type Gauge struct {
	name, help string
	labels     string // rendered constant labels, e.g. `{version="v1"}`
	bits       atomic.Uint64
}

// NewGauge registers a gauge.
func (r *Registry) NewGauge(name, help string) *Gauge {
	g := &Gauge{name: name, help: help}
	r.add(g)
	return g
}

// NewInfo registers a gauge fixed at 1 carrying constant labels, the
// Prometheus convention for build information.
func (r *Registry) NewInfo(name, help string, labels map[string]string) {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+`="`+escapeLabel(labels[k])+`"`)
	}
	g := &Gauge{name: name, help: help, labels: "{" + strings.Join(parts, ",") + "}"}
	g.Set(1)
	r.add(g)
}

// Set replaces the value.
func (g *Gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

// Value returns the current value.
func (g *Gauge) Value() float64 { return math.Float64frombits(g.bits.Load()) }

func (g *Gauge) write(w io.Writer) {
	header(w, g.name, g.help, "gauge")
	fmt.Fprintf(w, "%s%s %s\n", g.name, g.labels, strconv.FormatFloat(g.Value(), 'g', -1, 64))
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
