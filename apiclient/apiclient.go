// Package apiclient is a minimal HTTP client for the Kubernetes API, meant to
// talk to an ambassador (kubectl proxy) that handles authentication and TLS.
//
// It knows HTTP, paths and the API's Status object, and nothing of
// ConfigMaps, selectors or deletion policy. Its dependency budget is the
// standard library plus gjson. Every request goes through newRequest; every
// non-2xx answer becomes a *StatusError filled from the Status body.
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
	"time"
)

// Content types the API server understands for the request bodies we send.
const (
	contentJSON       = "application/json"
	contentMergePatch = "application/merge-patch+json"
)

// maxResponseBytes bounds what a unary request reads into memory. A page of
// 500 ConfigMaps of 1 MiB each is the worst legitimate case we list.
const maxResponseBytes = 1 << 30

// Client sends requests to one API server base URL.
type Client struct {
	base      *url.URL
	http      *http.Client
	userAgent string
	// RequestTimeout bounds every non-streaming request.
	RequestTimeout time.Duration
}

// New returns a client for baseURL, e.g. "http://localhost:8001".
func New(baseURL, userAgent string) (*Client, error) {
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
	// Unary requests are bounded by RequestTimeout through their context;
	// streams by the caller's context and the server's timeoutSeconds, so
	// the client itself has no Timeout.
	transport := &http.Transport{
		Proxy:                 nil, // the ambassador is the proxy; never route it through HTTP_PROXY
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
	}
	return &Client{
		base:           u,
		http:           &http.Client{Transport: transport},
		userAgent:      userAgent,
		RequestTimeout: 30 * time.Second,
	}, nil
}

// Get reads path and returns the whole response body.
func (c *Client) Get(ctx context.Context, path string, query url.Values, accept string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, path, query, accept, "", nil)
}

// GetBody reads path and returns the response body as a stream, for
// answers too large to hold at once (a list page): the caller decodes it as
// it arrives and closes it. RequestTimeout bounds the whole read, body
// included, as it does for Get.
func (c *Client) GetBody(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error) {
	cancel := context.CancelFunc(func() {})
	if c.RequestTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.RequestTimeout)
	}
	req, err := c.newRequest(ctx, http.MethodGet, path, query, accept, "", nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer cancel()
		defer resp.Body.Close()
		return nil, statusFromResponse(resp)
	}
	return &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}, nil
}

// cancelOnClose releases a request's timeout with its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
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

// Stream opens a long-running GET (a watch) and returns its body once the
// server has answered 2xx. The caller closes it; cancelling ctx ends it.
func (c *Client) Stream(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error) {
	if accept == "" {
		accept = contentJSON
	}
	req, err := c.newRequest(ctx, http.MethodGet, path, query, accept, "", nil)
	if err != nil {
		return nil, err
	}
	// kube-apiserver gzips a watch that starts with the current state
	// (sendInitialEvents, or no resourceVersion) when the client accepts it,
	// and the compressor then holds later events back; events must arrive
	// as they happen, one line at a time.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, statusFromResponse(resp)
	}
	return resp.Body, nil
}

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
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, statusFromResponse(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return data, nil
}

// newRequest is the one place requests are built: base URL, path, query
// (always through url.Values), headers.
func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, accept, contentType string, body []byte) (*http.Request, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("create request: path %q is not absolute", path)
	}
	// path arrives escaped (see CorePath); keep both forms so url.URL
	// writes exactly the escaping we chose.
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
	p := "/api/v1/namespaces/" + segment(namespace) + "/" + segment(resource)
	if name != "" {
		p += "/" + segment(name)
	}
	return p
}

// CoreClusterPath is the path of a core/v1 resource across all namespaces,
// e.g. for one cluster-wide watch.
func CoreClusterPath(resource string) string { return "/api/v1/" + segment(resource) }

// GroupPath is the path of a resource of an API group in a namespace, or of
// one named object when name is not empty.
func GroupPath(group, version, namespace, resource, name string) string {
	p := "/apis/" + segment(group) + "/" + segment(version) + "/namespaces/" + segment(namespace) + "/" + segment(resource)
	if name != "" {
		p += "/" + segment(name)
	}
	return p
}

// segment escapes one path segment, including "." and "..", which
// url.PathEscape leaves alone and which would otherwise climb the path.
func segment(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}
