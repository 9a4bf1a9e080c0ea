package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// cmdFloor is the least a controller can do: it follows the latency
// scenario's pods (app=webapp) on a watch, keeping only their names, and on
// each MODIFIED event of the watched namespace's ConfigMaps sends DELETE for
// each, with no other parsing, no list and no state. Its reaction latency,
// measured like the controllers', is what the API server, the proxy and
// this machine cost by themselves; no controller can react faster through
// the same ambassador.
func cmdFloor([]string) error {
	a, ns := api{os.Getenv("API_URL")}, os.Getenv("WATCH_NAMESPACE")
	var mu sync.Mutex
	live := map[string]bool{} // pod names
	go followPods(context.Background(), a, ns, "app=webapp",
		func(items []podObj, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			clear(live)
			for _, p := range items {
				live[p.Metadata.Name] = !p.terminating()
			}
		},
		func(typ string, p podObj, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if typ == "DELETED" {
				delete(live, p.Metadata.Name)
			} else {
				live[p.Metadata.Name] = !p.terminating()
			}
		})
	resp, err := http.Get(a.base + "/api/v1/namespaces/" + ns + "/configmaps?watch=true")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 4<<20)
	for lines.Scan() {
		if !bytes.HasPrefix(lines.Bytes(), []byte(`{"type":"MODIFIED"`)) {
			continue
		}
		mu.Lock()
		for name, ok := range live {
			if !ok {
				continue
			}
			live[name] = false
			req, err := http.NewRequest(http.MethodDelete, fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s", a.base, ns, name), nil)
			if err != nil {
				mu.Unlock()
				return err
			}
			go func() {
				if r, err := http.DefaultClient.Do(req); err == nil {
					r.Body.Close()
				}
			}()
		}
		mu.Unlock()
	}
	return lines.Err()
}
