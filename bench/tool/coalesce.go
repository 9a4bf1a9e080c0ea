package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/k8spatterns/config-watcher/hack/audit"
)

// The coalescing and storm scenarios (bench/coalesce.sh): how many times each
// pod of a Deployment is restarted for changes that arrive together (several
// annotated ConfigMaps over the same pods) and for a ConfigMap that flaps,
// counted as successful pod DELETEs in the audit log, and whether and when
// every pod runs the last data: created after the last change (its creation
// resourceVersion, from the pod watch's ADDED event, above the last PATCH's).

// rvNum is a resourceVersion as a number (etcd's revision), 0 if it is not one.
func rvNum(rv string) uint64 { n, _ := strconv.ParseUint(rv, 10, 64); return n }

// cmdCoalesce: -setup creates a Deployment of -replicas pods (app=webapp) and
// -cms annotated ConfigMaps webapp-config-I selecting them. Otherwise it waits
// until the pods are there and Ready, changes the ConfigMaps' data: -changes
// times each, -interval apart, the ConfigMaps of one time spread over -spread;
// and follows the pods until every one was created after the last change and
// is Ready, for -quiet, and, with -hold, at least -hold + 10 s after the last change. One
// row of coalesce.csv in -results: pod DELETEs (someone else's than the
// bench's, as the burst counts them) from the first change until then, and
// before the last change's completion + -interval ("during the changes").
func cmdCoalesce(args []string) error {
	fs := flag.NewFlagSet("coalesce", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	auditLog := fs.String("audit", "", "audit log")
	scenario := fs.String("scenario", "", "name in the results: overlapping or storm")
	controller := fs.String("controller", "", "name in the results")
	run := fs.Int("run", 1, "run number (in the results)")
	results := fs.String("results", "", "results dir")
	replicas := fs.Int("replicas", 12, "the Deployment's replicas")
	cms := fs.Int("cms", 3, "annotated ConfigMaps selecting its pods")
	changes := fs.Int("changes", 1, "changes of each ConfigMap")
	interval := fs.Duration("interval", time.Second, "between two changes of a ConfigMap")
	spread := fs.Duration("spread", 200*time.Millisecond, "the ConfigMaps' changes of one time, spread over this")
	hold := fs.Duration("hold", 0, "watch at least this + 10 s after the last change (config-watcher's storm: its STORM_WINDOW)")
	quiet := fs.Duration("quiet", 3*time.Second, "every pod on the last data and Ready this long: done")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up this long after the last change + -hold")
	setup := fs.Bool("setup", false, "only create the Deployment and the ConfigMaps")
	_ = fs.Parse(args)
	a := api{*base}
	const selector = "app=webapp"
	name := func(i int) string { return fmt.Sprintf("webapp-config-%d", i) }
	if *setup {
		if _, err := a.must("POST", "/apis/apps/v1/namespaces/"+*ns+"/deployments", deployment("webapp", *replicas), "application/json", 201); err != nil {
			return err
		}
		for i := 0; i < *cms; i++ {
			if _, err := a.must("POST", nsPath(*ns, "configmaps", ""), configMap(name(i),
				map[string]string{"k8spatterns.io/podDeleteSelector": selector}, map[string]string{"message": "hello"}), "application/json", 201); err != nil {
				return err
			}
		}
		return nil
	}

	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		items, _, err := listPods(a, *ns, selector)
		if err != nil {
			return err
		}
		s := rolloutState{pods: map[string]podObj{}}
		s.relist(items)
		if live, _, ready := s.counts(); live == *replicas && ready == live {
			break
		} else if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("before the changes: %d pods, %d Ready after 2 min (is the stand-in running?)", live, ready)
		}
	}

	type update struct {
		typ  string
		pod  podObj
		list []podObj
		at   time.Time
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	updates := make(chan update, 1<<14)
	go followPods(ctx, a, *ns, selector,
		func(items []podObj, at time.Time) { updates <- update{typ: "LIST", list: items, at: at} },
		func(typ string, p podObj, at time.Time) { updates <- update{typ: typ, pod: p, at: at} })
	pods := map[string]podObj{}
	// created: each pod's creation resourceVersion, as first seen: its ADDED
	// event; a pod first seen in a LIST after a watch could not be resumed
	// gets the LIST's version of it (later: it counts as newer than it is).
	created := map[string]uint64{}
	see := func(p podObj) {
		if _, ok := created[p.Metadata.UID]; !ok {
			created[p.Metadata.UID] = rvNum(p.Metadata.ResourceVersion)
		}
	}
	apply := func(u update) {
		if u.typ == "LIST" {
			clear(pods)
			for _, p := range u.list {
				pods[p.Metadata.UID] = p
				see(p)
			}
			return
		}
		see(u.pod)
		if u.typ == "DELETED" {
			delete(pods, u.pod.Metadata.UID)
		} else {
			pods[u.pod.Metadata.UID] = u.pod
		}
	}
	apply(<-updates)

	// The changes, from their own goroutine; done carries the last one's resourceVersion.
	done := make(chan uint64, 1)
	errc := make(chan error, 1)
	go func() {
		var last uint64
		t0 := time.Now()
		for k := 0; k < *changes; k++ {
			for i := 0; i < *cms; i++ {
				at := time.Duration(k) * *interval
				if *cms > 1 {
					at += time.Duration(i) * *spread / time.Duration(*cms-1)
				}
				time.Sleep(time.Until(t0.Add(at)))
				patch := map[string]any{"data": map[string]string{"message": fmt.Sprintf("%s run %d change %d %d", *controller, *run, k, time.Now().UnixNano())}}
				b, err := a.must("PATCH", nsPath(*ns, "configmaps", name(i)), patch, "application/merge-patch+json", 200)
				if err != nil {
					errc <- err
					return
				}
				var cm struct {
					Metadata struct {
						ResourceVersion string `json:"resourceVersion"`
					} `json:"metadata"`
				}
				if err := json.Unmarshal(b, &cm); err != nil {
					errc <- err
					return
				}
				last = max(last, rvNum(cm.Metadata.ResourceVersion))
			}
			if (k+1)%10 == 0 {
				fmt.Printf("    %s run %d: %d of %d changes\n", *controller, *run, k+1, *changes)
			}
		}
		done <- last
	}()

	// onLast: every live pod was created after the last change, Ready, and there are -replicas of them.
	var lastRV uint64
	onLast := func() bool {
		if lastRV == 0 {
			return false
		}
		live := 0
		for uid, p := range pods {
			if p.terminating() {
				continue
			}
			live++
			if !p.ready() || created[uid] <= lastRV {
				return false
			}
		}
		return live == *replicas
	}
	wait := *hold // the least time to watch after the last change
	if wait > 0 {
		wait += 10 * time.Second
	}
	var since, lastSent time.Time // since: when onLast last became true
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Now()
	ok := false
	for {
		now := time.Now()
		select {
		case err := <-errc:
			return err
		case lastRV = <-done:
			lastSent = now
		case u := <-updates:
			apply(u)
			now = u.at
		case <-tick.C:
		}
		if !onLast() {
			since = time.Time{}
		} else if since.IsZero() {
			since = now
		}
		if !lastSent.IsZero() && !since.IsZero() && time.Since(since) >= *quiet && time.Since(lastSent) >= wait {
			ok = true
			break
		}
		if !lastSent.IsZero() && time.Since(lastSent) > wait+*timeout {
			break
		}
		if time.Since(lastPrint) >= 5*time.Second {
			lastPrint = time.Now()
			live, fresh, ready := 0, 0, 0
			for uid, p := range pods {
				if !p.terminating() {
					live++
					if lastRV > 0 && created[uid] > lastRV {
						fresh++
					}
					if p.ready() {
						ready++
					}
				}
			}
			fmt.Printf("    %s run %d: %d pods, %d on the last data, %d Ready\n", *controller, *run, live, fresh, ready)
		}
	}
	cancel()
	end := time.Now()

	time.Sleep(1500 * time.Millisecond) // the audit log is written asynchronously
	cmEvents, podEvents, err := readAudit(*auditLog, *ns)
	if err != nil {
		return err
	}
	var first, last *audit.Event
	nPatches := 0
	for i, e := range cmEvents {
		if e.Verb != "patch" || e.UserAgent != userAgent || !e.OK() {
			continue
		}
		nPatches++
		if first == nil || e.Received.Before(first.Received) {
			first = &cmEvents[i]
		}
		if last == nil || e.Done.After(last.Done) {
			last = &cmEvents[i]
		}
	}
	if nPatches != *changes**cms {
		return fmt.Errorf("%s run %d: %d of our %d PATCHes in the audit log", *controller, *run, nPatches, *changes**cms)
	}
	deleted, during, refused := 0, 0, 0
	for _, d := range controllerDeletes(podEvents) {
		if d.Received.Before(first.Received) || d.Received.After(end) {
			continue
		}
		if !d.OK() {
			refused++
			continue
		}
		deleted++
		if d.Received.Before(last.Done.Add(*interval)) {
			during++
		}
	}
	lastData, onLastData := "", "no"
	if ok {
		lastData, onLastData = fmt.Sprintf("%.3f", since.Sub(last.Done).Seconds()), "yes"
	}
	fmt.Printf("  %s, %s run %d: %d pods deleted (%.2f per pod; %d during the changes), %d DELETEs refused; every pod on the last data: %s",
		*scenario, *controller, *run, deleted, float64(deleted)/float64(*replicas), during, refused, onLastData)
	if ok {
		fmt.Printf(", %s s after the last change", lastData)
	}
	fmt.Println()
	return appendFile(filepath.Join(*results, "coalesce.csv"), "scenario,controller,run,replicas,changes,deleted,deleted_during,refused,last_data_s,on_last_data",
		fmt.Sprintf("%s,%s,%d,%d,%d,%d,%d,%d,%s,%s", *scenario, *controller, *run, *replicas, nPatches, deleted, during, refused, lastData, onLastData))
}

