package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/jitter"
)

// ciSeeds run in `go test ./sim` (and so in `make unit`): few, as the race
// detector makes each one slow.
var ciSeeds = []uint64{12, 13, 14, 15, 17, 18, 20, 21, 23, 28, 29}

// knownBugSeeds fail on this code, named here by the invariant they break
// and, once read, by the product mechanism (its family); they leave the CI
// set until it is fixed. "k/10": failed in k of 10 replays. Any change to
// what the generator draws (a new kind of event) moves every seed: the list
// is then made again from a `make sim SEEDS=1-300` run (this one from the
// failures of seeds 1-10000 once the simulator drew a loaded machine, fast
// owners and an overloaded server, read one by one).
var knownBugSeeds = map[uint64]string{
	1425: "budget: a change waiting for its round counts in other rounds' budgets through a round otherRounds builds afresh each wave, with no memory of the pods that left: a DaemonSet pod deleted by others drops out of its expected count at once, not after leftAfter, and another object's wave restarts a pod both select (the namespace opted out and in, the resumed round of another object first)",
	1443: "converge: a change held back by a storm's gate leaves pods created meanwhile on the data in between; the next round narrows keys against the record R (keys.go narrow), so a key changed and set back to R's value restarts none of them",
	2867: "once: a change seen with no round in progress and a worker free sends no mark (mark.go noteSeen); its round's first wave is held up (a loaded machine), and pods created meanwhile (a scale-up) are taken",
	3595: "once: a round whose first wave lists its pods while the pod index relists after a 410 applies no cutoff (takeCutoff with x == nil), though the index saw the pod created after the change's answered mark",
	4995: "once: the family of 2867 (no mark, a late first wave)",
	8154: "budget: restarts beyond MAX_CONCURRENT_RESTARTS wait for a slot and are then sent on the count that chose them, without the budget of another object whose change was seen meanwhile",
}

// result is what one run left.
type result struct {
	seed      uint64
	checks    checks
	trace     []string
	logs      []string
	requests  int
	virtual   time.Duration
	quiescent *quiescence
}

// simulate runs seed in its own bubble.
func simulate(t *testing.T, seed uint64) result { return simulateLength(t, seed, simLength()) }

// simLength is the workload's length, SIM_LENGTH times the usual.
func simLength() int { return max(1, atoi(os.Getenv("SIM_LENGTH"))) }

// simulateLength runs seed in its own bubble, its workload length times
// the usual.
func simulateLength(t *testing.T, seed uint64, length int) result {
	var res result
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(seed)
		w.quietGets = os.Getenv("SIM_DEBUG") == ""
		w.length = length
		w.run()
		res = result{seed: seed, checks: w.checks, trace: w.trace, virtual: w.now(), quiescent: w.quiescent}
		for _, p := range w.procs {
			res.logs = append(res.logs, fmt.Sprintf("--- controller %d ---\n%s", p.gen, p.logs.String()))
			if p.stalls != nil {
				res.logs = append(res.logs, fmt.Sprintf("--- controller %d: waves held up ---\n%s", p.gen, p.stalls))
			}
		}
	})
	return res
}

