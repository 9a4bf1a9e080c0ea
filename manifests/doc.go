// Package manifests holds config-watcher's Kubernetes manifests: the kustomize base in
// this directory (ServiceAccount, Role, RoleBinding, Deployment with its kubectl proxy
// ambassador) and the demo application in demo/.
//
// It has no code of its own. Its tests render both kustomizations with
// `kubectl kustomize` and check, offline, what a cluster would be given: hardened
// containers with resources, a least-privilege Role, no cluster-wide RBAC, and an
// ambassador that listens on loopback only. `kubectl apply --dry-run=server` against a
// real API server is the e2e suite's job.
package manifests
