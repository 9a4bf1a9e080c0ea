package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/k8spatterns/config-watcher/hack/audit"
)

// The waves scenario (bench/waves.sh): a Deployment's pods, made Ready by a
// stand-in for the kubelet, rolled by one data change with a given
// MAX_UNAVAILABLE. Pods have no node here, so a deleted pod is gone at once
// and its replacement is created by the ReplicaSet controller.

// streamClient has no overall timeout: a watch lasts as long as its context.
var streamClient = &http.Client{Transport: httpClient.Transport}

type podObj struct {
	Metadata struct {
		Name              string  `json:"name"`
		UID               string  `json:"uid"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Status struct {
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

func (p podObj) terminating() bool { return p.Metadata.DeletionTimestamp != nil }

// ready is the kubelet's verdict, as a Deployment and config-watcher read it.
func (p podObj) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// listPods returns the pods of ns that selector matches and the list's resourceVersion.
func listPods(a api, ns, selector string) ([]podObj, string, error) {
	b, err := a.must("GET", nsPath(ns, "pods", "")+"?"+url.Values{"labelSelector": {selector}}.Encode(), nil, "", 200)
	if err != nil {
		return nil, "", err
	}
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []podObj `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, "", fmt.Errorf("pod list: %w", err)
	}
	return l.Items, l.Metadata.ResourceVersion, nil
}

// watchPods streams the pod events of ns after resourceVersion rv to fn, with
// the time each was read, until ctx ends (nil) or the stream does (an error:
// the server's timeout, a 410 ERROR event, a broken connection).
func watchPods(ctx context.Context, a api, ns, selector, rv string, fn func(typ string, p podObj, at time.Time)) error {
	q := url.Values{"watch": {"true"}, "labelSelector": {selector}, "resourceVersion": {rv}}
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimRight(a.base, "/")+nsPath(ns, "pods", "")+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := streamClient.Do(req)
	if err != nil {
		return ignoreCanceled(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("pod watch: %s", resp.Status)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 4<<20)
	for lines.Scan() {
		at := time.Now()
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			return fmt.Errorf("pod watch: %w", err)
		}
		if ev.Type == "ERROR" {
			return fmt.Errorf("pod watch: ERROR event %s", truncate(string(ev.Object), 200))
		}
		var p podObj
		if err := json.Unmarshal(ev.Object, &p); err != nil {
			return fmt.Errorf("pod watch: %w", err)
		}
		fn(ev.Type, p, at)
	}
	if err := lines.Err(); err != nil {
		return ignoreCanceled(ctx, err)
	}
	return errors.New("pod watch: the server ended the stream")
}

