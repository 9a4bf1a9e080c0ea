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
		ResourceVersion   string  `json:"resourceVersion"`
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

// errWatchError is an ERROR event (410 Gone above all): the stream cannot be resumed.
var errWatchError = errors.New("pod watch: ERROR event")

// watchPods streams the pod events of ns after resourceVersion rv to fn, with
// the time each was read, until ctx ends (nil) or the stream does. It returns
// the last resourceVersion seen, from which a watch the server ended (its
// timeout, or a watcher it dropped for falling behind) can be resumed.
func watchPods(ctx context.Context, a api, ns, selector, rv string, fn func(typ string, p podObj, at time.Time)) (string, error) {
	q := url.Values{"watch": {"true"}, "labelSelector": {selector}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"}}
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimRight(a.base, "/")+nsPath(ns, "pods", "")+"?"+q.Encode(), nil)
	if err != nil {
		return rv, err
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := streamClient.Do(req)
	if err != nil {
		return rv, ignoreCanceled(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return rv, fmt.Errorf("%w: %s", errWatchError, resp.Status)
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
			return rv, fmt.Errorf("pod watch: %w", err)
		}
		if ev.Type == "ERROR" {
			return rv, fmt.Errorf("%w: %s", errWatchError, truncate(string(ev.Object), 200))
		}
		var p podObj
		if err := json.Unmarshal(ev.Object, &p); err != nil {
			return rv, fmt.Errorf("pod watch: %w", err)
		}
		rv = p.Metadata.ResourceVersion
		if ev.Type != "BOOKMARK" {
			fn(ev.Type, p, at)
		}
	}
	return rv, ignoreCanceled(ctx, lines.Err())
}

// followPods lists the selected pods (to listed) and follows them on a watch
// (to fn) until ctx ends, resuming a watch the server ended from the last
// resourceVersion and listing again after an ERROR event. It says on stderr
// each time, with why.
func followPods(ctx context.Context, a api, ns, selector string, listed func([]podObj, time.Time), fn func(typ string, p podObj, at time.Time)) {
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			items, listRV, err := listPods(a, ns, selector)
			if err != nil {
				fmt.Fprintf(os.Stderr, "  pod list: %v; again in 1 s\n", err)
				time.Sleep(time.Second)
				continue
			}
			listed(items, time.Now())
			rv = listRV
		}
		var err error
		rv, err = watchPods(ctx, a, ns, selector, rv, fn)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errWatchError):
			fmt.Fprintf(os.Stderr, "  %v; listing again\n", err)
			rv = ""
		case err != nil:
			fmt.Fprintf(os.Stderr, "  %v; resuming from resourceVersion %s\n", err, rv)
			time.Sleep(100 * time.Millisecond)
		default:
			fmt.Fprintf(os.Stderr, "  pod watch ended by the server; resuming from resourceVersion %s\n", rv)
		}
	}
}

