package main

import (
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// headline is one ratio BENCHMARKS.md leads with, computed from a run's
// results dir; ok is false when the run did not measure it. The ratios
// against BENCH_BASE compare like with like only within one campaign, whose
// runs share a base (campaign.txt names it).
type headline struct {
	name string
	f    func(r runResults) (float64, bool)
}

// runResults is what one `make bench` run wrote.
type runResults struct {
	lat      map[string][]float64
	m        map[string]map[string]float64
	volume   map[string]float64   // controller -> peak RSS at start with the most 900 KB ConfigMaps in one namespace
	waves    map[string][]float64 // MAX_UNAVAILABLE -> rollout times (s)
	first    map[string][]float64 // MAX_UNAVAILABLE -> first restart in each rollout (ms)
	coalesce []*coalesceRow       // coalesce/coalesce.csv, if the run has one
}

// wavesRatio is the ratio of two rollout settings' medians of one figure.
func wavesRatio(fig func(runResults) map[string][]float64, a, b string) func(runResults) (float64, bool) {
	return func(r runResults) (float64, bool) {
		x, y := stats(fig(r)[a]), stats(fig(r)[b])
		return over(x.p50, y.p50, x.n > 0, y.n > 0)
	}
}

func rollouts(r runResults) map[string][]float64      { return r.waves }
func firstRestarts(r runResults) map[string][]float64 { return r.first }

func (r runResults) metric(c, key string) (float64, bool) { v, ok := r.m[c][key]; return v, ok }

// over divides two figures of a run, if both were measured.
func over(a, b float64, okA, okB bool) (float64, bool) {
	if !okA || !okB || b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return 0, false
	}
	return a / b, true
}

func p50Ratio(a, b string) func(runResults) (float64, bool) {
	return func(r runResults) (float64, bool) {
		x, y := stats(r.lat[a]), stats(r.lat[b])
		return over(x.p50, y.p50, x.n > 0, y.n > 0)
	}
}

func metricRatio(key, a, b string) func(runResults) (float64, bool) {
	return func(r runResults) (float64, bool) {
		x, okX := r.metric(a, key)
		y, okY := r.metric(b, key)
		return over(x, y, okX, okY)
	}
}

var headlines = []headline{
	{"reaction latency p50, cw / informer", p50Ratio("config-watcher", "informer")},
	{"reaction latency p50, cw / informer with a pod cache", p50Ratio("config-watcher", "informer-podcache")},
	{"reaction latency p50, cw / shell", p50Ratio("config-watcher", "shell")},
	{"reaction latency p50, cw / floor", p50Ratio("config-watcher", "floor")},
	{"reaction latency p50, cw / BENCH_BASE", p50Ratio("config-watcher", "config-watcher-base")},
	{"RSS after sync, 5,000 ConfigMaps, cw / informer", metricRatio("rss5k_rss", "config-watcher", "informer")},
	{"RSS after sync, 20,000 ConfigMaps, cw / informer", metricRatio("rss20k_rss", "config-watcher", "informer")},
	{"RSS growth per 1,000 ConfigMaps, cw / informer", func(r runResults) (float64, bool) {
		growth := func(c string) (float64, bool) {
			a, okA := r.metric(c, "rss5k_rss")
			b, okB := r.metric(c, "rss20k_rss")
			return b - a, okA && okB
		}
		x, okX := growth("config-watcher")
		y, okY := growth("informer")
		return over(x, y, okX, okY)
	}},
	{"RSS idle, cw / informer", metricRatio("idle_rss", "config-watcher", "informer")},
	{"start, 5,000 ConfigMaps, cw / informer", metricRatio("start5k", "config-watcher", "informer")},
	{"start, 20,000 ConfigMaps, cw / informer", metricRatio("start20k", "config-watcher", "informer")},
	{"start, 20,000 ConfigMaps, cw / informer reading JSON", metricRatio("start20k", "config-watcher", "informer-json")},
	{"burst of 500, to the last DELETE, cw / informer", metricRatio("burst_last_delete", "config-watcher", "informer")},
	{"burst of 500, to the last DELETE, cw / informer with a pod cache", metricRatio("burst_last_delete", "config-watcher", "informer-podcache")},
	{"burst of 500, to the last DELETE, cw / shell", metricRatio("burst_last_delete", "config-watcher", "shell")},
	{"burst of 500, to the last DELETE, cw / BENCH_BASE", metricRatio("burst_last_delete", "config-watcher", "config-watcher-base")},
	{"peak RSS, 180 MB of 900 KB ConfigMaps, cw / informer", func(r runResults) (float64, bool) {
		x, okX := r.volume["config-watcher"]
		y, okY := r.volume["informer"]
		return over(x, y, okX, okY)
	}},
	{"RSS after sync, 5,000 Secrets + 5,000 ConfigMaps, cw / informer", metricRatio("secrets_rss", "config-watcher", "informer")},
	{"waves: 100 pods rolled, median, 25% / 100%", wavesRatio(rollouts, "25%", "100%")},
	{"waves: 100 pods rolled, median, 25% / the Deployment's rolling update", wavesRatio(rollouts, "25%", deploymentRollout)},
	{"waves: first restart of 100 Ready pods, median, 25% / 100%", wavesRatio(firstRestarts, "25%", "100%")},
	{"restarts per pod, overlapping, cw SETTLE=1s / informer", coalesceRatio("overlapping", "config-watcher SETTLE=1s", "informer")},
	{"restarts per pod, overlapping, cw SETTLE=0s / informer", coalesceRatio("overlapping", "config-watcher SETTLE=0s", "informer")},
	{"restarts per pod, storm, cw / informer", coalesceRatio("storm", "config-watcher", "informer")},
}

