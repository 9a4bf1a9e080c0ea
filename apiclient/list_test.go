package apiclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// TestListFollowsContinueTokens ensures List asks for pages of pageSize with
// the caller's query, follows each continue token to the last page, hands
// over every item in order and returns the last page's metadata, leaving the
// caller's query as it was.
func TestListFollowsContinueTokens(t *testing.T) {
	pages := map[string]string{
		"":   `{"metadata":{"resourceVersion":"10","continue":"c1"},"items":[{"n":1},{"n":2}]}`,
		"c1": `{"metadata":{"resourceVersion":"10","continue":"c2"},"items":[{"n":3}]}`,
		"c2": `{"metadata":{"resourceVersion":"10"},"items":[{"n":4}]}`,
	}
	var mu sync.Mutex
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.Query())
		mu.Unlock()
		io.WriteString(w, pages[r.URL.Query().Get("continue")])
	}))
	t.Cleanup(srv.Close)

	query := url.Values{"labelSelector": {"app=x"}}
	var items []string
	meta, err := apiclient.List(t.Context(), newClient(t, srv.URL), "/api/v1/namespaces/ns/pods", query, "", 2, func(raw []byte) { items = append(items, string(raw)) })
	require.NoError(t, err)
	assert.Equal(t, []string{`{"n":1}`, `{"n":2}`, `{"n":3}`, `{"n":4}`}, items)
	assert.Equal(t, apiclient.ListMeta{ResourceVersion: "10"}, meta)
	assert.Equal(t, []url.Values{
		{"labelSelector": {"app=x"}, "limit": {"2"}},
		{"labelSelector": {"app=x"}, "limit": {"2"}, "continue": {"c1"}},
		{"labelSelector": {"app=x"}, "limit": {"2"}, "continue": {"c2"}},
	}, queries)
	assert.Equal(t, url.Values{"labelSelector": {"app=x"}}, query, "the caller's query is not changed")
}

// TestListContinueExpired ensures a 410 on a continue token fails the list
// with an error that says so and is still IsGone, and a 410 on the first
// page is the server's answer as it is.
func TestListContinueExpired(t *testing.T) {
	const gone = `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("continue") == "" && r.URL.Query().Get("resourceVersion") == "" {
			io.WriteString(w, `{"metadata":{"resourceVersion":"10","continue":"c1"},"items":[{"n":1}]}`)
			return
		}
		w.WriteHeader(http.StatusGone)
		io.WriteString(w, gone)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL)

	_, err := apiclient.List(t.Context(), c, "/api/v1/namespaces/ns/pods", nil, "", 0, func([]byte) {})
	require.Error(t, err)
	assert.True(t, apiclient.IsGone(err))
	assert.Contains(t, err.Error(), "continue token expired")

	_, err = apiclient.List(t.Context(), c, "/api/v1/namespaces/ns/pods", url.Values{"resourceVersion": {"5"}}, "", 0, func([]byte) {})
	require.Error(t, err)
	assert.True(t, apiclient.IsGone(err))
	assert.NotContains(t, err.Error(), "continue token expired")
}