// coalesceRow is one (scenario, controller) of coalesce.csv, over its runs.
type coalesceRow struct {
	scenario, controller string
	perPod, perPodDuring []float64 // pod deletions per pod
	lastData             []float64 // s from the last change until every pod was on the last data
	runs, onLast         int
}

// readCoalesce reads DIR/coalesce.csv, in the order of its rows.
func readCoalesce(dir string) ([]*coalesceRow, error) {
	rows, err := readCSV(filepath.Join(dir, "coalesce.csv"))
	if err != nil {
		return nil, err
	}
	var out []*coalesceRow
	by := map[string]*coalesceRow{}
	for _, r := range rows {
		if len(r) < 10 {
			return nil, fmt.Errorf("coalesce.csv: short row %v", r)
		}
		num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		k := r[0] + "\x00" + r[1]
		g := by[k]
		if g == nil {
			g = &coalesceRow{scenario: r[0], controller: r[1]}
			by[k] = g
			out = append(out, g)
		}
		g.runs++
		g.perPod = append(g.perPod, num(r[5])/num(r[3]))
		g.perPodDuring = append(g.perPodDuring, num(r[6])/num(r[3]))
		if r[9] == "yes" {
			g.onLast++
			g.lastData = append(g.lastData, num(r[8]))
		}
	}
	return out, nil
}

