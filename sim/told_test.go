package sim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// told: every Warning Event the server accepted from a controller and
// every failure counter a controller's registry shows has a cause in the
// trace. The causes are recorded as the world makes them (a fault, an
// answer the server refused, a value that crash-loops, a pod lost...),
// never read from the controller.

// cause is one thing in the trace that may make the controller warn.
type cause struct {
	at   time.Duration
	kind string // a cause kind of warningCauses
	path string // the request's, for request causes
}

// Cause kinds.
const (
	causeFault     = "fault"        // a 5xx injected or an answer lost
	causeRefused   = "refused"      // the server answered 4xx (a conflict, a precondition, gone, not found...)
	causeScaleRead = "scale read"   // a fault or a refusal on a scale read or the discovery it needs
	causeBad       = "bad data"     // a value that crash-loops the pods that read it
	causeStorm     = "storm"        // more than STORM_CHANGES changes within STORM_WINDOW
	causeUnready   = "unready"      // a pod made not Ready or gone by the world: a blip, a node lost, a pod deleted, a scale
	causeDown      = "down"         // a controller killed or stopped
	causeWatchCut  = "watch cut"    // every watch cut, or compacted
	causeRecreated = "re-created"   // a data object deleted and created again
	causeBadSel    = "bad selector" // a selector the product refuses, written by the world
)

// warningCauses is the one table of what may explain each Warning Event
// reason the product can send (and each failure counter, failureCauses):
// an empty list means the simulated cluster gives it no cause, so any such
// Warning is a violation. TestToldKnowsEveryWarningReason fails when the
// product gains a reason this table lacks.
var warningCauses = map[string][]string{
	// No restart possible for PROGRESS_DEADLINE: pods not Ready, requests
	// failing, or the budget held by other rounds over pods made not Ready.
	"RolloutHalted":        {causeBad, causeUnready, causeFault, causeRefused, causeDown, causeStorm},
	"ReplacementsNotReady": {causeBad, causeUnready, causeFault, causeDown},
	// A scale read that failed, or got no answer that tells (checked
	// against the owner the message names).
	"ExpectedPodsEstimated": {causeScaleRead},
	"ExpectedPodsUnknown":   {causeScaleRead},
	"RestartFailed":         {causeFault, causeRefused, causeDown},
	"ChangeStorm":           {causeStorm},
	// A Secret created again finds the state ConfigMap of the one before
	// until the garbage collector removes it (gcDelay): not written for it.
	"WriteRefused":   {causeRecreated},
	"StateUntrusted": {causeRecreated},
	// A selector written invalid, empty or too broad (its fix comes
	// later); the workload writes restartReferencingPods valid, never
	// touches the state ConfigMaps, and RBAC and admission refuse nothing.
	"InvalidSelector":   {causeBadSel},
	"InvalidAnnotation": nil,
	"IntentTooLarge":    nil,
	"StateRemoved":      nil,
}

// failureCauses maps each failure counter (a sample's name, or name and
// labels, matched at its end: the watches' counters carry a prefix per
// watch) to the causes that may explain it.
var failureCauses = map[string][]string{
	`config_watcher_pod_deletions_total{result="error"}`:            warningCauses["RestartFailed"],
	`config_watcher_pod_evictions_total{result="error"}`:            warningCauses["RestartFailed"],
	`config_watcher_replacements_not_ready_total`:                   warningCauses["ReplacementsNotReady"],
	`config_watcher_owner_reads_failed_total{result="error"}`:       warningCauses["ExpectedPodsEstimated"],
	`config_watcher_owner_reads_failed_total{result="forbidden"}`:   warningCauses["ExpectedPodsEstimated"],
	`config_watcher_owner_reads_failed_total{result="unanswered"}`:  warningCauses["ExpectedPodsUnknown"],
	`config_watcher_invalid_selectors_total`:                        warningCauses["InvalidSelector"],
	`config_watcher_skipped_objects_total`:                          nil,
	`config_watcher_state_untrusted_total`:                          warningCauses["StateUntrusted"],
	`config_watcher_writes_refused_total{resource="configmaps"}`:    warningCauses["WriteRefused"],
	`config_watcher_writes_refused_total{resource="pods"}`:          nil,
	`config_watcher_writes_refused_total{resource="pods/eviction"}`: nil,
	`config_watcher_events_emitted_total{result="error"}`:           {causeFault, causeRefused, causeDown},
	`config_watcher_reconciles_total{result="error"}`:               {causeFault, causeRefused, causeDown},
	`config_watcher_reconciles_total{result="refused"}`:             warningCauses["InvalidSelector"],
	`watch_starts_total{reason="error"}`:                            {causeFault, causeWatchCut, causeDown},
	`malformed_events_total`:                                        nil,
}

// failureCounter tells a failure counter's sample (a name and its labels)
// from the others; the ones it finds must be in failureCauses.
var failureCounter = regexp.MustCompile(`_total\{?.*(error|fail|refus|invalid|skipped|untrusted|malformed|not_ready)`)

// addCause notes a cause at the present moment.
func (w *world) addCause(kind, path string) {
	w.causes = append(w.causes, cause{at: w.now(), kind: kind, path: path})
}

// requestCause notes what an answer to r says of the trace: a fault, a
// refusal, a failed scale read.
func (w *world) requestCause(r *request, code int, fault bool) {
	kind := causeRefused
	if fault {
		kind = causeFault
	} else if code < 400 {
		return
	}
	w.addCause(kind, r.path)
	if strings.HasSuffix(r.path, "/scale") || strings.HasPrefix(r.path, "/apis/") && strings.Count(r.path, "/") == 3 {
		w.addCause(causeScaleRead, r.path)
	}
}

