package apiclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripFunc answers requests in memory.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// pacedServer answers with a body whose parts come after the given pauses,
// and, as http.Transport does, ends the body when the request's context ends.
func pacedServer(pauses []time.Duration) roundTripFunc {
	return func(r *http.Request) (*http.Response, error) {
		pr, pw := io.Pipe()
		go func() {
			<-r.Context().Done()
			pr.CloseWithError(r.Context().Err())
		}()
		go func() {
			for i, d := range pauses {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return
				}
				if _, err := fmt.Fprintf(pw, "part %d\n", i); err != nil {
					return
				}
			}
			pw.Close()
		}()
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: pr, Request: r}, nil
	}
}

// TestGetBodyTimeoutBoundsEachSilence ensures GetBody's RequestTimeout bounds
// each silence of the body, not the whole body: a page of large objects over
// a slow link may take longer than RequestTimeout in all; a body that stops
// for RequestTimeout is cut. The pauses and the timeout are exact on
// synctest's clock, so a busy machine cannot make a part late (which is why
// the server is in memory: a socket would keep that clock from moving).
func TestGetBodyTimeoutBoundsEachSilence(t *testing.T) {
	const timeout = 200 * time.Millisecond
	steady := timeout - time.Millisecond
	for _, tt := range []struct {
		name      string
		pauses    []time.Duration // before each part
		wantParts int
		wantErr   error
	}{
		{"ASteadyBodyMayOutlastRequestTimeout", []time.Duration{steady, steady, steady, steady, steady, steady}, 6, nil},
		{"ASilenceOfRequestTimeoutCutsTheBody", []time.Duration{0, steady, timeout + time.Millisecond, 0}, 2, context.DeadlineExceeded},
		{"ASilenceBeforeTheFirstPartCounts", []time.Duration{timeout + time.Millisecond}, 0, context.DeadlineExceeded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, err := New("http://api.test", "config-watcher/test")
				require.NoError(t, err)
				c.http.Transport = pacedServer(tt.pauses)
				c.RequestTimeout = timeout
				started := time.Now()
				body, err := c.GetBody(context.Background(), "/api/v1/configmaps", nil, "")
				require.NoError(t, err)
				defer body.Close()
				data, err := io.ReadAll(body)
				if tt.wantErr == nil {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, tt.wantErr)
				}
				assert.Equal(t, tt.wantParts, strings.Count(string(data), "part "))
				if tt.wantErr == nil {
					assert.Greater(t, time.Since(started), timeout, "the body took longer than RequestTimeout in all")
				}
			})
		})
	}
}
