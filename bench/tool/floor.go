package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
)

// cmdFloor is the least a controller can do: on each MODIFIED event of the
// watched namespace's ConfigMaps it sends DELETE for the latency scenario's
// next pod (webapp-0, webapp-1, ...), with no parsing, no list and no state.
// Its reaction latency, measured like the controllers', is what the API
// server, the proxy and this machine cost by themselves; no controller can
// react faster through the same ambassador.
func cmdFloor([]string) error {
	api, ns := os.Getenv("API_URL"), os.Getenv("WATCH_NAMESPACE")
	resp, err := http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps?watch=true")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 4<<20)
	for n := 0; lines.Scan(); {
		if !bytes.HasPrefix(lines.Bytes(), []byte(`{"type":"MODIFIED"`)) {
			continue
		}
		req, err := http.NewRequest(http.MethodDelete, fmt.Sprintf("%s/api/v1/namespaces/%s/pods/webapp-%d", api, ns, n), nil)
		if err != nil {
			return err
		}
		n++
		go func() {
			if r, err := http.DefaultClient.Do(req); err == nil {
				r.Body.Close()
			}
		}()
	}
	return lines.Err()
}