func ignoreCanceled(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
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
				if err := reportReady(a, *ns, name); err != nil {
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
	// Both callbacks run on this goroutine: seen needs no lock.
	followPods(context.Background(), a, *ns, *selector,
		func(items []podObj, _ time.Time) {
			for _, p := range items {
				schedule(p)
			}
		},
		func(typ string, p podObj, _ time.Time) {
			if typ == "ADDED" || typ == "MODIFIED" {
				schedule(p)
			}
		})
	return nil
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

// relist replaces what the state knows with a list's pods.
func (s rolloutState) relist(items []podObj) {
	clear(s.pods)
	for _, p := range items {
		s.pods[p.Metadata.UID] = p
	}
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
// With -trigger deployment the change is the Deployment's pod template, and
// the controller that deletes is the Deployment's (kube-controller-manager).
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
	trigger := fs.String("trigger", "configmap", "what changes: configmap (the annotated ConfigMap's data) or deployment (its pod template, as kubectl rollout restart changes it: the Deployment's own rolling update)")
	_ = fs.Parse(args)
	a := api{*base}
	changePath, resource, changeName := nsPath(*ns, "configmaps", *cm), "configmaps", *cm
	patch := map[string]any{"data": map[string]string{"message": fmt.Sprintf("%s run %d %d", *setting, *run, time.Now().UnixNano())}}
	switch *trigger {
	case "configmap":
	case "deployment":
		changePath, resource, changeName = "/apis/apps/v1/namespaces/"+*ns+"/deployments/webapp", "deployments", "webapp"
		patch = map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{"kubectl.kubernetes.io/restartedAt": time.Now().UTC().Format(time.RFC3339Nano)}}}}}
	default:
		return fmt.Errorf("-trigger %q: configmap or deployment", *trigger)
	}

	steady := func(s rolloutState) (bool, string) {
		live, _, ready := s.counts()
		return live == *replicas && ready == live, fmt.Sprintf("%d pods, %d Ready", live, ready)
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		items, _, err := listPods(a, *ns, *selector)
		if err != nil {
			return err
		}
		s := rolloutState{pods: map[string]podObj{}}
		s.relist(items)
		if ok, now := steady(s); ok {
			break
		} else if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("before the change: %s after 2 min (is the stand-in running?)", now)
		}
	}

	// One goroutine follows the pods; this one keeps the state. A LIST update
	// (the first, and after a watch could not be resumed) replaces it whole.
	type update struct {
		typ  string
		pod  podObj
		list []podObj
		at   time.Time
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	updates := make(chan update, 1<<14)
	go followPods(ctx, a, *ns, *selector,
		func(items []podObj, at time.Time) { updates <- update{typ: "LIST", list: items, at: at} },
		func(typ string, p podObj, at time.Time) { updates <- update{typ: typ, pod: p, at: at} })
	s := rolloutState{old: map[string]bool{}, pods: map[string]podObj{}}
	initial := <-updates
	for _, p := range initial.list {
		s.old[p.Metadata.UID] = true
	}
	s.relist(initial.list)
	if ok, now := steady(s); !ok {
		return fmt.Errorf("before the change: %s, a moment after %d were Ready", now, *replicas)
	}

	if _, err := a.must("PATCH", changePath, patch, "application/merge-patch+json", 200); err != nil {
		return err
	}
	sent := time.Now()
	minReady := *replicas
	var end time.Time
	lastPrint := sent
	giveUp := time.After(*timeout)
	for end.IsZero() {
		select {
		case ev := <-updates:
			if ev.typ == "LIST" {
				s.relist(ev.list)
			} else {
				s.apply(ev.typ, ev.pod)
			}
			live, fresh, ready := s.counts()
			minReady = min(minReady, ready)
			if fresh == live && live >= *replicas && ready == live {
				end = ev.at
			} else if time.Since(lastPrint) >= time.Second {
				lastPrint = time.Now()
				fmt.Printf("    %s run %d, %4.1f s: %d pods, %d new, %d Ready (lowest %d)\n",
					*setting, *run, time.Since(sent).Seconds(), live, fresh, ready, minReady)
			}
		case <-giveUp:
			live, fresh, ready := s.counts()
			return fmt.Errorf("%s run %d: after %s: %d pods, %d new, %d Ready", *setting, *run, *timeout, live, fresh, ready)
		}
	}
	cancel()

	time.Sleep(1500 * time.Millisecond) // the audit log is written asynchronously
	_, pods, err := readAudit(*auditLog, *ns)
	if err != nil {
		return err
	}
	changes, err := audit.Read(*auditLog, func(e audit.Event) bool { return e.On(*ns, resource) })
	if err != nil {
		return err
	}
	var change *audit.Event
	for i, e := range changes {
		if e.Verb == "patch" && e.UserAgent == userAgent && e.ObjectRef.Name == changeName && e.OK() &&
			(change == nil || e.Received.After(change.Received)) {
			change = &changes[i]
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
		if x == 0 || y == 0 {
			return ""
		}
		return fmt.Sprintf("%.2f×", x/y)
	}
	fmt.Printf("Rollout: one data change, a Deployment's pods Ready %s after they appear; first restart: change -> first pod DELETE.\n\n", *readyAfter)
	fmt.Println("| MAX_UNAVAILABLE | rollout, median (s) | min–max (s) | lowest Ready count seen | pods deleted per rollout | first restart in the rollouts, median (ms) | first restart, one Deployment pod, p50 (ms) | p90 (ms) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, k := range settings {
		g := by[k]
		r, f := stats(g.rollout), stats(g.first)
		l := stats(lat[k])
		single := "– | –" // the reference row: no single-pod changes
		if l.n > 0 {
			single = fmt.Sprintf("%.1f | %.1f", l.p50, l.p90)
		}
		fmt.Printf("| %s | %.2f | %.2f–%.2f | %d of %d | %.0f | %.1f | %s |\n",
			k, r.p50, r.min, r.max, g.minReady, g.replicas, stats(g.deleted).p50, f.p50, single)
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
		fmt.Printf("\nRollouts per setting: %d; single-pod changes per setting: %d.\n", len(by[settings[0]].rollout), len(lat[settings[0]]))
	}
	return nil
}
