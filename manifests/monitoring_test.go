package manifests

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMonitoringComponentScrapesTheController ensures the monitoring
// component, built into the base as a user would (testdata/monitoring),
// leaves the base as it is and scrapes the controller: the Service selects
// the controller's pods, unready ones included, on the port that serves
// /metrics; the ServiceMonitor selects the Service and scrapes that port's
// /metrics; the dashboard is JSON in a ConfigMap Grafana's sidecar loads.
// hack/promcheck checks what the alerts and panels query.
func TestMonitoringComponentScrapesTheController(t *testing.T) {
	objs := render(t, "testdata/monitoring")
	require.NotEmpty(t, objs)
	for _, c := range baseChecks {
		t.Run(c.name, func(t *testing.T) { assert.Empty(t, c.fn(objs)) })
	}
	_, _, podLabels := controllerDeployment(objs)
	svc := find(t, objs, "Service", "config-watcher-metrics")
	assert.True(t, selects(map[string]any{"matchLabels": dig(svc, "spec", "selector")}, podLabels), "the Service selects the controller's pods")
	assert.Equal(t, true, dig(svc, "spec", "publishNotReadyAddresses"), "a replica that is not Ready is scraped too")
	ports := list(svc, "spec", "ports")
	require.Len(t, ports, 1)
	port := ports[0]

	// The container port the Service targets is the one HTTP_ADDR serves /metrics on:
	// its default, :8080 (docs/settings.md), which the manifests leave.
	const httpPort = "8080"
	c := container(t, objs, "config-watcher")
	require.Empty(t, env(c, "HTTP_ADDR"), "the manifests set no HTTP_ADDR")
	targeted := false
	for _, p := range list(c, "ports") {
		if str(p, "name") == str(port, "targetPort") {
			targeted = strconv.Itoa(int(dig(p, "containerPort").(float64))) == httpPort
		}
	}
	assert.True(t, targeted, "the Service's targetPort %q is not the container port of /metrics (%s)", str(port, "targetPort"), httpPort)
	assert.Equal(t, httpPort, str(svc, "metadata", "annotations", "prometheus.io/port"))

	sm := find(t, objs, "ServiceMonitor", "config-watcher")
	assert.True(t, selects(dig(sm, "spec", "selector"), dig(svc, "metadata", "labels")), "the ServiceMonitor selects the Service")
	endpoints := list(sm, "spec", "endpoints")
	require.Len(t, endpoints, 1)
	assert.Equal(t, str(port, "name"), str(endpoints[0], "port"))
	assert.Equal(t, "/metrics", str(endpoints[0], "path"))

	assert.True(t, has(objs, "PrometheusRule", "config-watcher"))
	dashboards := find(t, objs, "ConfigMap", "config-watcher-dashboard")
	assert.Equal(t, "1", str(dashboards, "metadata", "labels", "grafana_dashboard"))
	var dashboard map[string]any
	require.NoError(t, json.Unmarshal([]byte(str(dashboards, "data", "config-watcher.json")), &dashboard))
	assert.Equal(t, "config-watcher", dashboard["uid"])
}

// TestMonitoringComponentAdmitsOnlyTheScraperToTheMetricsPort ensures the
// monitoring component's NetworkPolicy selects the controller's pods,
// restricts their ingress only (egress reaches the API server through the
// ambassador), and admits the namespace `monitoring` alone, to the metrics
// port alone: no other pod can reach /metrics, /healthz or /readyz.
func TestMonitoringComponentAdmitsOnlyTheScraperToTheMetricsPort(t *testing.T) {
	objs := render(t, "testdata/monitoring")
	_, _, podLabels := controllerDeployment(objs)
	np := find(t, objs, "NetworkPolicy", "config-watcher-metrics")
	assert.True(t, selects(dig(np, "spec", "podSelector"), podLabels), "the NetworkPolicy selects the controller's pods")
	assert.Equal(t, []string{"Ingress"}, strs(list(np, "spec", "policyTypes")))

	rules := list(np, "spec", "ingress")
	require.Len(t, rules, 1, "one rule: the scraper's")
	from := list(rules[0], "from")
	require.Len(t, from, 1, "one peer: the scraper's namespace")
	assert.Equal(t, map[string]any{"namespaceSelector": map[string]any{
		"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"},
	}}, from[0], "the namespace `monitoring` by its name label, no other peer (an ipBlock, every namespace)")

	ports := list(rules[0], "ports")
	require.Len(t, ports, 1, "one port: the metrics port")
	svc := find(t, objs, "Service", "config-watcher-metrics")
	metricsPort := str(list(svc, "spec", "ports")[0], "targetPort")
	assert.Equal(t, metricsPort, str(ports[0], "port"), "the port the metrics Service targets")
	assert.Equal(t, "TCP", str(ports[0], "protocol"))
}