// signature is what must come out the same when a seed is replayed.
func (r result) signature() string {
	var s []string
	for _, v := range r.checks.violations {
		s = append(s, v.String())
	}
	return strings.Join(s, "\n")
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sim")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// A seed replays the same run: no random spreads, and one thread, so
	// that goroutines woken together run in the order they were woken.
	jitter.Off()
	runtime.GOMAXPROCS(1)
	digestKeyFile = filepath.Join(dir, "key")
	if err := os.WriteFile(digestKeyFile, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// report fails t with a run's violations, its trace and the controllers'
// logs (all of them with full, else the last lines).
func report(t *testing.T, r result, full bool) {
	t.Helper()
	trace, logs := r.trace, strings.Join(r.logs, "\n")
	if !full && len(trace) > 300 {
		trace = trace[len(trace)-300:]
	}
	if full || len(r.checks.violations) > 0 {
		t.Logf("seed %d trace:\n%s", r.seed, strings.Join(trace, "\n"))
	}
	if full {
		t.Logf("seed %d controller logs:\n%s", r.seed, logs)
	}
	t.Logf("seed %d: %d restarts, windows %v, %s virtual", r.seed, r.checks.restarts, r.checks.windows, r.virtual)
	for _, v := range r.checks.violations {
		t.Errorf("seed %d: %s (replay: make sim SEED=%d)", r.seed, v, r.seed)
	}
}

// TestSimulation runs the fixed seeds: every promise holds in each.
func TestSimulation(t *testing.T) {
	if s := os.Getenv("SIM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		report(t, simulate(t, seed), true)
		return
	}
	if s := os.Getenv("SIM_SEEDS"); s != "" {
		many(t, s)
		return
	}
	for _, seed := range ciSeeds {
		if bug, ok := knownBugSeeds[seed]; ok {
			t.Logf("seed %d left out: %s", seed, bug)
			continue
		}
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { report(t, simulate(t, seed), false) })
	}
}

// many runs SIM_SEEDS seeds ("N" from 1, or "from-to") with a progress line,
// and sums up the violations by invariant.
func many(t *testing.T, spec string) {
	from, to := uint64(1), uint64(0)
	if a, b, ok := strings.Cut(spec, "-"); ok {
		from, _ = strconv.ParseUint(a, 10, 64)
		to, _ = strconv.ParseUint(b, 10, 64)
	} else {
		to, _ = strconv.ParseUint(spec, 10, 64)
	}
	byInvariant := map[string][]uint64{}
	windows := map[string]int{}
	start := time.Now()
	for seed := from; seed <= to; seed++ {
		var r result
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { r = simulate(t, seed) })
		seen := map[string]bool{}
		for _, v := range r.checks.violations {
			if !seen[v.invariant] {
				byInvariant[v.invariant] = append(byInvariant[v.invariant], seed)
				seen[v.invariant] = true
			}
		}
		for k, n := range r.checks.windows {
			windows[k] += n
		}
		first := ""
		if len(r.checks.violations) > 0 {
			first = " FAIL " + r.checks.violations[0].String()
		}
		fmt.Printf("sim: seed %d/%d (%s, %d restarts)%s\n", seed, to, time.Since(start).Round(time.Second), r.checks.restarts, first)
	}
	invariants := make([]string, 0, len(byInvariant))
	for k := range byInvariant {
		invariants = append(invariants, k)
	}
	slices.Sort(invariants)
	n := to - from + 1
	for _, k := range invariants {
		fmt.Printf("sim: %s broken in %d of %d seeds (%.1f%%): %v\n", k, len(byInvariant[k]), n, 100*float64(len(byInvariant[k]))/float64(n), byInvariant[k])
	}
	fmt.Printf("sim: windows %v\n", windows)
	if len(invariants) > 0 {
		t.Errorf("%d invariants broken; replay a seed with make sim SEED=n", len(invariants))
	}
}

// TestSimulationReplays ensures a seed replayed gives the same run: the
// same violations at the same virtual times.
func TestSimulationReplays(t *testing.T) {
	seed := uint64(12)
	if s := os.Getenv("SIM_REPLAY"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	n := 2
	if s := os.Getenv("SIM_REPLAYS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	first := simulate(t, seed)
	same, sameTrace, fails := 1, 1, 0
	for range n - 1 {
		r := simulate(t, seed)
		if r.signature() == first.signature() {
			same++
		}
		if slices.Equal(r.trace, first.trace) {
			sameTrace++
		}
		if len(r.checks.violations) > 0 {
			fails++
		}
	}
	if len(first.checks.violations) > 0 {
		fails++
	}
	t.Logf("seed %d: %d of %d runs with the same violations, %d with the same trace, %d failed (first: %d violations)", seed, same, n, sameTrace, fails, len(first.checks.violations))
	if os.Getenv("SIM_REPLAY") == "" {
		assert.Equal(t, n, same, "a replay differs")
	}
}

// TestSimulationDrawsEverySetting ensures every setting of docs/settings.md
// is drawn by the simulator or said not to be, and why.
func TestSimulationDrawsEverySetting(t *testing.T) {
	doc, err := os.ReadFile("../docs/settings.md")
	require.NoError(t, err)
	drawn := newWorld(1).drawSettings()
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		env := strings.Trim(strings.TrimSpace(cells[1]), "`")
		_, isDrawn := drawn[env]
		_, isNot := notDrawn[env]
		assert.True(t, isDrawn || isNot, "%s: the simulator neither draws it nor says why not (notDrawn)", env)
	}
}
