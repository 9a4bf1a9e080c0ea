package metrics

import (
	"math"
	"runtime"
	rm "runtime/metrics"
)

// RegisterGoRuntime registers the go_* series of client_golang's Go
// collector that matter to a small controller, same names and meanings,
// read from runtime/metrics at each scrape as client_golang does since
// v1.12: go_info, goroutines and threads, the heap (go_memstats_…), the
// garbage collector's settings (GOGC, GOMEMLIMIT) and GOMAXPROCS.
func (r *Registry) RegisterGoRuntime() {
	r.NewInfo("go_info", "Information about the Go environment.", map[string]string{"version": runtime.Version()})
	r.NewGaugeFunc("go_goroutines", "Number of goroutines that currently exist.", func() (float64, bool) {
		return float64(runtime.NumGoroutine()), true
	})
	r.NewGaugeFunc("go_threads", "Number of OS threads created.", func() (float64, bool) {
		n, _ := runtime.ThreadCreateProfile(nil)
		return float64(n), true
	})
	for _, s := range goSeries {
		register := r.NewGaugeFunc
		if s.counter {
			register = r.NewCounterFunc
		}
		register(s.name, s.help, func() (float64, bool) { return readSum(s.from...) })
	}
}

// goSeries are the go_* series that are a sum of runtime/metrics values,
// with client_golang's help texts.
var goSeries = []struct {
	name, help string
	counter    bool
	from       []string
}{
	{"go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes.", false,
		[]string{"/memory/classes/heap/objects:bytes"}},
	{"go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes.", true,
		[]string{"/gc/heap/allocs:bytes"}},
	{"go_memstats_sys_bytes", "Number of bytes obtained from system. Equals to /memory/classes/total:byte.", false,
		[]string{"/memory/classes/total:bytes"}},
	{"go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.", false,
		[]string{"/memory/classes/heap/objects:bytes"}},
	{"go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes", false,
		[]string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes"}},
	{"go_memstats_heap_idle_bytes", "Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", false,
		[]string{"/memory/classes/heap/released:bytes", "/memory/classes/heap/free:bytes"}},
	{"go_memstats_heap_released_bytes", "Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes.", false,
		[]string{"/memory/classes/heap/released:bytes"}},
	{"go_memstats_heap_objects", "Number of currently allocated objects. Equals to /gc/heap/objects:objects.", false,
		[]string{"/gc/heap/objects:objects"}},
	{"go_memstats_stack_inuse_bytes", "Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes.", false,
		[]string{"/memory/classes/heap/stacks:bytes"}},
	{"go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes.", false,
		[]string{"/gc/heap/goal:bytes"}},
	{"go_memstats_mallocs_total", "Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects.", true,
		[]string{"/gc/heap/allocs:objects", "/gc/heap/tiny/allocs:objects"}},
	{"go_memstats_frees_total", "Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects.", true,
		[]string{"/gc/heap/frees:objects", "/gc/heap/tiny/allocs:objects"}},
	{"go_gc_gogc_percent", "Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.", false,
		[]string{"/gc/gogc:percent"}},
	{"go_gc_gomemlimit_bytes", "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.", false,
		[]string{"/gc/gomemlimit:bytes"}},
	{"go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads.", false,
		[]string{"/sched/gomaxprocs:threads"}},
}

// readSum reads runtime/metrics values and adds them up; ok is false when
// this Go does not know one of them.
func readSum(names ...string) (float64, bool) {
	samples := make([]rm.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	rm.Read(samples)
	var sum float64
	for _, s := range samples {
		switch s.Value.Kind() {
		case rm.KindUint64:
			sum += float64(s.Value.Uint64())
		case rm.KindFloat64:
			sum += s.Value.Float64()
		default:
			return math.NaN(), false
		}
	}
	return sum, true
}
