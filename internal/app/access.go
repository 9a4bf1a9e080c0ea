package app

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// secretAccess is what watching Secrets in ns needs; writes: their state
// ConfigMaps are created (patch on configmaps is in the base Role).
func secretAccess(ns string, writes bool) []apiclient.Access {
	need := []apiclient.Access{{Verb: "list", Resource: "secrets", Namespace: ns}, {Verb: "watch", Resource: "secrets", Namespace: ns}}
	if writes {
		need = append(need, apiclient.Access{Verb: "create", Resource: "configmaps", Namespace: ns})
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
		for _, a := range secretAccess(ns, writes) {
			allowed, err := mayI(ctx, client, a)
			if err != nil || allowed {
				continue
			}
			where := ns
			if ns == "" {
				where = "*"
			}
			log.Error("missing RBAC for Secrets", "namespace", where, "verb", a.Verb, "resource", a.Resource,
				"fix", "add the manifests/secrets component (manifests/cluster-wide/secrets for WATCH_NAMESPACE=*), or set WATCH_SECRETS=false; ConfigMaps are watched meanwhile",
				"rule", a.Rule())
		}
	}
}

// mayI asks the API server whether the controller may do a.
func mayI(ctx context.Context, client *apiclient.Client, a apiclient.Access) (bool, error) {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "authorization.k8s.io/v1",
		"kind":       "SelfSubjectAccessReview",
		"spec": map[string]any{"resourceAttributes": map[string]string{
			"namespace": a.Namespace, "verb": a.Verb, "group": a.Group, "resource": a.Resource,
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
