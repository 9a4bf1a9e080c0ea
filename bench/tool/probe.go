package main

import (
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// cmdListProbe times the pod LIST a controller sends right after a ConfigMap
// write, in the variants the controllers use, to see where reaction time goes:
// each sample PATCHes a ConfigMap, waits -gap (the watch event's delivery), then
// times one LIST. Not part of bench/run.sh; see BENCHMARKS.md.
func cmdListProbe(args []string) error {
	fs := flag.NewFlagSet("listprobe", flag.ExitOnError)
	base := fs.String("api", "", "API URL (kubectl proxy)")
	ns := fs.String("ns", "", "namespace with ConfigMap webapp-config and pods app=webapp")
	n := fs.Int("n", 30, "samples per variant")
	gap := fs.Duration("gap", 2*time.Millisecond, "pause between the PATCH and the LIST")
	_ = fs.Parse(args)
	a := api{*base}
	const meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	variants := []struct{ name, query, accept string }{
		{"config-watcher: limit=500, metadata only", "labelSelector=app%3Dwebapp&limit=500", meta},
		{"client-go clientset: no limit, full objects", "labelSelector=app%3Dwebapp", "application/json"},
		{"limit=500, full objects", "labelSelector=app%3Dwebapp&limit=500", "application/json"},
		{"no limit, metadata only", "labelSelector=app%3Dwebapp", meta},
		{"resourceVersion=0 (cache, no freshness wait), metadata", "labelSelector=app%3Dwebapp&resourceVersion=0", meta},
		{"no preceding write: limit=500, metadata", "labelSelector=app%3Dwebapp&limit=500", meta},
	}
	for _, v := range variants {
		var ms []float64
		for i := 0; i < *n; i++ {
			if !strings.HasPrefix(v.name, "no preceding write") {
				if _, err := a.must("PATCH", nsPath(*ns, "configmaps", "webapp-config"),
					map[string]any{"data": map[string]string{"probe": fmt.Sprint(time.Now().UnixNano())}}, "application/merge-patch+json", 200); err != nil {
					return err
				}
			}
			time.Sleep(*gap)
			req, _ := http.NewRequest("GET", strings.TrimRight(*base, "/")+nsPath(*ns, "pods", "")+"?"+v.query, nil)
			req.Header.Set("Accept", v.accept)
			req.Header.Set("User-Agent", userAgent)
			t := time.Now()
			resp, err := httpClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			ms = append(ms, float64(time.Since(t).Microseconds())/1000)
			time.Sleep(100 * time.Millisecond)
		}
		s := stats(ms)
		fmt.Printf("%-58s p50 %6.1f ms  p90 %6.1f ms  max %6.1f ms\n", v.name, s.p50, s.p90, s.max)
	}
	return nil
}
