package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/testlog"
)

// TestReportSecretAccessNamesEachMissingVerb ensures the start-up check says
// once, per namespace, which permission for Secrets is missing and how to
// grant it, and says nothing of those granted or of reviews that fail.
func TestReportSecretAccessNamesEachMissingVerb(t *testing.T) {
	granted := map[string]bool{"a/list/secrets": true, "a/watch/secrets": true, "a/create/configmaps": true, "b/list/secrets": true}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", r.URL.Path)
		var review struct {
			Spec struct {
				ResourceAttributes struct{ Namespace, Verb, Resource string } `json:"resourceAttributes"`
			} `json:"spec"`
		}
		body, _ := io.ReadAll(r.Body)
		require.NoError(t, json.Unmarshal(body, &review))
		a := review.Spec.ResourceAttributes
		if a.Namespace == "broken" {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"kind":"SelfSubjectAccessReview","status":{"allowed":%v}}`, granted[a.Namespace+"/"+a.Verb+"/"+a.Resource])
	}))
	defer srv.Close()
	client, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	logs := &testlog.Buffer{}
	reportSecretAccess(context.Background(), client, []string{"a", "b", "broken"}, true, slog.New(slog.NewTextHandler(logs, nil)))

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 2, logs.String())
	assert.Contains(t, lines[0], `msg="missing RBAC for Secrets" namespace=b verb=watch resource=secrets fix="add the manifests/secrets component`)
	assert.Contains(t, lines[1], `namespace=b verb=create resource=configmaps`)
}
