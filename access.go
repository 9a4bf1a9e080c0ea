package main

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// access is one permission the controller needs, as a SelfSubjectAccessReview
// asks for it.
type access struct{ verb, resource string }

// secretAccess is what watching Secrets needs; writes: their state
// ConfigMaps are created (patch on configmaps is in the base Role).
func secretAccess(writes bool) []access {
	need := []access{{"list", "secrets"}, {"watch", "secrets"}}
	if writes {
		need = append(need, access{"create", "configmaps"})
	}
	return need
}

// reportSecretAccess says at start, once, which permission for Secrets the
// controller lacks in which namespace: without them the Secret watch only
// retries, and /readyz stays 503. It asks with SelfSubjectAccessReviews,
// which every authenticated user may create; one that fails is not
// reported (the watch's own errors are).
func reportSecretAccess(ctx context.Context, client *apiclient.Client, namespaces []string, writes bool, log *slog.Logger) {
	for _, ns := range namespaces {
		for _, a := range secretAccess(writes) {
			allowed, err := mayI(ctx, client, ns, a)
			if err != nil || allowed {
				continue
			}
			where := ns
			if ns == "" {
				where = "*"
			}
			log.Error("missing RBAC for Secrets", "namespace", where, "verb", a.verb, "resource", a.resource,
				"fix", "add the manifests/secrets component (manifests/cluster-wide/secrets for WATCH_NAMESPACE=*), or set WATCH_SECRETS=false; ConfigMaps are watched meanwhile")
		}
	}
}

// mayI asks the API server whether the controller may do a in namespace ns
// ("" for every namespace).
func mayI(ctx context.Context, client *apiclient.Client, ns string, a access) (bool, error) {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "authorization.k8s.io/v1",
		"kind":       "SelfSubjectAccessReview",
		"spec": map[string]any{"resourceAttributes": map[string]string{
			"namespace": ns, "verb": a.verb, "resource": a.resource,
		}},
	})
	if err != nil {
		return false, err
	}
	answer, err := client.Create(ctx, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body)
	if err != nil {
		return false, err
	}
	return gjson.GetBytes(answer, "status.allowed").Bool(), nil
}
