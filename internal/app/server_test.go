package app

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pipeListener hands the server the far ends of net.Pipe connections, so
// that a test's connections live in memory and on synctest's clock.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { close(l.done); return nil }
func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// TestHTTPServerDisconnectsStalledClients ensures that a client of the
// probe and metrics port that stops at any stage of a connection (inside
// the headers, inside a body, not reading the answer, idle between
// requests) is disconnected within that stage's bound, so that stalled
// clients cannot pile up connections.
func TestHTTPServerDisconnectsStalledClients(t *testing.T) {
	const request = "GET /metrics HTTP/1.1\r\nHost: pod\r\n"
	bigAnswer := strings.Repeat("x", 1<<20) // more than any buffer between handler and client
	for _, tc := range []struct {
		name  string
		bound func(*http.Server) time.Duration
		// stall writes what the client sends before it stops.
		stall func(t *testing.T, c net.Conn)
	}{
		{"InsideTheHeaders", func(s *http.Server) time.Duration { return s.ReadHeaderTimeout }, func(t *testing.T, c net.Conn) {
			_, err := io.WriteString(c, request)
			require.NoError(t, err)
		}},
		{"InsideTheBody", func(s *http.Server) time.Duration { return s.ReadTimeout }, func(t *testing.T, c net.Conn) {
			_, err := io.WriteString(c, request+"Content-Length: 100\r\n\r\npartial")
			require.NoError(t, err)
		}},
		{"NotReadingTheAnswer", func(s *http.Server) time.Duration { return s.WriteTimeout }, func(t *testing.T, c net.Conn) {
			_, err := io.WriteString(c, request+"X-Answer: big\r\n\r\n")
			require.NoError(t, err)
		}},
		{"IdleBetweenRequests", func(s *http.Server) time.Duration { return s.IdleTimeout }, func(t *testing.T, c net.Conn) {
			_, err := io.WriteString(c, request+"\r\n")
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-Answer") == "big" {
						_, _ = io.WriteString(w, bigAnswer)
						return
					}
					_, _ = io.WriteString(w, "ok\n")
				}))
				ln := newPipeListener()
				go func() { _ = srv.Serve(ln) }()
				defer srv.Close()

				bound := tc.bound(srv)
				if bound == 0 {
					bound = time.Hour // unbounded: an hour on synctest's clock shows it
				}
				c := ln.dial()
				defer c.Close()
				require.NoError(t, c.SetReadDeadline(time.Now().Add(bound+time.Second)))
				tc.stall(t, c)
				// Only now does the client read again, from a connection
				// the server must have closed: an EOF before the answer
				// is complete, not the answer itself nor a wait beyond
				// the bound.
				time.Sleep(bound)
				got, err := io.ReadAll(c)
				var timeout net.Error
				assert.False(t, errors.As(err, &timeout) && timeout.Timeout(), "the connection is still open %v after the client stalled", bound+time.Second)
				assert.Less(t, len(got), len(bigAnswer), "the client got the whole answer it did not read in time")
			})
		})
	}
}
