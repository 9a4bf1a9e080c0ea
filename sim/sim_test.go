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

// knownBugSeeds fail on this code because of a product bug, named here by
// its mechanism (the families below, then one line per seed); they leave
// the CI set until it is fixed. "k/10": failed in k of 10 replays.
// Classified before the generator drew rollouts: since then each seed
// draws another run, and these lines wait to be classified again.
//
//   - storm: a round begun in a storm goes on for its own data for good
//     (policy/round.go current: a storm round is never superseded by newer
//     data). After the storm ends, or a later change fixes bad data set
//     during it, the round still runs for its storm-time data, halts on
//     replacements crash-looping on that bad data, and no round for the
//     last data ever begins (policy/storm.go promises one).
//   - estimate: policy/budget.go count starts r.mostSeen from the pods live
//     at a round's first count. A round begun after another round's
//     deletions landed and before their replacements exist estimates an
//     owner whose scale it cannot read (a DaemonSet; a ReplicaSet whose
//     scale read failed) one or more too low, and restarts past
//     MAX_UNAVAILABLE.
//   - scale: an owner's scale is cached up to a second (owners.go); a
//     scale-up within that second, while a replacement is still missing,
//     is not seen (max(desired, running) does not cover it), and the
//     round restarts one past MAX_UNAVAILABLE.
//   - 5xx: a DELETE answered 500 (the server did nothing) keeps its pod in
//     flight for 2 minutes (inFlightFor): at MAX_UNAVAILABLE=1 the round
//     restarts no Ready pod for 2 minutes, halting on the way.
//   - consent: policy/consent.go NamespaceConsent.Allows answers from the
//     last namespaces list or event while that watch is cut or relisting
//     (410): a namespace that opted out meanwhile has its pods restarted.
//   - re-created: a ConfigMap deleted and created again with the data the
//     controller recorded: a pod that started in the gap reading it
//     optionally runs without it, and no round follows.
var knownBugSeeds = map[uint64]string{
	1:   "converge or budget, 2/10: not classified yet",
	2:   "converge, about 5/100: not classified yet (ns-a/rs1-97 and rs1-104 left off cm1's data of 210.4 s)",
	3:   "budget, about 1/40: not classified yet (two rounds over rs1, of cm2 and cm3, restart rs1-9 and rs1-12 0.2 s apart at 31 s)",
	4:   "converge, 10/10: storm (secrets ns-b/secret1; halted on ds-n0-10, created on k2=bad at 138 s)",
	5:   "fails about 1 run in 20 under -race only: not classified yet",
	6:   "prompt, 10/10: re-created (ns-a/cm1 deleted 106.5 s, created again 112.4 s; rs3-17 reads k1 optionally)",
	8:   "fails about 3 runs in 20 under -race only: not classified yet",
	9:   "prompt, 10/10: 5xx (DELETE rs1-3 answered 500 at 17 s; cm2's round halts, MAX_UNAVAILABLE=1)",
	10:  "budget, 10/10: scale (rs1 scaled 7 to 8 at 53.56 s, restart at 53.59 s)",
	16:  "converge, 10/10: storm (ns-a/cm1; halted at 145.7 s on replacements of k1=bad)",
	19:  "budget, about 3/20: estimate (ReplicaSet scales unread under faults, ExpectedPodsEstimated, 119.9 s); converge, about 4/20: not classified yet",
	35:  "budget, 8/8: not classified yet (the first restart of a controller started 2 s after a SIGTERM leaves 4 of 15 available; one ExpectedPodsEstimated)",
	50:  "budget, 10/10: estimate (DaemonSet, a superseding round at 10.6 s)",
	52:  "prompt, 7/10: not classified yet (POD_INDEX=false, MIN_READY_SECONDS=3: the round goes slower than the ground truth's budget allows)",
	53:  "converge, 10/10: storm (ns-a/cm1; fix at 71.7 s after the storm ended at 56.7 s)",
	57:  "converge, 9/10: storm (ns-a/cm3; halted at 149.4 s, the fix at 151.9 s changes nothing)",
	60:  "budget and converge, 10/10: estimate (DaemonSet at 182.9 s) and storm (ns-b/cm3)",
	65:  "budget, 10/10: estimate (DaemonSet of 2, both down at 4.6 s)",
	86:  "budget, 10/10: estimate (DaemonSet, a superseding round at 18.7 s)",
	92:  "budget and prompt, 10/10: estimate (DaemonSet at 3.4 s) and 5xx (DELETE rs1-5 answered 500 at 116 s)",
	93:  "bystander, 1/10: consent (namespaces watch cut by a compaction at 208.4 s, opt-out at 209.1 s, DELETE at 209.6 s)",
	96:  "converge, 5/8: storm (ns-b/cm2), and ns-b/cm1's round halted twice: not classified yet",
	101: "budget or prompt, 1/8: not classified yet",
	110: "converge, 10/10: storm (secrets ns-a/secret1; a change at 145 s after the storm ended)",
	112: "converge, 10/10: storm (ns-a/cm1, created again with k1=bad, fixed at 191.7 s)",
	114: "budget, 10/10: estimate (ReplicaSet whose scale answer was lost, a superseding round at 104.5 s)",
	118: "budget, 10/10: scale (rs1 scaled 4 to 6 at 34.6 s, restart at 35.0 s)",
	120: "budget and converge, 2/10: estimate (DaemonSet at 137.8 s) and storm (ns-a/cm2)",
	128: "bystander, 10/10: consent (namespaces watch cut at 66.9 s, opt-out at 67.9 s, restart at 68.7 s)",
	129: "bystander, 9/10: consent (namespaces watch cut, opt-out at 47.1 s, relist delayed by faults until 56.4 s, evictions at 49-55 s)",
	148: "budget, 10/10: estimate (DaemonSet, a superseding round at 136.8 s)",
	150: "converge, 10/10: ns-a/cm1 created again at 134.9 s while a storm held its rounds back, the controller killed at 139.9 s before one began; its successor adopts the object (design.md names adoption only for an object created again while no controller ran)",
	521: "budget, 10/10: scale (rs1 scaled 5 to 7 at 5.77 s, restart at 6.0 s)",
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
		w.quietGets = true
		w.length = length
		w.run()
		res = result{seed: seed, checks: w.checks, trace: w.trace, virtual: w.now(), quiescent: w.quiescent}
		for _, p := range w.procs {
			res.logs = append(res.logs, fmt.Sprintf("--- controller %d ---\n%s", p.gen, p.logs.String()))
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
