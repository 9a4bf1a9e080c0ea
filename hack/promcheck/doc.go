// Package promcheck checks the queries of the monitoring component
// (manifests/monitoring) with Prometheus's own code, in a module of its own
// so that the controller's go.mod stays small: every alert of the
// PrometheusRule and every panel of the Grafana dashboard parses, and names
// only series and label values the controller exports, as its /metrics
// says when it runs; each alert has a runbook in docs/operations.md; and
// each alert fires in the situation it is for and not in the normal one
// (testdata/alerts.test, Prometheus's promqltest scripts).
//
// It has no code of its own besides its tests: `make monitoring-test`.
package promcheck
