// Package e2e runs config-watcher against a real control plane (etcd, kube-apiserver,
// kube-controller-manager and a kubectl proxy ambassador, started by hack/cluster.sh).
//
// The tests carry the build tag e2e so that `go test ./...` stays fast:
//
//	hack/cluster.sh up
//	eval "$(hack/cluster.sh env)"
//	go test -tags e2e -count=1 -v ./e2e/...
//	hack/cluster.sh down
//
// or simply `make e2e`. Each test runs in a namespace of its own. Deletions are counted
// from the API server's audit log, never from the controller's own output. Every
// controller a test starts talks through a recorder of its requests, which the end of the
// run holds against the ambassador's --accept-paths (paths_test.go).
package e2e
