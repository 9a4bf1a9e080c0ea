// Package apiclient is a minimal HTTP client for the Kubernetes API behind an
// ambassador (kubectl proxy) that adds TLS and the token. It knows HTTP, paths,
// paged lists, how long to wait before retrying a request, and the API's
// Status object; nothing of ConfigMaps or deletion policy.
// Every request is built by newRequest; every non-2xx answer becomes a
// *StatusError.
package apiclient

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// Accept headers that ask for metadata only. A server that cannot serve
// metadata alone sends whole objects, which read the same way.
const (
	MetadataListAccept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	MetadataAccept     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

const (
	contentJSON       = "application/json"
	contentMergePatch = "application/merge-patch+json"
	// maxResponseBytes bounds a unary answer, which is one object (lists
	// are streamed: GetBody): a ConfigMap or Secret of 1 MiB of data, a few
	// times that once JSON-escaped. Far more would be a fault or an attack,
	// and must not take the controller's 64 Mi limit.
	maxResponseBytes = 16 << 20
)

// Client sends requests to one API server base URL.
type Client struct {
	base      *url.URL
	http      *http.Client
	userAgent string
	// RequestTimeout bounds every request but a Stream, body included; for
	// GetBody, each silence of the body instead of the whole body.
	RequestTimeout time.Duration
}

// New returns a client for baseURL, e.g. "http://localhost:8001".
func New(baseURL, userAgent string) (*Client, error) {
	// No client Timeout: it would end streams too (see RequestTimeout).
	return NewWithTransport(baseURL, userAgent, &http.Transport{
		Proxy:                 nil, // the ambassador is the proxy; never route it through HTTP_PROXY
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
	})
}

// NewWithTransport returns a client for baseURL that sends every request
// through transport: the simulator's in-memory cluster answers without a
// socket, which a synctest bubble's clock could not move past.
func NewWithTransport(baseURL, userAgent string, transport http.RoundTripper) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("parse base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("base URL %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("base URL %q: no host", baseURL)
	}
	return &Client{base: u, http: &http.Client{Transport: transport}, userAgent: userAgent, RequestTimeout: 30 * time.Second}, nil
}

// Get reads path and returns the whole response body.
func (c *Client) Get(ctx context.Context, path string, query url.Values, accept string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, path, query, accept, "", nil)
}

// GetBody reads path and returns the response body as it arrives, for answers
// too large to hold at once (a list page). The caller closes it. A page of
// large objects over a slow link may take longer than RequestTimeout; only a
// body that stops for that long is cut.
func (c *Client) GetBody(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	body := newIdleBody(c.RequestTimeout, cancel)
	req, err := c.newRequest(ctx, http.MethodGet, path, query, accept, "", nil)
	if err != nil {
		body.Close()
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		body.Close()
		return nil, body.explain(err)
	}
	body.ReadCloser = resp.Body
	return body, nil
}

// Stream opens a long-running GET (a watch), which only ctx ends, and returns
// its body once the server has answered 2xx. The caller closes it.
func (c *Client) Stream(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path, query, accept, "", nil)
	if err != nil {
		return nil, err
	}
	// kube-apiserver may gzip a watch, and the compressor then holds events
	// back (docs/memory.md). Lists stay compressed: through the ambassador
	// that costs less than copying them whole.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Delete deletes the object at path; body is a DeleteOptions document or nil.
func (c *Client) Delete(ctx context.Context, path string, body []byte) ([]byte, error) {
	return c.do(ctx, http.MethodDelete, path, nil, contentJSON, contentJSON, body)
}

// Create posts a new object (or a subresource such as an eviction) to path.
func (c *Client) Create(ctx context.Context, path string, body []byte) ([]byte, error) {
	return c.do(ctx, http.MethodPost, path, nil, contentJSON, contentJSON, body)
}

// Update replaces the object at path. The body's metadata.resourceVersion
// makes it conditional: a stale one answers 409 Conflict.
func (c *Client) Update(ctx context.Context, path string, body []byte) ([]byte, error) {
	return c.do(ctx, http.MethodPut, path, nil, contentJSON, contentJSON, body)
}

// MergePatch applies a JSON merge patch (RFC 7386) to the object at path.
func (c *Client) MergePatch(ctx context.Context, path string, patch []byte) ([]byte, error) {
	return c.do(ctx, http.MethodPatch, path, nil, contentJSON, contentMergePatch, patch)
}

