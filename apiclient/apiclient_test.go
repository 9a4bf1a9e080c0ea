package apiclient_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// waitLimit bounds a wait for a failing test; it is never a pause.
const waitLimit = 10 * time.Second

// seenRequest is what the test server received.
type seenRequest struct {
	Method      string
	Path        string // decoded
	EscapedPath string // as sent
	Query       url.Values
	Header      http.Header
	Body        string
}

// recordingServer answers every request with answer and records it.
type recordingServer struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func newRecordingServer(t *testing.T, answer http.HandlerFunc) *recordingServer {
	t.Helper()
	s := &recordingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, seenRequest{Method: r.Method, Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(),
			Query: r.URL.Query(), Header: r.Header.Clone(), Body: string(body)})
		s.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *recordingServer) requests() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenRequest(nil), s.seen...)
}

// last returns the one request the server received.
func (s *recordingServer) only(t *testing.T) seenRequest {
	t.Helper()
	reqs := s.requests()
	require.Len(t, reqs, 1)
	return reqs[0]
}

func answerJSON(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

func newClient(t *testing.T, base string) *apiclient.Client {
	t.Helper()
	c, err := apiclient.New(base, "config-watcher/test")
	require.NoError(t, err)
	return c
}

// TestNewRejectsBadBaseURLs ensures New refuses a base URL it could not send
// requests to, and accepts http and https URLs with or without a path.
func TestNewRejectsBadBaseURLs(t *testing.T) {
	tests := []struct {
		name    string
		base    string
		wantErr string // empty: accepted
	}{
		{name: "PlainHTTPAccepted", base: "http://localhost:8001"},
		{name: "HTTPSAccepted", base: "https://10.0.0.1:6443"},
		{name: "PathPrefixAccepted", base: "http://localhost:8001/proxy/"},
		{name: "EmptyRefused", base: "", wantErr: "scheme"},
		{name: "HostPortWithoutSchemeRefused", base: "localhost:8001", wantErr: "scheme"},
		{name: "PathOnlyRefused", base: "/api/v1", wantErr: "scheme"},
		{name: "OtherSchemeRefused", base: "ftp://localhost:8001", wantErr: "scheme"},
		{name: "NoHostRefused", base: "http://", wantErr: "no host"},
		{name: "NoHostWithPathRefused", base: "http:///api", wantErr: "no host"},
		{name: "UnparsableRefused", base: "http://[::1", wantErr: "parse base URL"},
		{name: "ControlCharacterRefused", base: "http://localhost:8001/\x7f", wantErr: "parse base URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := apiclient.New(tt.base, "ua")
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.NotNil(t, c)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.Nil(t, c)
		})
	}
}

