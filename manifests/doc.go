// Package manifests holds config-watcher's Kubernetes manifests: the kustomize base here,
// the cluster-wide overlay, the opt-in secrets components (secrets/ and
// cluster-wide/secrets/), the opt-in monitoring component (monitoring/) and the demo
// application in demo/. Its one function, UnusedBranches, judges the ambassador's
// --accept-paths against the paths requested (here and in the e2e suite); its tests
// render every build with `kubectl kustomize` (testdata/ holds builds that include the
// components) and check offline what a cluster would be given (hardened containers,
// least-privilege RBAC, nothing on Secrets without a component, a loopback-only
// ambassador).
package manifests
