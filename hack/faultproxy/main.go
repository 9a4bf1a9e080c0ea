// Command faultproxy is a fault-injecting HTTP reverse proxy for the tests of
// config-watcher. It sits between the controller and its ambassador
// (kubectl proxy) and, per request, can add latency, answer an error status
// itself (429 with Retry-After, 500, 503, ...), cut a streaming answer after
// some lines (a reset mid-stream), or cut it in the middle of a line (a
// half-written event). Standard library only.
//
// Usage:
//
//	faultproxy -listen 127.0.0.1:0 -upstream http://127.0.0.1:8001 [-rules JSON|@file] [-addr-file F]
//
// It prints "listening on http://ADDR" on stdout (and writes ADDR to
// -addr-file) once it accepts connections. The control endpoint lives on the
// same listener under /_fault/ (a path the Kubernetes API never uses):
//
//	PUT    /_fault/rules   body: JSON array of rules, replaces them
//	DELETE /_fault/rules   no faults
//	POST   /_fault/drop    closes every connection in flight (a proxy restart, as seen by the client)
//	PUT    /_fault/down    answers every request by closing the connection; DELETE /_fault/down ends it
//	GET    /_fault/stats   JSON: requests seen and how often each rule fired
//
// A rule matches a request by method, a path substring and whether it is a
// watch; every matching rule with firings left applies in order: delays add
// up, the first status rule answers, the first stream rule shapes the answer.
//
//	{"method":"DELETE","path":"/pods/","delay":"300ms"}
//	{"watch":"false","path":"/configmaps","status":429,"retryAfter":1,"times":3}
//	{"watch":"true","cutAfterLines":2,"halfLine":true,"times":1}
//	{"method":"GET","status":500,"probability":0.3}
//	{"method":"DELETE","after":4,"delay":"60s"}   (4 pass, then every DELETE hangs)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Rule is one fault. Zero fields do not constrain or do nothing.
type Rule struct {
	Name   string `json:"name,omitempty"`
	Method string `json:"method,omitempty"` // e.g. DELETE; empty: any
	Path   string `json:"path,omitempty"`   // substring of the URL path; empty: any
	Watch  string `json:"watch,omitempty"`  // "true": watches only, "false": no watches, "": both
	// After lets this many matching requests pass untouched before the rule
	// starts to fire. Times bounds how often it fires then (0: always).
	After int `json:"after,omitempty"`
	Times int `json:"times,omitempty"`
	// Probability that a matching request is affected (0: always).
	Probability float64 `json:"probability,omitempty"`

	Delay      string `json:"delay,omitempty"`      // latency before forwarding, e.g. "300ms"
	Status     int    `json:"status,omitempty"`     // answer this status instead of forwarding
	RetryAfter int    `json:"retryAfter,omitempty"` // Retry-After header (seconds) with Status
	// CutAfterLines ends a forwarded answer abruptly after this many complete
	// lines (0 with HalfLine: at once). HalfLine first writes half of the next line.
	CutAfterLines int  `json:"cutAfterLines,omitempty"`
	HalfLine      bool `json:"halfLine,omitempty"`

	delay time.Duration
	seen  int
	fired int
}

func (r *Rule) matches(req *http.Request) bool {
	if r.Method != "" && !strings.EqualFold(r.Method, req.Method) {
		return false
	}
	if r.Path != "" && !strings.Contains(req.URL.Path, r.Path) {
		return false
	}
	isWatch := req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1"
	if (r.Watch == "true" && !isWatch) || (r.Watch == "false" && isWatch) {
		return false
	}
	return true
}

func (r *Rule) isStream() bool { return r.CutAfterLines > 0 || r.HalfLine }

// proxy is the fault-injecting reverse proxy and its control endpoint.
type proxy struct {
	rp *httputil.ReverseProxy

	mu       sync.Mutex
	rules    []*Rule
	requests int
	down     bool
	conns    map[net.Conn]struct{}
}