// TestBaseURLPathPrefixHonoured ensures a base URL's path (an ambassador
// serving the API under a prefix) comes before every request path, with or
// without a trailing slash, its escaping kept.
func TestBaseURLPathPrefixHonoured(t *testing.T) {
	tests := []struct {
		name     string
		prefix   string
		wantPath string
	}{
		{name: "NoPrefix", prefix: "", wantPath: "/api/v1/namespaces/default/configmaps"},
		{name: "RootSlash", prefix: "/", wantPath: "/api/v1/namespaces/default/configmaps"},
		{name: "Prefix", prefix: "/proxy", wantPath: "/proxy/api/v1/namespaces/default/configmaps"},
		{name: "PrefixTrailingSlash", prefix: "/proxy/", wantPath: "/proxy/api/v1/namespaces/default/configmaps"},
		{name: "EscapedPrefixKept", prefix: "/k8s%2Fapi", wantPath: "/k8s%2Fapi/api/v1/namespaces/default/configmaps"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecordingServer(t, answerJSON(http.StatusOK, `{}`))
			c := newClient(t, srv.URL+tt.prefix)
			_, err := c.Get(context.Background(), apiclient.CorePath("default", "configmaps", ""), nil, "")
			require.NoError(t, err)
			assert.Equal(t, tt.wantPath, srv.only(t).EscapedPath)
		})
	}
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNewWithTransportSendsThroughIt ensures a client given a transport
// sends its requests there and nowhere else (no socket is opened: the base
// URL's host does not exist).
func TestNewWithTransportSendsThroughIt(t *testing.T) {
	var got []string
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = append(got, r.Method+" "+r.URL.String())
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{"kind":"ConfigMap"}`)), Request: r}, nil
	})
	c, err := apiclient.NewWithTransport("http://sim.invalid", "test", rt)
	require.NoError(t, err)
	body, err := c.Get(context.Background(), apiclient.CorePath("ns", "configmaps", "a"), nil, "")
	require.NoError(t, err)
	assert.JSONEq(t, `{"kind":"ConfigMap"}`, string(body))
	assert.Equal(t, []string{"GET http://sim.invalid/api/v1/namespaces/ns/configmaps/a"}, got)
}

// TestGroupPathHasTheAPIsShape ensures paths of API-group resources have the /apis shape.
func TestGroupPathHasTheAPIsShape(t *testing.T) {
	assert.Equal(t, "/apis/coordination.k8s.io/v1/namespaces/ns/leases", apiclient.GroupPath("coordination.k8s.io", "v1", "ns", "leases", ""))
	assert.Equal(t, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/cw", apiclient.GroupPath("coordination.k8s.io", "v1", "ns", "leases", "cw"))
}

// TestCorePathEscapesSegments ensures CorePath escapes each segment, so that
// no namespace or name can add a segment, a query or a fragment, and that the
// server reads the name back unchanged.
func TestCorePathEscapesSegments(t *testing.T) {
	tests := []struct {
		name                      string
		namespace, resource, item string
		want                      string
	}{
		{name: "Collection", namespace: "default", resource: "configmaps", want: "/api/v1/namespaces/default/configmaps"},
		{name: "NamedObject", namespace: "default", resource: "pods", item: "webapp-7d4b9c-x2x8q", want: "/api/v1/namespaces/default/pods/webapp-7d4b9c-x2x8q"},
		{name: "SlashEscaped", namespace: "default", resource: "pods", item: "a/b", want: "/api/v1/namespaces/default/pods/a%2Fb"},
		{name: "QueryAndFragmentEscaped", namespace: "default", resource: "pods", item: "a?watch=true#x", want: "/api/v1/namespaces/default/pods/a%3Fwatch=true%23x"},
		{name: "PercentAndSpaceEscaped", namespace: "default", resource: "pods", item: "50% off", want: "/api/v1/namespaces/default/pods/50%25%20off"},
		{name: "NamespaceEscaped", namespace: "kube/system", resource: "configmaps", want: "/api/v1/namespaces/kube%2Fsystem/configmaps"},
		{name: "DotDotCannotClimb", namespace: "default", resource: "pods", item: "..", want: "/api/v1/namespaces/default/pods/%2E%2E"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := apiclient.CorePath(tt.namespace, tt.resource, tt.item)
			assert.Equal(t, tt.want, p)

			srv := newRecordingServer(t, answerJSON(http.StatusOK, `{}`))
			_, err := newClient(t, srv.URL).Get(context.Background(), p, nil, "")
			require.NoError(t, err)
			got := srv.only(t)
			assert.Equal(t, tt.want, got.EscapedPath, "sent as escaped")
			assert.Empty(t, got.Query, "nothing leaked into the query")
			segments := strings.Split(strings.TrimPrefix(got.EscapedPath, "/"), "/")
			if tt.item != "" {
				require.Len(t, segments, 6)
				name, err := url.PathUnescape(segments[5])
				require.NoError(t, err)
				assert.Equal(t, tt.item, name)
			} else {
				assert.Len(t, segments, 5)
			}
		})
	}
}

// TestQueryReachesServerIntact ensures query values built with url.Values
// arrive exactly, whatever characters they hold, for unary and streaming
// requests alike.
func TestQueryReachesServerIntact(t *testing.T) {
	q := url.Values{
		"labelSelector":   {"app=webapp,tier in (a,b),!canary"},
		"continue":        {"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTAwMH0="},
		"fieldSelector":   {"metadata.name=a&b=c"},
		"weird":           {"a&b=c?d#e%f+g h/é;x"},
		"resourceVersion": {"12345"},
		"multi":           {"1", "2"},
		"empty":           {""},
	}
	t.Run("Get", func(t *testing.T) {
		srv := newRecordingServer(t, answerJSON(http.StatusOK, `{}`))
		_, err := newClient(t, srv.URL).Get(context.Background(), "/api/v1/pods", q, "")
		require.NoError(t, err)
		assert.Equal(t, q, srv.only(t).Query)
	})
	t.Run("Stream", func(t *testing.T) {
		srv := newRecordingServer(t, answerJSON(http.StatusOK, ""))
		body, err := newClient(t, srv.URL).Stream(context.Background(), "/api/v1/pods", q, "")
		require.NoError(t, err)
		require.NoError(t, body.Close())
		assert.Equal(t, q, srv.only(t).Query)
	})
}

// TestRequestShape ensures each verb sends its method, body, Content-Type,
// Accept and User-Agent.
func TestRequestShape(t *testing.T) {
	deleteOptions := `{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"5b0b1f2a-8f57-4a8e-9b1e-2f0c7e9d1a01"}}`
	patch := `{"metadata":{"annotations":{"k8spatterns.io/podDeleteSelector":null}}}`
	tests := []struct {
		name            string
		call            func(c *apiclient.Client) ([]byte, error)
		wantMethod      string
		wantContentType string
		wantAccept      string
		wantBody        string
	}{
		{
			name:       "GetDefaultAcceptJSON",
			call:       func(c *apiclient.Client) ([]byte, error) { return c.Get(context.Background(), "/version", nil, "") },
			wantMethod: http.MethodGet, wantAccept: "application/json",
		},
		{
			name: "GetOwnAccept",
			call: func(c *apiclient.Client) ([]byte, error) {
				return c.Get(context.Background(), "/version", nil, "application/json;as=Table;v=v1;g=meta.k8s.io")
			},
			wantMethod: http.MethodGet, wantAccept: "application/json;as=Table;v=v1;g=meta.k8s.io",
		},
		{
			name: "MergePatchContentType",
			call: func(c *apiclient.Client) ([]byte, error) {
				return c.MergePatch(context.Background(), "/api/v1/namespaces/default/configmaps/webapp-config", []byte(patch))
			},
			wantMethod: http.MethodPatch, wantContentType: "application/merge-patch+json", wantAccept: "application/json", wantBody: patch,
		},
		{
			name: "DeleteSendsBody",
			call: func(c *apiclient.Client) ([]byte, error) {
				return c.Delete(context.Background(), "/api/v1/namespaces/default/pods/webapp-1", []byte(deleteOptions))
			},
			wantMethod: http.MethodDelete, wantContentType: "application/json", wantAccept: "application/json", wantBody: deleteOptions,
		},
		{
			name: "CreatePostsBody",
			call: func(c *apiclient.Client) ([]byte, error) {
				return c.Create(context.Background(), "/apis/coordination.k8s.io/v1/namespaces/default/leases", []byte(`{"kind":"Lease"}`))
			},
			wantMethod: http.MethodPost, wantContentType: "application/json", wantAccept: "application/json", wantBody: `{"kind":"Lease"}`,
		},
		{
			name: "UpdatePutsBody",
			call: func(c *apiclient.Client) ([]byte, error) {
				return c.Update(context.Background(), "/apis/coordination.k8s.io/v1/namespaces/default/leases/cw", []byte(`{"kind":"Lease"}`))
			},
			wantMethod: http.MethodPut, wantContentType: "application/json", wantAccept: "application/json", wantBody: `{"kind":"Lease"}`,
		},
		{
			name: "DeleteWithoutBody",
			call: func(c *apiclient.Client) ([]byte, error) {
				return c.Delete(context.Background(), "/api/v1/namespaces/default/pods/webapp-1", nil)
			},
			wantMethod: http.MethodDelete, wantContentType: "application/json", wantAccept: "application/json",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRecordingServer(t, answerJSON(http.StatusOK, `{"kind":"Pod"}`))
			got, err := tt.call(newClient(t, srv.URL))
			require.NoError(t, err)
			assert.Equal(t, `{"kind":"Pod"}`, string(got))
			req := srv.only(t)
			assert.Equal(t, tt.wantMethod, req.Method)
			assert.Equal(t, tt.wantBody, req.Body)
			assert.Equal(t, tt.wantContentType, req.Header.Get("Content-Type"))
			assert.Equal(t, tt.wantAccept, req.Header.Get("Accept"))
			assert.Equal(t, "config-watcher/test", req.Header.Get("User-Agent"))
		})
	}
}

// TestRelativePathRefused ensures a path that does not start with / is
// refused before anything is sent.
func TestRelativePathRefused(t *testing.T) {
	srv := newRecordingServer(t, answerJSON(http.StatusOK, `{}`))
	c := newClient(t, srv.URL)
	_, err := c.Get(context.Background(), "api/v1/pods", nil, "")
	assert.ErrorContains(t, err, "not absolute")
	_, err = c.Stream(context.Background(), "api/v1/pods", nil, "")
	assert.ErrorContains(t, err, "not absolute")
	assert.Empty(t, srv.requests())
}

// TestStreamDeliversLinesAsFlushed ensures Stream hands over each line as
// soon as the server flushes it, not when the response ends, and asks for an
// uncompressed stream.
func TestStreamDeliversLinesAsFlushed(t *testing.T) {
	readFirst := make(chan struct{})
	srv := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"1"}}}`+"\n")
		w.(http.Flusher).Flush()
		select { // the second line only once the client has read the first
		case <-readFirst:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"2"}}}`+"\n")
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	body, err := newClient(t, srv.URL).Stream(ctx, "/api/v1/namespaces/default/configmaps", url.Values{"watch": {"true"}}, "")
	require.NoError(t, err)
	defer body.Close()
	br := bufio.NewReader(body)
	line, err := br.ReadString('\n')
	require.NoError(t, err, "first line not delivered before the response ended")
	assert.Contains(t, line, `"resourceVersion":"1"`)
	assert.Equal(t, "identity", srv.only(t).Header.Get("Accept-Encoding"), "a compressed watch would hold events back")
	close(readFirst)
	line, err = br.ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, line, `"resourceVersion":"2"`)
	_, err = br.ReadString('\n')
	assert.ErrorIs(t, err, io.EOF)
}

// TestStreamEndsWhenContextCancelled ensures cancelling a stream's context
// ends a read that waits on a silent server.
func TestStreamEndsWhenContextCancelled(t *testing.T) {
	srv := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	body, err := newClient(t, srv.URL).Stream(ctx, "/api/v1/pods", url.Values{"watch": {"true"}}, "")
	require.NoError(t, err)
	defer body.Close()
	readErr := make(chan error, 1)
	go func() {
		_, err := body.Read(make([]byte, 1))
		readErr <- err
	}()
	cancel()
	select {
	case err := <-readErr:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(waitLimit):
		t.Fatal("read still blocked after the context was cancelled")
	}
}

// TestRequestTimeoutBoundsUnaryNotStreams ensures RequestTimeout ends unary
// requests (with a retryable error) and leaves streams alone.
func TestRequestTimeoutBoundsUnaryNotStreams(t *testing.T) {
	srv := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "{}\n")
			return
		}
		<-r.Context().Done() // a unary request that never gets an answer
	})
	c := newClient(t, srv.URL)
	c.RequestTimeout = time.Nanosecond

	_, err := c.Get(context.Background(), "/api/v1/pods", nil, "")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	body, err := c.Stream(context.Background(), "/api/v1/pods", url.Values{"watch": {"true"}}, "")
	require.NoError(t, err, "a stream is not bounded by RequestTimeout")
	got, err := io.ReadAll(body)
	require.NoError(t, err)
	assert.Equal(t, "{}\n", string(got))
	require.NoError(t, body.Close())
}

// TestGetBodyStreamsTheAnswer ensures GetBody hands over the body before the
// server has finished it (a list page is decoded as it arrives), sends the
// request as Get does, and turns a non-2xx answer into a StatusError.
func TestGetBodyStreamsTheAnswer(t *testing.T) {
	t.Run("BodyReadableBeforeTheEnd", func(t *testing.T) {
		readFirst := make(chan struct{})
		srv := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"items":[`+"\n")
			w.(http.Flusher).Flush()
			select {
			case <-readFirst:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "]}\n")
		})
		body, err := newClient(t, srv.URL).GetBody(context.Background(), "/api/v1/namespaces/default/configmaps", url.Values{"limit": {"2"}}, "application/json;as=Test")
		require.NoError(t, err)
		defer body.Close()
		br := bufio.NewReader(body)
		line, err := br.ReadString('\n')
		require.NoError(t, err, "first part not delivered before the response ended")
		assert.Equal(t, `{"items":[`+"\n", line)
		close(readFirst)
		rest, err := io.ReadAll(br)
		require.NoError(t, err)
		assert.Equal(t, "]}\n", string(rest))
		req := srv.only(t)
		assert.Equal(t, http.MethodGet, req.Method)
		assert.Equal(t, "2", req.Query.Get("limit"))
		assert.Equal(t, "application/json;as=Test", req.Header.Get("Accept"))
	})
	t.Run("NotFoundIsAStatusError", func(t *testing.T) {
		srv := newRecordingServer(t, answerJSON(http.StatusNotFound, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		body, err := newClient(t, srv.URL).GetBody(context.Background(), "/api/v1/namespaces/x/configmaps", nil, "")
		assert.Nil(t, body)
		assert.True(t, apiclient.IsNotFound(err), "got %v", err)
	})
}
