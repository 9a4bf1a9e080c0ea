package sim

import (
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// bounded: the same seed run at 1x and 10x the workload's length leaves
// the controller's tables and the bubble's goroutines the same size at
// quiescence, but for what the cluster itself grew by.

// quiescence is what a run left at its quiescence, before the graceful
// stop: the controller's table sizes, the goroutines, and the size of the
// cluster that bounds them, by what the tables are keyed by.
type quiescence struct {
	sizes      map[string]int
	goroutines int
	cluster    map[string]int
}

// keyedBy names what each table of policy.Controller.Sizes holds one entry
// per (a table it lacks is held to its size at 1x: the owners' caches hold
// the owners of rounds in progress, which the cluster does not show).
var keyedBy = map[string]string{
	"entries": "objects", "states": "objects", "annotated": "namespaces", "retries": "objects",
	"queue": "objects", "halted": "objects", "storms": "objects", "scopes": "namespaces", "budgets": "namespaces",
	"markers": "namespaces", "in flight": "pods", "owner rounds": "objects",
	// One per deletion, a name deleted twice twice, up to maxTombstones
	// (policy/observe.go).
	"tombstones": "deletions",
}

// noteQuiescence reads the running controller's tables and the goroutines.
func (w *world) noteQuiescence() {
	q := &quiescence{goroutines: runtime.NumGoroutine(), cluster: w.clusterSize()}
	if w.proc != nil && w.proc.wiring.Sizes != nil {
		q.sizes = w.proc.wiring.Sizes()
	}
	w.quiescent = q
	w.logf("truth: quiescence: tables %v, %d goroutines, cluster %v", q.sizes, q.goroutines, q.cluster)
}

// clusterSize counts what the controller may keep an entry for: data and
// state objects, namespaces, owners with pods, and pods.
func (w *world) clusterSize() map[string]int {
	n := map[string]int{}
	for k := range w.api.objects {
		switch k.res {
		case "configmaps", "secrets":
			n["objects"]++
		case "namespaces", "pods":
			n[k.res]++
		}
	}
	n["deletions"] = w.deletedObjects
	for _, wl := range w.wls {
		if len(wl.live()) > 0 {
			n["owners"]++
		}
	}
	return n
}

// unbounded compares a run at 1x with the same seed at 10x: what grew by
// more than what it is keyed by did.
func unbounded(short, long *quiescence) []string {
	if short == nil || long == nil || short.sizes == nil || long.sizes == nil {
		return []string{"no quiescence noted (no controller ran at the end)"}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(long.sizes)) {
		// As large as at 1x plus what it is keyed by grew by, or as large
		// as what it is keyed by.
		slack := max(0, long.cluster[keyedBy[k]]-short.cluster[keyedBy[k]])
		if long.sizes[k] > max(short.sizes[k]+slack, long.cluster[keyedBy[k]]) {
			out = append(out, fmt.Sprintf("%s: %d at 1x, %d at 10x (what it is keyed by grew by %d)", k, short.sizes[k], long.sizes[k], slack))
		}
	}
	// A goroutine per watch (namespace, kind) and per round in progress.
	slack := max(0, long.cluster["namespaces"]-short.cluster["namespaces"]) * 4
	if long.goroutines > short.goroutines+slack {
		out = append(out, fmt.Sprintf("goroutines: %d at 1x, %d at 10x", short.goroutines, long.goroutines))
	}
	return out
}

// boundedSeeds run at 1x and 10x in `go test ./sim`; SIM_BOUNDED=a-b runs
// others (make sim BOUNDED=a-b).
var boundedSeeds = []uint64{13, 14}

// TestSimulationBounded ensures a seed run 10 times as long leaves the
// controller's tables and goroutines no larger than the cluster explains.
func TestSimulationBounded(t *testing.T) {
	seeds := boundedSeeds
	if s := os.Getenv("SIM_BOUNDED"); s != "" {
		seeds = nil
		a, b, _ := strings.Cut(s, "-")
		from, _ := strconv.ParseUint(a, 10, 64)
		to, _ := strconv.ParseUint(b, 10, 64)
		for seed := from; seed <= max(from, to); seed++ {
			seeds = append(seeds, seed)
		}
	}
	var broken []uint64
	for _, seed := range seeds {
		short, long := simulateLength(t, seed, 1), simulateLength(t, seed, 10)
		grew := unbounded(short.quiescent, long.quiescent)
		for _, g := range grew {
			t.Errorf("seed %d: bounded: %s (replay: make sim SEED=%d LENGTH=10)", seed, g, seed)
		}
		if len(grew) > 0 {
			broken = append(broken, seed)
		}
		fmt.Printf("sim: bounded seed %d: %d at 1x, %d at 10x%s\n", seed, len(short.quiescent.sizes), len(long.quiescent.sizes), map[bool]string{true: " FAIL " + strings.Join(grew, "; ")}[len(grew) > 0])
	}
	if len(seeds) > 1 {
		fmt.Printf("sim: bounded broken in %d of %d seeds: %v\n", len(broken), len(seeds), broken)
	}
}
