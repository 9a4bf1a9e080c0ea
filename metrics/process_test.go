package metrics

import (
	"net/http/httptest"
	"os"
	"runtime"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scrape returns what r exports, as series -> value.
func scrape(t *testing.T, r *Registry) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return parse(t, rec.Body.String())
}

// TestProcessSeriesReadProc ensures the process_* series are read from
// /proc as client_golang reads them: CPU ticks at 100 per second, RSS in
// pages, the start from the boot time, a command name with spaces and
// parentheses.
func TestProcessSeriesReadProc(t *testing.T) {
	// Fields 14, 15 (utime, stime: 150 + 50 ticks), 22 (starttime: 12345
	// ticks after boot), 23 (vsize), 24 (rss: 10 pages).
	stat := "4242 (config (watch) er) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 50 0 0 20 0 9 0 12345 734003200 10 18446744073709551615\n"
	root := fstest.MapFS{
		"proc/self/stat":   {Data: []byte(stat)},
		"proc/stat":        {Data: []byte("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")},
		"proc/self/limits": {Data: []byte("Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n")},
		"proc/self/fd/0":   {}, "proc/self/fd/1": {}, "proc/self/fd/2": {},
	}
	r := NewRegistry()
	r.RegisterProcess(root)
	assert.Equal(t, map[string]float64{
		"process_cpu_seconds_total":     2,
		"process_open_fds":              3,
		"process_max_fds":               1024,
		"process_virtual_memory_bytes":  734003200,
		"process_resident_memory_bytes": float64(10 * os.Getpagesize()),
		"process_start_time_seconds":    1700000000 + 123.45,
	}, scrape(t, r))
}

// TestProcessSeriesWithoutProcAreDeclaredOnly ensures a system without a
// procfs (or a stat line cut short) exports the families without samples,
// rather than zeros a dashboard would believe.
func TestProcessSeriesWithoutProcAreDeclaredOnly(t *testing.T) {
	for name, root := range map[string]fstest.MapFS{
		"NoProc":    {},
		"StatShort": {"proc/self/stat": {Data: []byte("4242 (cw) S 1 4242")}, "proc/stat": {Data: []byte("btime 1700000000\n")}},
	} {
		t.Run(name, func(t *testing.T) {
			r := NewRegistry()
			r.RegisterProcess(root)
			got := scrape(t, r)
			for _, series := range []string{"process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds", "process_virtual_memory_bytes"} {
				assert.NotContains(t, got, series)
			}
		})
	}
}

// TestProcessSeriesOfThisProcess ensures the series read the real procfs of
// the process running the test, where there is one.
func TestProcessSeriesOfThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no procfs")
	}
	r := NewRegistry()
	r.RegisterProcess(os.DirFS("/"))
	got := scrape(t, r)
	assert.Positive(t, got["process_resident_memory_bytes"])
	assert.Positive(t, got["process_open_fds"])
	assert.Positive(t, got["process_start_time_seconds"])
}

// TestGoRuntimeSeries ensures the go_* series are exported with values the
// runtime has: goroutines running, a heap in use, the Go version.
func TestGoRuntimeSeries(t *testing.T) {
	r := NewRegistry()
	r.RegisterGoRuntime()
	got := scrape(t, r)
	require.Contains(t, got, `go_info{version="`+runtime.Version()+`"}`)
	assert.Positive(t, got["go_goroutines"])
	assert.Positive(t, got["go_memstats_heap_inuse_bytes"])
	assert.GreaterOrEqual(t, got["go_memstats_heap_inuse_bytes"], got["go_memstats_heap_alloc_bytes"])
	assert.Positive(t, got["go_memstats_alloc_bytes_total"])
	assert.Positive(t, got["go_sched_gomaxprocs_threads"])
	for _, s := range goSeries {
		assert.Contains(t, got, s.name, "every runtime/metrics value exists in this Go")
	}
}
