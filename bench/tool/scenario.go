package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/k8spatterns/config-watcher/hack/audit"
)

// readAudit returns the completed requests on configmaps and on pods in ns,
// in log order.
func readAudit(path, ns string) (configmaps, pods []audit.Event, err error) {
	events, err := audit.Read(path, func(e audit.Event) bool { return e.On(ns, "configmaps") || e.On(ns, "pods") })
	for _, e := range events {
		if e.ObjectRef.Resource == "pods" {
			pods = append(pods, e)
		} else {
			configmaps = append(configmaps, e)
		}
	}
	return configmaps, pods, err
}

func appendFile(path, header, line string) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if statErr != nil {
		if _, err := f.WriteString(header + "\n"); err != nil {
			return err
		}
	}
	_, err = f.WriteString(line + "\n")
	return err
}

// addMetric appends one row to DIR/metrics.csv.
func addMetric(dir, controller, metric string, value float64, unit string) error {
	return appendFile(filepath.Join(dir, "metrics.csv"), "controller,metric,value,unit",
		fmt.Sprintf("%s,%s,%g,%s", controller, metric, value, unit))
}

// waitGone polls until GET path answers 404.
func waitGone(a api, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		code, _, err := a.do("GET", path, nil, "")
		if err == nil && code == 404 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s still there after %s", path, timeout)
}

// controllerDeletes returns the pod DELETEs someone else than the bench sent
// (the controller), in the order the server received them.
func controllerDeletes(pods []audit.Event) []audit.Event {
	var theirs []audit.Event
	for _, e := range pods {
		if e.Verb == "delete" && e.UserAgent != userAgent {
			theirs = append(theirs, e)
		}
	}
	slices.SortFunc(theirs, func(x, y audit.Event) int { return x.Received.Compare(y.Received) })
	return theirs
}

// firstAfter is the index of the first event of sorted received at or after t, or -1.
func firstAfter(sorted []audit.Event, t time.Time) int {
	return slices.IndexFunc(sorted, func(d audit.Event) bool { return !d.Received.Before(t) })
}