// deploymentRollout is the reference row's setting in rollout.csv (bench/waves.sh).
const deploymentRollout = "Deployment rolling update (maxSurge 0 maxUnavailable 25%)"

// cmdSpread prints each headline ratio of several runs and its spread, so
// that a figure is read with the noise of the machine next to it.
func cmdSpread(args []string) error {
	fs := flag.NewFlagSet("spread", flag.ExitOnError)
	dirs := fs.String("dirs", "", "results dirs of the runs, comma-separated")
	_ = fs.Parse(args)
	var runs []runResults
	for _, d := range strings.Split(*dirs, ",") {
		r, err := loadResults(d)
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		runs = append(runs, r)
	}
	head, rule := "| ratio", "|---"
	for i := range runs {
		head += fmt.Sprintf(" | run %d", i+1)
		rule += "|---"
	}
	fmt.Println(head + " | spread (min–max) |")
	fmt.Println(rule + "|---|")
	for _, h := range headlines {
		line := "| " + h.name
		var seen []float64
		for _, r := range runs {
			v, ok := h.f(r)
			if !ok {
				line += " | n/a"
				continue
			}
			seen = append(seen, v)
			line += fmt.Sprintf(" | %.2f×", v)
		}
		spread := "n/a"
		if len(seen) > 0 {
			spread = fmt.Sprintf("%.2f–%.2f×", slices.Min(seen), slices.Max(seen))
		}
		fmt.Println(line + " | " + spread + " |")
	}
	return nil
}

// loadResults reads what spread needs of a run: loadRun's figures, the volume
// rows of memory.csv, the waves rollouts and the coalescing rows (bench/coalesce.sh;
// a run without them shows n/a).
func loadResults(dir string) (runResults, error) {
	lat, m, _, err := loadRun(dir)
	if err != nil {
		return runResults{}, err
	}
	r := runResults{lat: lat, m: m, volume: map[string]float64{}, waves: map[string][]float64{}, first: map[string][]float64{}}
	// controller,namespace,configmaps,data_mb,start_hwm_mib,steady_rss_mib,relist_hwm_mib
	rows, err := readCSV(filepath.Join(dir, "memory.csv"))
	if err != nil {
		return runResults{}, err
	}
	most := map[string]float64{}
	for _, row := range rows {
		if len(row) < 5 || row[1] == "*" {
			continue
		}
		n, err1 := strconv.ParseFloat(row[2], 64)
		hwm, err2 := strconv.ParseFloat(row[4], 64)
		if err1 != nil || err2 != nil {
			return runResults{}, fmt.Errorf("memory.csv: row %v", row)
		}
		if n >= most[row[0]] {
			most[row[0]], r.volume[row[0]] = n, hwm
		}
	}
	// setting,run,replicas,rollout_s,first_restart_ms,min_ready,deleted,refused
	rows, err = readCSV(filepath.Join(dir, "waves", "rollout.csv"))
	if err != nil {
		return runResults{}, err
	}
	for _, row := range rows {
		if len(row) < 5 {
			continue
		}
		s, err1 := strconv.ParseFloat(row[3], 64)
		ms, err2 := strconv.ParseFloat(row[4], 64)
		if err1 != nil || err2 != nil {
			return runResults{}, fmt.Errorf("waves/rollout.csv: row %v", row)
		}
		r.waves[row[0]] = append(r.waves[row[0]], s)
		r.first[row[0]] = append(r.first[row[0]], ms)
	}
	r.coalesce, err = loadCoalesce(dir)
	return r, err
}
