// Command helm is the Helm side of config-watcher's chart (charts/config-watcher), on the
// Helm 4 Go module (helm.sh/helm/v4, pinned in go.mod), in a module of its own so that
// the controller's go.mod stays small:
//
//	helm template [-f values.yaml] [-set-json JSON] CHART   render as `helm template` does
//	helm package -version vX.Y.Z -image REPO -digest sha256:… [-ambassador-digest sha256:…] -o DIR CHART
//	                                                       the release's chart: its version, the image by digest;
//	                                                       as a .tgz and as an OCI layout of Helm's manifest (a tar)
//	helm install -namespace NS [-kubeconfig F] [-f values.yaml] [-set-json JSON] NAME CHART
//	helm upgrade -namespace NS [-kubeconfig F] [-f values.yaml] [-set-json JSON] NAME CHART
//	                                                       as helm does, on the cluster of the kubeconfig
//	                                                       (KUBECONFIG), without waiting: the e2e-node tests'
//	helm pull [-plain-http] -version X.Y.Z -o DIR oci://REGISTRY/REPOSITORY
//	                                                       the chart as `helm install oci://… --version` fetches it:
//	                                                       make release-test's check of the pushed layout
//
// Its tests (`make chart-test`) render and lint the chart for every variant and for bad
// values, and prove that it gives the objects kustomize gives for manifests/, variant by
// variant (docs/deployment.md, "Helm chart").
package main
