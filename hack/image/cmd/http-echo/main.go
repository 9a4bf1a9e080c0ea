// Command http-echo answers every HTTP request with the text it was started with: the
// demo's web server, taking the place of hashicorp/http-echo (same -listen and -text
// flags), which cannot be pulled here. The demo passes the ConfigMap's message as
// -text=$(MESSAGE), so a pod serves the message it was created with.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":5678", "address to serve on")
	text := flag.String("text", "", "the text to answer with")
	flag.Parse()
	if *text == "" {
		fmt.Fprintln(os.Stderr, "http-echo: -text is required")
		os.Exit(2)
	}
	srv := &http.Server{
		Addr:              *listen,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintln(w, *text)
		}),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("http-echo: %v", err)
	}
}
