package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync/atomic"
)

// cmdMeter is a reverse proxy in front of the kubectl proxy that counts the
// requests a controller makes and the response bytes it reads (watch streams
// included, as they flow): the API load of a controller, told apart from
// everyone else's. GET /_meter answers {"requests":N,"bytes":B} so far.
func cmdMeter(args []string) error {
	fs := flag.NewFlagSet("meter", flag.ExitOnError)
	upstream := fs.String("upstream", "", "API URL to forward to (kubectl proxy)")
	addrFile := fs.String("addr-file", "", "write the address it listens on here")
	_ = fs.Parse(args)
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("-upstream %q: not a URL", *upstream)
	}
	var requests, bytes atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // watch events pass at once
	proxy.ModifyResponse = func(resp *http.Response) error {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &bytes}
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_meter", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]int64{"requests": requests.Load(), "bytes": bytes.Load()})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		proxy.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	return http.Serve(ln, mux)
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}