func ignoreCanceled(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// cmdStandin plays the kubelet's part in readiness, on a control plane that has
// none: each selected pod that is not Ready is reported Ready -delay after the
// stand-in first sees it (the ADDED event, a few ms after its creation), through
// pods/NAME/status as a kubelet would. It runs until it is killed.
func cmdStandin(args []string) error {
	fs := flag.NewFlagSet("standin", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	selector := fs.String("selector", "app=webapp", "label selector of the pods to make Ready")
	delay := fs.Duration("delay", time.Second, "from first seen to Ready")
	workers := fs.Int("workers", 16, "concurrent status PATCHes")
	_ = fs.Parse(args)
	a := api{*base}
	due := make(chan string, 4096)
	for w := 0; w < *workers; w++ {
		go func() {
			for name := range due {
				now := time.Now().UTC().Format(time.RFC3339)
				cond := func(t string) map[string]any {
					return map[string]any{"type": t, "status": "True", "lastTransitionTime": now}
				}
				patch := map[string]any{"status": map[string]any{"phase": "Running",
					"conditions": []any{cond("Ready"), cond("ContainersReady")}}}
				// A pod deleted meanwhile answers 404: nothing to report.
				if _, err := a.must("PATCH", nsPath(*ns, "pods", name)+"/status", patch, "application/strategic-merge-patch+json", 200, 404); err != nil {
					fmt.Fprintf(os.Stderr, "standin: %v\n", err)
				}
			}
		}()
	}
	seen := map[string]bool{} // uids already due or Ready
	schedule := func(p podObj) {
		if p.terminating() || p.ready() || seen[p.Metadata.UID] {
			return
		}
		seen[p.Metadata.UID] = true
		name := p.Metadata.Name
		time.AfterFunc(*delay, func() { due <- name })
	}
	fmt.Printf("standin: pods %s in %s become Ready %s after they appear\n", *selector, *ns, *delay)
	for {
		items, rv, err := listPods(a, *ns, *selector)
		if err != nil {
			fmt.Fprintf(os.Stderr, "standin: %v\n", err)
			time.Sleep(time.Second)
			continue
		}
		for _, p := range items {
			schedule(p)
		}
		// Events reach schedule from this goroutine only: seen needs no lock.
		err = watchPods(context.Background(), a, *ns, *selector, rv, func(typ string, p podObj, _ time.Time) {
			if typ == "ADDED" || typ == "MODIFIED" {
				schedule(p)
			}
		})
		fmt.Fprintf(os.Stderr, "standin: %v; listing again\n", err)
	}
}

// rolloutState is the selected pods as a watch shows them, against the uids
// that were there before the change.
type rolloutState struct {
	old  map[string]bool
	pods map[string]podObj
}

// counts: live (non-terminating) pods, how many of them are new, how many Ready.
func (s rolloutState) counts() (live, fresh, ready int) {
	for uid, p := range s.pods {
		if p.terminating() {
			continue
		}
		live++
		if !s.old[uid] {
			fresh++
		}
		if p.ready() {
			ready++
		}
	}
	return live, fresh, ready
}

func (s rolloutState) apply(typ string, p podObj) {
	if typ == "DELETED" {
		delete(s.pods, p.Metadata.UID)
	} else {
		s.pods[p.Metadata.UID] = p
	}
}

// cmdRollout measures one rollout: it waits until -replicas selected pods are
// there and Ready, changes the ConfigMap's data, and follows the pods on a
// watch until every live selected pod is a new one and Ready (and there are
// -replicas of them), keeping the lowest Ready count seen after the change.
// From the audit log: the change's completion (the start of the clock), the
// controller's first pod DELETE after it, and its DELETEs during the rollout.
// One row of rollout.csv in -results.
func cmdRollout(args []string) error {
	fs := flag.NewFlagSet("rollout", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	cm := fs.String("cm", "webapp-config", "the annotated ConfigMap")
	selector := fs.String("selector", "app=webapp", "its selector")
	replicas := fs.Int("replicas", 100, "the Deployment's replicas")
	auditLog := fs.String("audit", "", "audit log")
	setting := fs.String("setting", "", "the controller's MAX_UNAVAILABLE (name in the results)")
	run := fs.Int("run", 1, "run number (in the results)")
	results := fs.String("results", "", "results dir")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after")
	_ = fs.Parse(args)
	a := api{*base}

	var items []podObj
	var rv string
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if items, rv, err = listPods(a, *ns, *selector); err != nil {
			return err
		}
		s := rolloutState{pods: map[string]podObj{}}
		for _, p := range items {
			s.apply("ADDED", p)
		}
		live, _, ready := s.counts()
		if live == *replicas && ready == live {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("before the change: %d pods, %d Ready, after 2 min (is the stand-in running?)", live, ready)
		}
	}
	s := rolloutState{old: map[string]bool{}, pods: map[string]podObj{}}
	for _, p := range items {
		s.old[p.Metadata.UID] = true
		s.apply("ADDED", p)
	}

	type event struct {
		typ string
		pod podObj
		at  time.Time
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan event, 1<<14)
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- watchPods(ctx, a, *ns, *selector, rv, func(typ string, p podObj, at time.Time) { events <- event{typ, p, at} })
	}()

	patch := map[string]any{"data": map[string]string{"message": fmt.Sprintf("%s run %d %d", *setting, *run, time.Now().UnixNano())}}
	if _, err := a.must("PATCH", nsPath(*ns, "configmaps", *cm), patch, "application/merge-patch+json", 200); err != nil {
		return err
	}
	sent := time.Now()
	minReady := *replicas
	var end time.Time
	lastPrint := sent
	giveUp := time.After(*timeout)
	for end.IsZero() {
		select {
		case ev := <-events:
			s.apply(ev.typ, ev.pod)
			live, fresh, ready := s.counts()
			minReady = min(minReady, ready)
			if fresh == live && live >= *replicas && ready == live {
				end = ev.at
			} else if time.Since(lastPrint) >= time.Second {
				lastPrint = time.Now()
				fmt.Printf("    %s run %d, %4.1f s: %d pods, %d new, %d Ready (lowest %d)\n",
					*setting, *run, time.Since(sent).Seconds(), live, fresh, ready, minReady)
			}
		case err := <-watchErr:
			return fmt.Errorf("%s run %d: the pod watch ended during the rollout: %v", *setting, *run, err)
		case <-giveUp:
			live, fresh, ready := s.counts()
			return fmt.Errorf("%s run %d: after %s: %d pods, %d new, %d Ready", *setting, *run, *timeout, live, fresh, ready)
		}
	}
	cancel()

	time.Sleep(1500 * time.Millisecond) // the audit log is written asynchronously
	configmaps, pods, err := readAudit(*auditLog, *ns)
	if err != nil {
		return err
	}
	var change *audit.Event
	for i, e := range configmaps {
		if e.Verb == "patch" && e.UserAgent == userAgent && e.ObjectRef.Name == *cm && e.OK() &&
			(change == nil || e.Received.After(change.Received)) {
			change = &configmaps[i]
		}
	}
	if change == nil || change.Received.After(sent) {
		return fmt.Errorf("%s run %d: our PATCH is not in the audit log", *setting, *run)
	}
	theirs := controllerDeletes(pods)
	j := firstAfter(theirs, change.Done)
	if j < 0 {
		return fmt.Errorf("%s run %d: no pod DELETE after the change in the audit log", *setting, *run)
	}
	first := theirs[j].Received.Sub(change.Done)
	okDeletes, failed := 0, 0
	for _, d := range theirs[j:] {
		if d.Received.After(end) {
			break
		}
		if d.OK() {
			okDeletes++
		} else {
			failed++
		}
	}
	rollout := end.Sub(change.Done)
	fmt.Printf("  %s run %d: %d pods rolled in %.2f s; first restart %.1f ms after the change; lowest Ready count %d; %d pods deleted, %d DELETEs refused\n",
		*setting, *run, *replicas, rollout.Seconds(), float64(first.Microseconds())/1000, minReady, okDeletes, failed)
	return appendFile(filepath.Join(*results, "rollout.csv"), "setting,run,replicas,rollout_s,first_restart_ms,min_ready,deleted,refused",
		fmt.Sprintf("%s,%d,%d,%.3f,%.3f,%d,%d,%d", *setting, *run, *replicas, rollout.Seconds(), float64(first.Microseconds())/1000, minReady, okDeletes, failed))
}

// cmdWavesSummary prints the waves table from DIR/rollout.csv and DIR/latency.csv
// (the latency scenario run once per setting), each setting against -base.
func cmdWavesSummary(args []string) error {
	fs := flag.NewFlagSet("waves-summary", flag.ExitOnError)
	dir := fs.String("dir", "", "results dir")
	baseSetting := fs.String("base", "100%", "the setting the others are compared with")
	readyAfter := fs.String("ready-after", "1s", "the stand-in's delay (for the caption)")
	_ = fs.Parse(args)
	rows, err := readCSV(filepath.Join(*dir, "rollout.csv"))
	if err != nil {
		return err
	}
	type agg struct {
		rollout, first []float64
		minReady       int
		replicas       int
		deleted        []float64
	}
	by := map[string]*agg{}
	var settings []string
	for _, r := range rows {
		if len(r) < 8 {
			return fmt.Errorf("rollout.csv: short row %v", r)
		}
		g := by[r[0]]
		if g == nil {
			g = &agg{minReady: -1}
			by[r[0]] = g
			settings = append(settings, r[0])
		}
		num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		g.replicas = int(num(r[2]))
		g.rollout = append(g.rollout, num(r[3]))
		g.first = append(g.first, num(r[4]))
		if m := int(num(r[5])); g.minReady < 0 || m < g.minReady {
			g.minReady = m
		}
		g.deleted = append(g.deleted, num(r[6]))
	}
	lat, err := latencies(filepath.Join(*dir, "latency.csv"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	b := by[*baseSetting]
	ratio := func(x, y float64) string {
		if y == 0 {
			return ""
		}
		return fmt.Sprintf("%.2f×", x/y)
	}
	fmt.Printf("Rollout: one data change, a Deployment's pods Ready %s after they appear; first restart: change -> first pod DELETE.\n\n", *readyAfter)
	fmt.Println("| MAX_UNAVAILABLE | rollout, median (s) | min–max (s) | lowest Ready count seen | pods deleted per rollout | first restart in the rollouts, median (ms) | first restart, bare pod, p50 (ms) | p90 (ms) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, k := range settings {
		g := by[k]
		r, f := stats(g.rollout), stats(g.first)
		l := stats(lat[k])
		fmt.Printf("| %s | %.2f | %.2f–%.2f | %d of %d | %.0f | %.1f | %.1f | %.1f |\n",
			k, r.p50, r.min, r.max, g.minReady, g.replicas, stats(g.deleted).p50, f.p50, l.p50, l.p90)
	}
	if b != nil {
		for _, k := range settings {
			if k == *baseSetting {
				continue
			}
			g := by[k]
			fmt.Printf("| %s / %s | %s | | | | %s | %s | %s |\n", k, *baseSetting,
				ratio(stats(g.rollout).p50, stats(b.rollout).p50), ratio(stats(g.first).p50, stats(b.first).p50),
				ratio(stats(lat[k]).p50, stats(lat[*baseSetting]).p50), ratio(stats(lat[k]).p90, stats(lat[*baseSetting]).p90))
		}
	}
	if len(settings) > 0 {
		fmt.Printf("\nRollouts per setting: %d; bare-pod changes per setting: %d.\n", len(by[settings[0]].rollout), len(lat[settings[0]]))
	}
	return nil
}