func parseRules(b []byte) ([]*Rule, error) {
	var rules []*Rule
	if err := json.Unmarshal(b, &rules); err != nil {
		return nil, fmt.Errorf("decode rules: %w", err)
	}
	for i, r := range rules {
		if r.Delay != "" {
			d, err := time.ParseDuration(r.Delay)
			if err != nil {
				return nil, fmt.Errorf("rule %d: delay: %w", i, err)
			}
			r.delay = d
		}
		if r.Watch != "" && r.Watch != "true" && r.Watch != "false" {
			return nil, fmt.Errorf("rule %d: watch must be \"true\", \"false\" or empty", i)
		}
		if r.Name == "" {
			r.Name = strconv.Itoa(i)
		}
	}
	return rules, nil
}

// pick decides, under the lock, which rules fire for req.
func (p *proxy) pick(req *http.Request) (delay time.Duration, status *Rule, stream *Rule, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if p.down {
		return 0, nil, nil, true
	}
	for _, r := range p.rules {
		if !r.matches(req) {
			continue
		}
		if r.seen++; r.seen <= r.After || (r.Times > 0 && r.fired >= r.Times) {
			continue
		}
		if r.Probability > 0 && rand.Float64() >= r.Probability {
			continue
		}
		used := false
		if r.delay > 0 {
			delay += r.delay
			used = true
		}
		if r.Status != 0 && status == nil {
			status, used = r, true
		}
		if r.isStream() && stream == nil && status == nil {
			stream, used = r, true
		}
		if used {
			r.fired++
		}
	}
	return delay, status, stream, false
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if strings.HasPrefix(req.URL.Path, "/_fault/") {
		p.control(w, req)
		return
	}
	delay, status, stream, down := p.pick(req)
	if down {
		abort(w)
		return
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
			return
		}
	}
	if status != nil {
		if status.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(status.RetryAfter))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status.Status)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"injected by faultproxy (rule %s)","reason":%q,"code":%d}`,
			status.Name, reasonFor(status.Status), status.Status)
		return
	}
	if stream != nil {
		req = req.WithContext(context.WithValue(req.Context(), streamKey{}, stream))
	}
	p.rp.ServeHTTP(w, req)
}

type streamKey struct{}

func reasonFor(code int) string {
	switch code {
	case 429:
		return "TooManyRequests"
	case 500:
		return "InternalError"
	case 503:
		return "ServiceUnavailable"
	case 504:
		return "Timeout"
	case 410:
		return "Expired"
	case 404:
		return "NotFound"
	case 403:
		return "Forbidden"
	}
	return strings.ReplaceAll(http.StatusText(code), " ", "")
}

// abort ends the answer by dropping the connection.
func abort(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// cutter passes lines through and fails after rule.CutAfterLines of them,
// having written half of the next one if rule.HalfLine.
type cutter struct {
	src   *bufio.Reader
	body  io.Closer
	rule  *Rule
	lines int
	buf   bytes.Buffer
	done  bool
}

var errCut = errors.New("faultproxy: stream cut")

func (c *cutter) Read(p []byte) (int, error) {
	for c.buf.Len() == 0 {
		if c.done {
			return 0, errCut
		}
		if c.lines >= c.rule.CutAfterLines {
			c.done = true
			if c.rule.HalfLine {
				line, err := c.src.ReadBytes('\n')
				if len(line) > 1 {
					c.buf.Write(line[:len(line)/2])
				} else if err != nil {
					return 0, errCut
				}
			}
			continue
		}
		line, err := c.src.ReadBytes('\n')
		c.buf.Write(line)
		if len(line) > 0 && line[len(line)-1] == '\n' {
			c.lines++
		}
		if err != nil && c.buf.Len() == 0 {
			return 0, err
		}
		if err != nil {
			c.done = true // upstream ended: pass on what is left, then end as it did
			n, _ := c.buf.Read(p)
			return n, nil
		}
	}
	return c.buf.Read(p)
}

func (c *cutter) Close() error { return c.body.Close() }

func (p *proxy) control(w http.ResponseWriter, req *http.Request) {
	switch {
	case req.URL.Path == "/_fault/rules" && (req.Method == http.MethodPut || req.Method == http.MethodPost):
		b, err := io.ReadAll(req.Body)
		if err == nil {
			var rules []*Rule
			if rules, err = parseRules(b); err == nil {
				p.mu.Lock()
				p.rules = rules
				p.mu.Unlock()
				log.Printf("rules set: %s", bytes.TrimSpace(b))
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		http.Error(w, err.Error(), http.StatusBadRequest)
	case req.URL.Path == "/_fault/rules" && req.Method == http.MethodDelete:
		p.mu.Lock()
		p.rules = nil
		p.mu.Unlock()
		log.Printf("rules cleared")
		w.WriteHeader(http.StatusNoContent)
	case req.URL.Path == "/_fault/drop" && req.Method == http.MethodPost:
		n := p.dropAll(connOf(req))
		log.Printf("dropped %d connections", n)
		fmt.Fprintf(w, "%d\n", n)
	case req.URL.Path == "/_fault/down" && (req.Method == http.MethodPut || req.Method == http.MethodDelete):
		p.mu.Lock()
		p.down = req.Method == http.MethodPut
		down := p.down
		p.mu.Unlock()
		if down {
			p.dropAll(connOf(req))
		}
		log.Printf("down=%v", down)
		w.WriteHeader(http.StatusNoContent)
	case req.URL.Path == "/_fault/stats" && req.Method == http.MethodGet:
		p.mu.Lock()
		fired := map[string]int{}
		for _, r := range p.rules {
			fired[r.Name] = r.fired
		}
		out := map[string]any{"requests": p.requests, "fired": fired, "down": p.down, "connections": len(p.conns)}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	default:
		http.Error(w, "unknown control request", http.StatusNotFound)
	}
}

type connKey struct{}

func connOf(req *http.Request) net.Conn {
	c, _ := req.Context().Value(connKey{}).(net.Conn)
	return c
}

// dropAll closes every client connection, idle ones included, except the
// one carrying the control request.
func (p *proxy) dropAll(except net.Conn) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if c != except {
			c.Close()
			n++
		}
	}
	return n
}

func (p *proxy) connState(c net.Conn, s http.ConnState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch s {
	case http.StateNew:
		p.conns[c] = struct{}{}
	case http.StateHijacked, http.StateClosed:
		delete(p.conns, c)
	}
}

func newProxy(upstream *url.URL) *proxy {
	p := &proxy{conns: map[net.Conn]struct{}{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Host = upstream.Host // kubectl proxy checks the Host header
		},
		FlushInterval: -1, // watches: pass every line on at once
		ModifyResponse: func(resp *http.Response) error {
			if r, ok := resp.Request.Context().Value(streamKey{}).(*Rule); ok {
				resp.Body = &cutter{src: bufio.NewReader(resp.Body), body: resp.Body, rule: r}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, errCut) {
				panic(http.ErrAbortHandler) // drop the connection mid-answer
			}
			log.Printf("upstream %s %s: %v", r.Method, r.URL, err)
			w.WriteHeader(http.StatusBadGateway)
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	return p
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstreamFlag := flag.String("upstream", "http://127.0.0.1:8001", "URL of the API (the kubectl proxy)")
	rulesFlag := flag.String("rules", "", "initial rules: a JSON array, or @FILE")
	addrFile := flag.String("addr-file", "", "write the listening address (host:port) to this file")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("faultproxy: ")

	upstream, err := url.Parse(*upstreamFlag)
	if err != nil || upstream.Scheme == "" || upstream.Host == "" {
		log.Fatalf("-upstream %q: not an absolute URL", *upstreamFlag)
	}
	p := newProxy(upstream)
	if *rulesFlag != "" {
		b := []byte(*rulesFlag)
		if strings.HasPrefix(*rulesFlag, "@") {
			if b, err = os.ReadFile((*rulesFlag)[1:]); err != nil {
				log.Fatalf("-rules: %v", err)
			}
		}
		if p.rules, err = parseRules(b); err != nil {
			log.Fatalf("-rules: %v", err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile+".tmp", []byte(addr), 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(*addrFile+".tmp", *addrFile); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("listening on http://%s\n", addr)
	srv := &http.Server{
		Handler: p, ConnState: p.connState, ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
