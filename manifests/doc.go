// Package manifests holds config-watcher's Kubernetes manifests: the kustomize base here
// and the demo application in demo/. It has no code; its tests render both with
// `kubectl kustomize` and check offline what a cluster would be given (hardened
// containers, least-privilege RBAC, a loopback-only ambassador).
package manifests
