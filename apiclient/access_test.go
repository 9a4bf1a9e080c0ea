package apiclient_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

const forbiddenStatus = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden: User \"system:serviceaccount:default:config-watcher\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\"","reason":"Forbidden","details":{"kind":"configmaps"},"code":403}`

// TestForbiddenSaysTheRuleThatGrantsIt ensures a 403 names the verb,
// resource and namespace the request asked for, and Hint the RBAC rule
// that grants it: in a Role for a namespace, in a ClusterRole for all.
func TestForbiddenSaysTheRuleThatGrantsIt(t *testing.T) {
	tests := []struct {
		name     string
		call     func(c *apiclient.Client) error
		want     apiclient.Access
		wantHint string
	}{
		{"ListConfigMaps", func(c *apiclient.Client) error {
			_, err := c.GetBody(context.Background(), apiclient.CorePath("default", "configmaps", ""), url.Values{"limit": {"500"}}, "")
			return err
		}, apiclient.Access{Verb: "list", Resource: "configmaps", Namespace: "default"},
			`RBAC: the controller may not list configmaps in namespace default; grant it with the rule {apiGroups: [""], resources: ["configmaps"], verbs: ["list"]} in a Role in namespace default bound to the controller's ServiceAccount`},
		{"WatchEveryNamespace", func(c *apiclient.Client) error {
			_, err := c.Stream(context.Background(), apiclient.CoreClusterPath("secrets"), url.Values{"watch": {"true"}}, "")
			return err
		}, apiclient.Access{Verb: "watch", Resource: "secrets"},
			`RBAC: the controller may not watch secrets in every namespace; grant it with the rule {apiGroups: [""], resources: ["secrets"], verbs: ["watch"]} in a ClusterRole bound to the controller's ServiceAccount by a ClusterRoleBinding`},
		{"DeletePod", func(c *apiclient.Client) error {
			_, err := c.Delete(context.Background(), apiclient.CorePath("shop", "pods", "web-1"), nil)
			return err
		}, apiclient.Access{Verb: "delete", Resource: "pods", Namespace: "shop"}, ""},
		{"EvictPod", func(c *apiclient.Client) error {
			_, err := c.Create(context.Background(), apiclient.CorePath("shop", "pods", "web-1")+"/eviction", nil)
			return err
		}, apiclient.Access{Verb: "create", Resource: "pods/eviction", Namespace: "shop"}, ""},
		{"PatchConfigMap", func(c *apiclient.Client) error {
			_, err := c.MergePatch(context.Background(), apiclient.CorePath("shop", "configmaps", "web"), []byte("{}"))
			return err
		}, apiclient.Access{Verb: "patch", Resource: "configmaps", Namespace: "shop"}, ""},
		{"UpdateLease", func(c *apiclient.Client) error {
			_, err := c.Update(context.Background(), apiclient.GroupPath("coordination.k8s.io", "v1", "shop", "leases", "cw"), []byte("{}"))
			return err
		}, apiclient.Access{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "shop"},
			`RBAC: the controller may not update leases in namespace shop; grant it with the rule {apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["update"]} in a Role in namespace shop bound to the controller's ServiceAccount`},
		{"GetScale", func(c *apiclient.Client) error {
			_, err := c.Get(context.Background(), apiclient.GroupPath("apps", "v1", "shop", "replicasets", "web-7d9f")+"/scale", nil, "")
			return err
		}, apiclient.Access{Verb: "get", Group: "apps", Resource: "replicasets/scale", Namespace: "shop"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(answer{code: 403, body: forbiddenStatus}.serve))
			t.Cleanup(srv.Close)
			// Behind a path prefix, as some proxies put the API: the access is the API's path.
			err := tt.call(newClient(t, srv.URL+"/k8s"))
			se, ok := errors.AsType[*apiclient.StatusError](err)
			require.True(t, ok, "%v", err)
			assert.Equal(t, tt.want, se.Access)
			if tt.wantHint != "" {
				assert.Equal(t, tt.wantHint, apiclient.Hint(err))
			}
			assert.Contains(t, apiclient.Hint(err), tt.want.String())
		})
	}
}

// TestHintSaysTheAmbassadorIsNotAnswering ensures a refused connection to
// the API URL is explained as the ambassador not running there.
func TestHintSaysTheAmbassadorIsNotAnswering(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now
	_, err = newClient(t, "http://"+addr).Get(context.Background(), "/api/v1/pods", nil, "")
	require.Error(t, err)
	assert.Equal(t, "nothing answers at API_URL: start the ambassador (kubectl proxy) there, or point API_URL at it", apiclient.Hint(err))
}

// TestHintIsEmptyWhereRetryingIsTheCure ensures errors no person fixes (a
// 5xx, a 404, a 429) carry no hint, so that nothing tells them to.
func TestHintIsEmptyWhereRetryingIsTheCure(t *testing.T) {
	for _, code := range []int{404, 429, 500, 503} {
		srv := httptest.NewServer(http.HandlerFunc(answer{code: code, body: "{}"}.serve))
		_, err := newClient(t, srv.URL).Get(context.Background(), "/api/v1/pods", nil, "")
		srv.Close()
		require.Error(t, err)
		assert.Empty(t, apiclient.Hint(err), "%d", code)
	}
	assert.Empty(t, apiclient.Hint(nil))
}