// coalescePerPod is the median pod deletions per pod of a scenario's controller.
func coalescePerPod(rows []*coalesceRow, scenario, controller string) (float64, bool) {
	for _, g := range rows {
		if g.scenario == scenario && g.controller == controller {
			s := stats(g.perPod)
			return s.p50, s.n > 0
		}
	}
	return 0, false
}

// cmdCoalesceSummary prints the coalescing table from DIR/coalesce.csv: each
// controller's medians, and each config-watcher row against the informer of the
// same scenario.
func cmdCoalesceSummary(args []string) error {
	fs := flag.NewFlagSet("coalesce-summary", flag.ExitOnError)
	dir := fs.String("dir", "", "results dir")
	_ = fs.Parse(args)
	rows, err := readCoalesce(*dir)
	if err != nil {
		return err
	}
	cell := func(v []float64, format string) string {
		if len(v) == 0 {
			return "–"
		}
		return fmt.Sprintf(format, stats(v).p50)
	}
	ratio := func(x, y []float64) string {
		a, b := stats(x), stats(y)
		if a.n == 0 || b.n == 0 || b.p50 == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", a.p50/b.p50)
	}
	fmt.Println("| scenario | controller | pod deletions per pod, median (ideal 1.0) | of them during the changes | last change → every pod on the last data and Ready, median (s) | every pod ended on the last data |")
	fmt.Println("|---|---|---|---|---|---|")
	informer := map[string]*coalesceRow{}
	for _, g := range rows {
		during := cell(g.perPodDuring, "%.2f")
		if g.scenario != "storm" {
			during = "–"
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %d of %d runs |\n", g.scenario, g.controller, cell(g.perPod, "%.2f"), during,
			cell(g.lastData, "%.2f"), g.onLast, g.runs)
		if g.controller == "informer" {
			informer[g.scenario] = g
		}
	}
	for _, g := range rows {
		inf := informer[g.scenario]
		if inf == nil || g == inf {
			continue
		}
		during := ratio(g.perPodDuring, inf.perPodDuring)
		if g.scenario != "storm" {
			during = "–"
		}
		fmt.Printf("| %s | %s / informer | %s | %s | %s | |\n", g.scenario, g.controller, ratio(g.perPod, inf.perPod), during, ratio(g.lastData, inf.lastData))
	}
	return nil
}

// loadCoalesce reads a run's coalesce/coalesce.csv, if the run has one.
func loadCoalesce(dir string) ([]*coalesceRow, error) {
	rows, err := readCoalesce(filepath.Join(dir, "coalesce"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return rows, err
}

// coalesceRatio is the ratio of two controllers' median pod deletions per pod in a scenario.
func coalesceRatio(scenario, a, b string) func(runResults) (float64, bool) {
	return func(r runResults) (float64, bool) {
		x, okX := coalescePerPod(r.coalesce, scenario, a)
		y, okY := coalescePerPod(r.coalesce, scenario, b)
		return over(x, y, okX, okY)
	}
}
