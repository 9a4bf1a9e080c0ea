package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// recordRunningPod records a Running pod as the pod index and a LIST read it: whole,
// with its owner, conditions and container statuses. There is no kubelet here, so the
// recorder writes the pod's status as one would (`pods/status`, a merge patch, which an
// admin may send): phase Running, the five conditions with Ready True, the pod's IPs,
// and one container running and ready that restarted once. Then it lists the pod.
func (r *recorder) recordRunningPod(ctx context.Context) error {
	pods := "/api/v1/namespaces/" + r.ns + "/pods"
	deploy := map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "running", "labels": map[string]string{"app": "running"}},
		"spec": map[string]any{
			"replicas": 1,
			"selector": map[string]any{"matchLabels": map[string]string{"app": "running"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]string{"app": "running"}},
				"spec": map[string]any{"containers": []any{map[string]any{
					"name": "mini-http-server", "image": "k8spatterns/mini-http-server",
				}}},
			},
		},
	}
	b, _ := json.Marshal(deploy)
	if _, err := r.ok(ctx, http.MethodPost, "/apis/apps/v1/namespaces/"+r.ns+"/deployments", nil, "application/json", b); err != nil {
		return fmt.Errorf("create deployment: %w", err)
	}
	q := url.Values{"labelSelector": {"app=running"}}
	var name string
	if err := eventuallyDo(60*time.Second, "the running pod", func() (bool, error) {
		resp, err := r.ok(ctx, http.MethodGet, pods, q, "", nil)
		if err != nil {
			return false, err
		}
		var l struct {
			Items []struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			} `json:"items"`
		}
		if err := json.Unmarshal(resp.body, &l); err != nil {
			return false, err
		}
		if len(l.Items) == 1 {
			name = l.Items[0].Metadata.Name
		}
		return name != "", nil
	}); err != nil {
		return err
	}

	now := time.Now().UTC().Format(time.RFC3339)
	condition := func(typ string) map[string]any {
		return map[string]any{"type": typ, "status": "True", "lastProbeTime": nil, "lastTransitionTime": now}
	}
	status := map[string]any{"status": map[string]any{
		"phase": "Running", "hostIP": "10.0.0.10", "hostIPs": []any{map[string]any{"ip": "10.0.0.10"}},
		"podIP": "10.244.0.7", "podIPs": []any{map[string]any{"ip": "10.244.0.7"}}, "startTime": now,
		"conditions": []any{condition("PodReadyToStartContainers"), condition("Initialized"), condition("Ready"),
			condition("ContainersReady"), condition("PodScheduled")},
		"containerStatuses": []any{map[string]any{
			"name": "mini-http-server", "ready": true, "started": true, "restartCount": 1,
			"state": map[string]any{"running": map[string]any{"startedAt": now}},
			"lastState": map[string]any{"terminated": map[string]any{"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now,
				"containerID": "containerd://0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c"}},
			"image":       "docker.io/k8spatterns/mini-http-server:latest",
			"imageID":     "docker.io/k8spatterns/mini-http-server@sha256:5d3f1c0a9e8b7d6c5b4a392817f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c",
			"containerID": "containerd://1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b",
		}},
		"qosClass": "BestEffort",
	}}
	b, _ = json.Marshal(status)
	if _, err := r.ok(ctx, http.MethodPatch, pods+"/"+name+"/status", nil, "application/merge-patch+json", b); err != nil {
		return fmt.Errorf("write the pod's status: %w", err)
	}
	resp, err := r.ok(ctx, http.MethodGet, pods, q, "", nil)
	if err != nil {
		return err
	}
	return r.saveResponse("pods-running-list.json", pods, q, resp,
		"the `running` Deployment's one pod, its status written as a kubelet writes it (there is none here: a merge patch of `pods/status`): phase `Running`, the five conditions (`Ready` `True`), `hostIP`/`podIP`, and a container running, ready, restarted once (`lastState.terminated.reason: Error`); what the pod index and a LIST read alike (podindex.Parse)")
}