// do sends a request and reads the whole answer, both within RequestTimeout.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, accept, contentType string, body []byte) ([]byte, error) {
	if c.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.RequestTimeout)
		defer cancel()
	}
	req, err := c.newRequest(ctx, method, path, query, accept, contentType, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s %s: read body: %w", method, path, err)
	case len(data) > maxResponseBytes:
		// Refused, not cut: a truncated object would be misread.
		return nil, fmt.Errorf("%s %s: answer larger than %d bytes", method, path, maxResponseBytes)
	}
	return data, nil
}

// send sends a request built by newRequest and returns a 2xx answer, whose
// body the caller closes; any other answer becomes a *StatusError.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		path := strings.TrimPrefix(req.URL.EscapedPath(), strings.TrimSuffix(c.base.EscapedPath(), "/"))
		return nil, statusFromResponse(resp, accessOf(req.Method, path, req.URL.Query()))
	}
	return resp, nil
}

// idleBody ends its request when nothing arrives for timeout: the wait for
// the answer, then each silence of the body. A slow but steady body is never
// cut, a stalled one never hangs its reader.
type idleBody struct {
	io.ReadCloser
	timeout time.Duration
	cancel  context.CancelFunc
	timer   *time.Timer // nil: no timeout
	stalled atomic.Bool // the timer ended the request
}

func newIdleBody(timeout time.Duration, cancel context.CancelFunc) *idleBody {
	b := &idleBody{timeout: timeout, cancel: cancel}
	if timeout > 0 {
		b.timer = time.AfterFunc(timeout, func() {
			b.stalled.Store(true)
			cancel()
		})
	}
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.timer != nil && err == nil {
		b.timer.Reset(b.timeout)
	}
	return n, b.explain(err)
}

// Close stops the timer and ends the request; the body, once there, is closed too.
func (b *idleBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	b.cancel()
	if b.ReadCloser == nil {
		return nil
	}
	return b.ReadCloser.Close()
}

// explain names the timer as the cause of an error it caused.
func (b *idleBody) explain(err error) error {
	if err != nil && b.stalled.Load() {
		return fmt.Errorf("no data for %s: %w", b.timeout, context.DeadlineExceeded)
	}
	return err
}

// newRequest is the one place requests are built: base URL, path, query
// (always through url.Values), headers.
func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, accept, contentType string, body []byte) (*http.Request, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("create request: path %q is not absolute", path)
	}
	// path arrives escaped (see CorePath); set both forms so that url.URL
	// writes exactly that escaping.
	u := *c.base
	u.RawPath = strings.TrimSuffix(c.base.EscapedPath(), "/") + path
	unescaped, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("create request: path %q: %w", path, err)
	}
	u.Path = unescaped
	u.RawQuery = query.Encode()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), r)
	if err != nil {
		return nil, fmt.Errorf("create request: %w", err)
	}
	if accept == "" {
		accept = contentJSON
	}
	req.Header.Set("Accept", accept)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	return req, nil
}

// CorePath is the path of a core/v1 resource in a namespace, or of one named
// object when name is not empty. Segments are escaped so a name can never
// change the path's shape.
func CorePath(namespace, resource, name string) string {
	return withName("/api/v1/namespaces/"+segment(namespace)+"/"+segment(resource), name)
}

// CoreClusterPath is the path of a core/v1 resource across all namespaces.
func CoreClusterPath(resource string) string { return "/api/v1/" + segment(resource) }

// GroupPath is CorePath for a resource of an API group.
func GroupPath(group, version, namespace, resource, name string) string {
	return withName("/apis/"+segment(group)+"/"+segment(version)+"/namespaces/"+segment(namespace)+"/"+segment(resource), name)
}

// ObjectPath is the path of a resource of apiVersion ("v1" for the core
// group, else "group/version") in a namespace, or of one named object.
func ObjectPath(apiVersion, namespace, resource, name string) string {
	group, version, grouped := strings.Cut(apiVersion, "/")
	if !grouped {
		return withName("/api/"+segment(apiVersion)+"/namespaces/"+segment(namespace)+"/"+segment(resource), name)
	}
	return GroupPath(group, version, namespace, resource, name)
}

// DiscoveryPath is the path of apiVersion's discovery document, the list of
// its resources and their subresources.
func DiscoveryPath(apiVersion string) string {
	group, version, grouped := strings.Cut(apiVersion, "/")
	if !grouped {
		return "/api/" + segment(apiVersion)
	}
	return "/apis/" + segment(group) + "/" + segment(version)
}

func withName(collection, name string) string {
	if name == "" {
		return collection
	}
	return collection + "/" + segment(name)
}

// segment escapes one path segment, including "." and "..", which
// url.PathEscape leaves alone and which would otherwise climb the path.
func segment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}
