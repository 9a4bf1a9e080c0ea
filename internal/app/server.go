package app

import (
	"net/http"
	"time"
)

// newHTTPServer is the server of /healthz, /readyz and /metrics. It listens
// on every interface (the kubelet and the scraper connect from outside the
// pod), so each stage of a connection is bounded: a client that stalls
// holds a connection and its goroutine only that long.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler: h,
		// The probes and the scrape are GETs without a body: their headers,
		// then the whole request, arrive at once or not at all.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// From the end of the headers to the end of the answer: far above
		// what /metrics takes to write, and above Prometheus's default
		// scrape timeout (10 s), so a slow scrape fails on its side first.
		WriteTimeout: 30 * time.Second,
		// Above the monitoring component's scrape interval (30 s) and the
		// common 60 s, so Prometheus keeps reusing its connection.
		IdleTimeout: 90 * time.Second,
	}
}
