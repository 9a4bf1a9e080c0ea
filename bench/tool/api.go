package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const userAgent = "cw-bench"

var httpClient = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64},
}

type api struct{ base string }

// do sends one request and returns the status and body.
func (a api) do(method, path string, body any, contentType string) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, strings.TrimRight(a.base, "/")+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// must sends a request and fails unless the status is one of ok.
func (a api) must(method, path string, body any, contentType string, ok ...int) ([]byte, error) {
	code, b, err := a.do(method, path, body, contentType)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for _, c := range ok {
		if code == c {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%s %s: %d %s", method, path, code, truncate(string(b), 300))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func nsPath(ns, resource, name string) string {
	p := "/api/v1/namespaces/" + url.PathEscape(ns) + "/" + resource
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

// parallel runs fn(i) for i in [0,n) on workers goroutines; the first error wins.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// progress returns a function to call once per item done: it prints a line at every
// tenth of n, with the rate so far.
func progress(what string, n int) func() {
	var done atomic.Int64
	start := time.Now()
	step := int64(max(n/10, 1))
	return func() {
		if d := done.Add(1); d%step == 0 && d < int64(n) {
			fmt.Printf("  %d of %d %s (%.0f/s)\n", d, n, what, float64(d)/time.Since(start).Seconds())
		}
	}
}

func configMap(name string, annotations map[string]string, data map[string]string) map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "annotations": annotations},
		"data":     data,
	}
}

func pod(name string, labels map[string]string) map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": labels},
		"spec": map[string]any{"containers": []any{map[string]any{
			"name": "app", "image": "k8spatterns/mini-http-server",
		}}},
	}
}

// deployment is a Deployment of replicas pods labelled app=webapp. Its
// own rolling update (the reference row of the waves bench) takes one pod
// down before it creates its replacement, a quarter at a time: maxSurge 0,
// maxUnavailable 25%, as config-watcher's default budget restarts them.
func deployment(name string, replicas int) map[string]any {
	labels := map[string]string{"app": "webapp"}
	return map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"replicas": replicas,
			"selector": map[string]any{"matchLabels": labels},
			"strategy": map[string]any{"type": "RollingUpdate",
				"rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": "25%"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": labels},
				"spec": map[string]any{"containers": []any{map[string]any{
					"name": "webapp", "image": "k8spatterns/mini-http-server",
				}}},
			},
		},
	}
}

// reportReady reports pod name Ready through pods/NAME/status, as a kubelet
// would: the control planes the bench runs on have none. A pod deleted
// meanwhile answers 404: nothing to report.
func reportReady(a api, ns, name string) error {
	now := time.Now().UTC().Format(time.RFC3339)
	cond := func(t string) map[string]any {
		return map[string]any{"type": t, "status": "True", "lastTransitionTime": now}
	}
	patch := map[string]any{"status": map[string]any{"phase": "Running",
		"conditions": []any{cond("Ready"), cond("ContainersReady")}}}
	_, err := a.must("PATCH", nsPath(ns, "pods", name)+"/status", patch, "application/strategic-merge-patch+json", 200, 404)
	return err
}