// warning is a Warning Event the server accepted.
type warning struct {
	at              time.Duration
	reason, message string
	object          string
}

// eventPosted notes an Event the server accepted from a controller.
func (w *world) eventPosted(r *request) {
	var ev struct {
		Type, Reason, Message string
		InvolvedObject        struct{ Namespace, Name string }
	}
	if json.Unmarshal(r.body, &ev) != nil || ev.Type != "Warning" {
		return
	}
	w.warnings = append(w.warnings, warning{at: w.now(), reason: ev.Reason, message: ev.Message, object: ev.InvolvedObject.Namespace + "/" + ev.InvolvedObject.Name})
}

// explained reports whether a cause of a kind reason allows came at or
// before at; for a scale read, one of the owner the message names.
func (w *world) explained(reason, message string, at time.Duration) bool {
	return w.causedBy(warningCauses[reason], message, at)
}

// causedBy reports whether a cause of one of kinds came at or before at.
func (w *world) causedBy(kinds []string, message string, at time.Duration) bool {
	owner := ""
	if strings.HasPrefix(message, "Cannot read the desired replicas") {
		// "Cannot read the desired replicas of ReplicaSet rs1 (...)"
		if _, rest, ok := strings.Cut(message, "replicas of "); ok {
			if f := strings.Fields(rest); len(f) >= 2 {
				owner = f[1]
			}
		}
	}
	for _, c := range w.causes {
		if c.at > at || !slices.Contains(kinds, c.kind) {
			continue
		}
		if c.kind == causeScaleRead && owner != "" && strings.HasSuffix(c.path, "/scale") && !strings.HasSuffix(c.path, "/"+owner+"/scale") {
			continue
		}
		return true
	}
	if slices.Contains(kinds, causeStorm) {
		for _, d := range w.dataObjects() {
			if w.stormBefore(d, at) {
				return true
			}
		}
	}
	return false
}

// stormBefore reports whether d's data changed more than STORM_CHANGES
// times within a STORM_WINDOW before at.
func (w *world) stormBefore(d *data, at time.Duration) bool {
	n := atoi(w.env["STORM_CHANGES"])
	win, _ := time.ParseDuration(w.env["STORM_WINDOW"])
	for i, c := range d.changes {
		if c <= at && i >= n && c-d.changes[i-n] <= win {
			return true
		}
	}
	return false
}

// checkTold checks every Warning Event accepted and every failure counter
// of every controller process against the trace's causes.
func (w *world) checkTold() {
	for _, ev := range w.warnings {
		if _, known := warningCauses[ev.reason]; !known {
			w.violateAt("told", ev.at, "Warning %s on %s: a reason the simulator's table (warningCauses) lacks", ev.reason, ev.object)
			continue
		}
		if !w.explained(ev.reason, ev.message, ev.at) {
			w.violateAt("told", ev.at, "Warning %s on %s with no cause in the trace: %.200s", ev.reason, ev.object, ev.message)
		}
	}
	for _, p := range w.procs {
		if p.wiring.Metrics == nil {
			continue
		}
		counts := p.counts
		if counts == nil {
			counts = scrape(p.wiring.Metrics)
		}
		for sample, v := range counts {
			if v == 0 || !failureCounter.MatchString(sample) {
				continue
			}
			kinds, known := failureKinds(sample)
			switch {
			case !known:
				w.violateAt("told", p.ended, "controller %d: failure counter %s = %v, which the simulator's table (failureCauses) lacks", p.gen, sample, v)
			case !w.causedBy(kinds, "", p.ended):
				w.violateAt("told", p.ended, "controller %d: failure counter %s = %v with no cause in the trace", p.gen, sample, v)
			}
		}
	}
}

// failureKinds returns the causes failureCauses gives a sample.
func failureKinds(sample string) ([]string, bool) {
	for k, kinds := range failureCauses {
		if strings.HasSuffix(sample, k) {
			return kinds, true
		}
	}
	return nil, false
}

// scrape reads a registry's counters as the text format shows them.
func scrape(h http.Handler) map[string]float64 {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	out := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// eventCall finds the reason of each Event the product sends: the third
// argument of c.event (or of an Event method), with its type.
var eventCall = regexp.MustCompile(`\.[eE]vent\([^,()]+,\s*([\w.]+),\s*"(\w+)"`)

// TestToldKnowsEveryWarningReason ensures every Warning Event reason the
// product can send is in warningCauses, so told judges it by its causes.
func TestToldKnowsEveryWarningReason(t *testing.T) {
	var files []string
	for _, dir := range []string{"../policy", "../events", "../podindex", "../watch", "../leader", "../internal/app", "../apiclient"} {
		fs, err := filepath.Glob(dir + "/*.go")
		require.NoError(t, err)
		files = append(files, fs...)
	}
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range eventCall.FindAllStringSubmatch(string(src), -1) {
			if m[1] == "events.Normal" {
				continue
			}
			found++
			_, ok := warningCauses[m[2]]
			assert.True(t, ok, "%s: Warning reason %s is not in warningCauses (sim/told_test.go): say what in the trace explains it", f, m[2])
		}
	}
	assert.GreaterOrEqual(t, found, len(warningCauses), "the reasons are no longer found as c.event(obj, typ, \"Reason\", ...)")
}