// cmdLatency measures reaction latency as a user meets it. With -setup it
// only creates the annotated ConfigMap (before the controller starts, so
// config-watcher adopts it) and a Deployment of one pod. Otherwise, N times:
// wait for the Deployment's new pod, report it Ready (no kubelet here),
// let another client make a consistent LIST of the namespace's pods, as
// clusters' clients do all the time (a consistent read just after another
// waits for the API server's next progress round, about 100 ms), change the
// ConfigMap's data, wait until the pod is gone, and let the controller
// finish. Then it pairs, from the audit log, each of our PATCHes
// (completed: stageTimestamp) with the first pod DELETE not made by us
// received after it.
func cmdLatency(args []string) error {
	fs := flag.NewFlagSet("latency", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	auditLog := fs.String("audit", "", "audit log")
	n := fs.Int("n", 30, "changes")
	controller := fs.String("controller", "", "name in the results")
	results := fs.String("results", "", "results dir")
	setup := fs.Bool("setup", false, "only create the ConfigMap and the Deployment")
	annotation := fs.String("annotation", "k8spatterns.io/podDeleteSelector", "selector annotation")
	_ = fs.Parse(args)
	a := api{*base}
	const cm = "webapp-config"
	if *setup {
		if _, err := a.must("POST", nsPath(*ns, "configmaps", ""), configMap(cm,
			map[string]string{*annotation: "app=webapp"}, map[string]string{"message": "hello"}), "application/json", 201); err != nil {
			return err
		}
		_, err := a.must("POST", "/apis/apps/v1/namespaces/"+*ns+"/deployments", deployment("webapp", 1), "application/json", 201)
		return err
	}
	restarted := map[string]bool{} // uids of the pods the controller restarted
	for i := 0; i < *n; i++ {
		name, err := nextPod(a, *ns, restarted)
		if err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
		if err := reportReady(a, *ns, name); err != nil {
			return err
		}
		// The pod has been Ready a while before the change, as a serving pod has.
		time.Sleep(200 * time.Millisecond)
		if _, _, err := listPods(a, *ns, "app=webapp"); err != nil {
			return err
		}
		patch := map[string]any{"data": map[string]string{"message": fmt.Sprintf("hello %d %d", i, time.Now().UnixNano())}}
		if _, err := a.must("PATCH", nsPath(*ns, "configmaps", cm), patch, "application/merge-patch+json", 200); err != nil {
			return err
		}
		if err := waitGone(a, nsPath(*ns, "pods", name), 30*time.Second); err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
		// Let the controller finish its round (config-watcher records the
		// digest after the deletions) before the next change.
		time.Sleep(300 * time.Millisecond)
		if (i+1)%10 == 0 {
			fmt.Printf("  %s: %d/%d changes\n", *controller, i+1, *n)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the audit log is written asynchronously
	patches, deletes, err := readAudit(*auditLog, *ns)
	if err != nil {
		return err
	}
	var ours []audit.Event
	for _, e := range patches {
		if e.Verb == "patch" && e.UserAgent == userAgent && e.ObjectRef.Name == cm && e.OK() {
			ours = append(ours, e)
		}
	}
	theirs := controllerDeletes(deletes)
	if len(ours) != *n {
		return fmt.Errorf("found %d of our %d PATCHes in the audit log", len(ours), *n)
	}
	var lat []float64
	for i, p := range ours {
		j := firstAfter(theirs, p.Done)
		if j < 0 {
			return fmt.Errorf("change %d: no pod DELETE after the PATCH in the audit log", i)
		}
		us := float64(theirs[j].Received.Sub(p.Done).Microseconds())
		lat = append(lat, us)
		if err := appendFile(filepath.Join(*results, "latency.csv"), "controller,change,latency_us",
			fmt.Sprintf("%s,%d,%g", *controller, i, us)); err != nil {
			return err
		}
	}
	s := stats(lat)
	fmt.Printf("  %s: reaction latency over %d changes: p50 %.1f ms, p90 %.1f ms, max %.1f ms\n",
		*controller, len(lat), s.p50/1000, s.p90/1000, s.max/1000)
	return nil
}

// nextPod waits for the Deployment's one live pod that was not restarted
// yet (the ReplicaSet's replacement), adds its uid to restarted, and
// returns its name.
func nextPod(a api, ns string, restarted map[string]bool) (string, error) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		items, _, err := listPods(a, ns, "app=webapp")
		if err != nil {
			return "", err
		}
		for _, p := range items {
			if !p.terminating() && !restarted[p.Metadata.UID] {
				restarted[p.Metadata.UID] = true
				return p.Metadata.Name, nil
			}
		}
	}
	return "", errors.New("no new pod of the Deployment after 30 s (is kube-controller-manager running?)")
}

// cmdBurst: -setup creates N annotated ConfigMaps burst-i, each selecting its
// own pod burst-i. Otherwise it changes all N at once (-workers concurrent
// PATCHes), waits until every pod is gone, and checks in the audit log that each
// pod was deleted exactly once, and when the last deletion came.
func cmdBurst(args []string) error {
	fs := flag.NewFlagSet("burst", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	auditLog := fs.String("audit", "", "audit log")
	n := fs.Int("n", 500, "ConfigMaps")
	workers := fs.Int("workers", 16, "concurrent PATCHes")
	controller := fs.String("controller", "", "name in the results")
	results := fs.String("results", "", "results dir")
	setup := fs.Bool("setup", false, "only create the ConfigMaps and pods")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after")
	annotation := fs.String("annotation", "k8spatterns.io/podDeleteSelector", "selector annotation")
	_ = fs.Parse(args)
	a := api{*base}
	name := func(i int) string { return fmt.Sprintf("burst-%d", i) }
	if *setup {
		return parallel(*n, 8, func(i int) error {
			if _, err := a.must("POST", nsPath(*ns, "pods", ""), pod(name(i), map[string]string{"bench-pod": name(i)}), "application/json", 201); err != nil {
				return err
			}
			_, err := a.must("POST", nsPath(*ns, "configmaps", ""), configMap(name(i),
				map[string]string{*annotation: "bench-pod=" + name(i)}, map[string]string{"message": "hello"}), "application/json", 201)
			return err
		})
	}
	start := time.Now()
	if err := parallel(*n, *workers, func(i int) error {
		_, err := a.must("PATCH", nsPath(*ns, "configmaps", name(i)),
			map[string]any{"data": map[string]string{"message": "changed"}}, "application/merge-patch+json", 200)
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("  %s: %d ConfigMaps changed in %s\n", *controller, *n, time.Since(start).Round(time.Millisecond))
	deadline := start.Add(*timeout)
	left := -1
	for time.Now().Before(deadline) {
		b, err := a.must("GET", nsPath(*ns, "pods", "")+"?labelSelector=bench-pod", nil, "", 200)
		if err != nil {
			return err
		}
		var l struct{ Items []json.RawMessage }
		if err := json.Unmarshal(b, &l); err != nil {
			return err
		}
		if len(l.Items) != left {
			left = len(l.Items)
			fmt.Printf("  %s: %d pods left after %s\n", *controller, left, time.Since(start).Round(100*time.Millisecond))
		}
		if left == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // late duplicates, and the asynchronous audit log
	patches, deletes, err := readAudit(*auditLog, *ns)
	if err != nil {
		return err
	}
	var firstPatch, lastPatch, lastDelete time.Time
	patchDone := map[string]time.Time{}
	for _, e := range patches {
		if e.Verb != "patch" || e.UserAgent != userAgent || !e.OK() {
			continue
		}
		if firstPatch.IsZero() || e.Received.Before(firstPatch) {
			firstPatch = e.Received
		}
		if e.Done.After(lastPatch) {
			lastPatch = e.Done
		}
		patchDone[e.ObjectRef.Name] = e.Done
	}
	okDeletes := map[string]int{}
	failed := 0
	var perCM []float64
	for _, e := range deletes {
		if e.Verb != "delete" || e.UserAgent == userAgent {
			continue
		}
		if !e.OK() {
			failed++
			continue
		}
		okDeletes[e.ObjectRef.Name]++
		if okDeletes[e.ObjectRef.Name] == 1 {
			if t, ok := patchDone[e.ObjectRef.Name]; ok {
				perCM = append(perCM, float64(e.Received.Sub(t).Microseconds()))
			}
		}
		if e.Received.After(lastDelete) {
			lastDelete = e.Received
		}
	}
	once, twice, missing := 0, 0, 0
	for i := 0; i < *n; i++ {
		switch c := okDeletes[name(i)]; {
		case c == 1:
			once++
		case c > 1:
			twice++
		default:
			missing++
		}
	}
	total := lastDelete.Sub(firstPatch)
	s := stats(perCM)
	fmt.Printf("  %s: burst of %d: %d pods deleted exactly once, %d more than once, %d never, %d failed DELETEs; "+
		"last deletion %.2f s after the first PATCH (PATCHes took %.2f s); per ConfigMap p50 %.0f ms, max %.0f ms\n",
		*controller, *n, once, twice, missing, failed, total.Seconds(), lastPatch.Sub(firstPatch).Seconds(), s.p50/1000, s.max/1000)
	for _, m := range []struct {
		k    string
		v    float64
		unit string
	}{
		{"burst_once", float64(once), "pods"}, {"burst_dup", float64(twice), "pods"}, {"burst_missing", float64(missing), "pods"},
		{"burst_failed_deletes", float64(failed), "requests"},
		{"burst_last_delete", total.Seconds(), "s"}, {"burst_patch_span", lastPatch.Sub(firstPatch).Seconds(), "s"},
		{"burst_per_cm_p50", s.p50 / 1000, "ms"}, {"burst_per_cm_max", s.max / 1000, "ms"},
	} {
		if err := addMetric(*results, *controller, m.k, m.v, m.unit); err != nil {
			return err
		}
	}
	return nil
}