func cmdNamespace(args []string) error {
	fs := flag.NewFlagSet("ns", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	optIn := fs.Bool("opt-in", false, "label it config-watcher.k8spatterns.io/enabled=true, as a namespace opts in to the cluster-wide install (NAMESPACE_SELECTOR's default)")
	_ = fs.Parse(args)
	a := api{*base}
	meta := map[string]any{"name": *ns}
	if *optIn {
		meta["labels"] = map[string]string{"config-watcher.k8spatterns.io/enabled": "true"}
	}
	code, _, err := a.do("POST", "/api/v1/namespaces", map[string]any{"metadata": meta}, "application/json")
	switch {
	case err != nil:
		return err
	case code == 409 && *optIn:
		if _, err := a.must("PATCH", "/api/v1/namespaces/"+*ns, map[string]any{"metadata": map[string]any{"labels": meta["labels"]}}, "application/merge-patch+json", 200); err != nil {
			return err
		}
	case code != 201 && code != 409:
		return fmt.Errorf("POST namespace %s: %d", *ns, code)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if code, _, err := a.do("GET", nsPath(*ns, "serviceaccounts", "default"), nil, ""); err == nil && code == 200 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no default ServiceAccount in %s after 60s", *ns)
}

// bulkFlags defines the flags of the commands that create objects in bulk.
func bulkFlags(fs *flag.FlagSet) (base, ns, annotation *string, n, from, workers *int) {
	return fs.String("api", "", "API URL (kubectl proxy)"), fs.String("ns", "", "namespace"),
		fs.String("annotation", "k8spatterns.io/podDeleteSelector", "selector annotation"),
		fs.Int("n", 1000, "how many"), fs.Int("from", 0, "first index"), fs.Int("workers", 8, "concurrent requests")
}

// cmdCreate creates ConfigMaps cm-FROM … cm-(FROM+N-1) with one key of -size
// bytes; every second one is annotated with a selector that matches no pod.
func cmdCreate(args []string) error {
	fs := flag.NewFlagSet("create", flag.ExitOnError)
	base, ns, annotation, n, from, workers := bulkFlags(fs)
	size := fs.Int("size", 1024, "bytes of data per ConfigMap")
	_ = fs.Parse(args)
	a := api{*base}
	value := strings.Repeat("key = some configuration value\n", *size/31+1)[:*size]
	done := progress("ConfigMaps", *n)
	start := time.Now()
	err := parallel(*n, *workers, func(i int) error {
		idx := *from + i
		name := fmt.Sprintf("cm-%05d", idx)
		var ann map[string]string
		if idx%2 == 0 {
			ann = map[string]string{*annotation: "bench-mem=" + name}
		}
		_, err := a.must("POST", nsPath(*ns, "configmaps", ""), configMap(name, ann, map[string]string{"config": value}), "application/json", 201, 409)
		if err == nil {
			done()
		}
		return err
	})
	el := time.Since(start)
	fmt.Printf("created %d ConfigMaps of %d B in %s (%.0f/s)\n", *n, *size, el.Round(time.Millisecond), float64(*n)/el.Seconds())
	return err
}

func cmdPods(args []string) error {
	fs := flag.NewFlagSet("pods", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace")
	n := fs.Int("n", 1, "how many")
	prefix := fs.String("prefix", "p", "name prefix; pod P-i is labelled bench-pod=P-i")
	labels := fs.String("labels", "", "more labels for every pod: k=v,k=v")
	from := fs.Int("from", 0, "first index")
	workers := fs.Int("workers", 8, "concurrent requests")
	running := fs.Bool("running", false, "make each pod look like a Running pod a kubelet reports (owner, conditions, container status), as the pod index keeps it")
	restatus := fs.Bool("restatus", false, "only report the status of pods made with -running again, changed (a kubelet's status updates)")
	refs := fs.Bool("refs", false, "have each pod reference three objects of its own: a ConfigMap volume, a Secret's key in env, a ConfigMap through envFrom (none exists: a pod may reference what is missing)")
	_ = fs.Parse(args)
	a := api{*base}
	name := func(i int) string { return fmt.Sprintf("%s-%d", *prefix, *from+i) }
	if *restatus {
		return parallel(*n, *workers, func(i int) error { return reportRunning(a, *ns, name(i), 1) })
	}
	var owner map[string]any
	if *running {
		// A controller owner that no controller acts on: the index interns it,
		// as it does a ReplicaSet.
		b, err := a.must("POST", nsPath(*ns, "configmaps", ""), configMap(*prefix+"-owner", nil, nil), "application/json", 201)
		if err != nil {
			return err
		}
		var cm struct {
			Metadata struct{ UID string } `json:"metadata"`
		}
		if err := json.Unmarshal(b, &cm); err != nil {
			return err
		}
		owner = map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": *prefix + "-owner", "uid": cm.Metadata.UID, "controller": true}
	}
	extra := map[string]string{}
	for _, kv := range strings.Split(*labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			extra[k] = v
		}
	}
	return parallel(*n, *workers, func(i int) error {
		l := map[string]string{"bench-pod": name(i)}
		for k, v := range extra {
			l[k] = v
		}
		p := pod(name(i), l)
		if *refs {
			addRefs(p, name(i))
		}
		if owner == nil {
			_, err := a.must("POST", nsPath(*ns, "pods", ""), p, "application/json", 201)
			return err
		}
		p["metadata"].(map[string]any)["ownerReferences"] = []any{owner}
		if _, err := a.must("POST", nsPath(*ns, "pods", ""), p, "application/json", 201); err != nil {
			return err
		}
		return reportRunning(a, *ns, name(i), 0)
	})
}

// addRefs makes pod p reference three objects named after it.
func addRefs(p map[string]any, name string) {
	spec := p["spec"].(map[string]any)
	spec["volumes"] = []any{map[string]any{"name": "cfg", "configMap": map[string]any{"name": name + "-config", "optional": true}}}
	c := spec["containers"].([]any)[0].(map[string]any)
	c["envFrom"] = []any{map[string]any{"configMapRef": map[string]any{"name": name + "-env", "optional": true}}}
	c["env"] = []any{map[string]any{"name": "TOKEN", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": name + "-secret", "key": "token", "optional": true}}}}
}

// reportRunning reports pod name Running and Ready with its container
// started, as a kubelet reports it (the fields of testdata/recorded's
// Running pod); restarts is its container's restart count.
func reportRunning(a api, ns, name string, restarts int) error {
	now := time.Now().UTC().Format(time.RFC3339)
	var conds []any
	for _, t := range []string{"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"} {
		conds = append(conds, map[string]any{"type": t, "status": "True", "lastProbeTime": nil, "lastTransitionTime": now})
	}
	status := map[string]any{
		"phase": "Running", "conditions": conds, "qosClass": "BestEffort",
		"hostIP": "10.0.0.1", "hostIPs": []any{map[string]string{"ip": "10.0.0.1"}},
		"podIP": "10.244.0.12", "podIPs": []any{map[string]string{"ip": "10.244.0.12"}},
		"startTime": now,
		"containerStatuses": []any{map[string]any{
			"name": "app", "ready": true, "started": true, "restartCount": restarts,
			"state":       map[string]any{"running": map[string]any{"startedAt": now}},
			"image":       "docker.io/k8spatterns/mini-http-server:latest",
			"imageID":     "docker.io/k8spatterns/mini-http-server@sha256:4c5f3a1e8b7d9c2f6a0e1b3d5c7f9a2e4b6d8f0a1c3e5b7d9f1a3c5e7b9d1f3a",
			"containerID": "containerd://" + strings.Repeat("7f3e", 16),
		}},
	}
	_, err := a.must("PATCH", nsPath(ns, "pods", name)+"/status", map[string]any{"status": status}, "application/merge-patch+json", 200)
	return err
}
