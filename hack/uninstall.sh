#!/usr/bin/env bash
# Removes config-watcher and everything it left in the cluster, whichever way it was
# installed (a release's install*.yaml, manifests/ from a clone, your own kustomization):
#
#   1. stops the controller and waits until its pods are gone, so that nothing writes
#      its annotations back after they are removed;
#   2. removes its Lease, the Secrets' state ConfigMaps, its Events and the digest key, and
#      its annotations (config-watcher.k8spatterns.io/*) from the ConfigMaps of every
#      namespace it watched;
#   3. deletes the installed objects: those labelled app.kubernetes.io/name=config-watcher
#      (Deployment, PodDisruptionBudget, ServiceAccount, Role, RoleBinding, the monitoring
#      component's Service, NetworkPolicy, ServiceMonitor, PrometheusRule and dashboard), and the
#      ClusterRole and ClusterRoleBinding of a cluster-wide install if they are bound to
#      this namespace's ServiceAccount.
#
# What it watched and where its Lease is are read from the Deployment; WATCH_NAMESPACE,
# LEASE_NAMESPACE and LEASE_NAME, if set, say it instead (for a Deployment already gone).
# It runs with your kubeconfig and needs the rights to do all of the above.
#
# Usage: hack/uninstall.sh [NAMESPACE]   (or: make uninstall [NAMESPACE=default]);
# NAMESPACE is the controller's own, default "default".
# Environment: KUBECTL (default kubectl), WAIT_TIMEOUT (default 2m), kubectl's own.
set -euo pipefail

ns=${1:-${NAMESPACE:-default}}
kubectl=${KUBECTL:-kubectl}
wait_timeout=${WAIT_TIMEOUT:-2m}
prefix=config-watcher.k8spatterns.io/
name_label=app.kubernetes.io/name=config-watcher

k() { "$kubectl" "$@"; }
say() { printf '==> %s\n' "$*" >&2; }

# deployment_env prints the value the Deployment gives the controller's variable $1: its
# value, or the namespace for a value from metadata.namespace (the Downward API).
deployment_env() {
	local path="{.spec.template.spec.containers[?(@.name==\"config-watcher\")].env[?(@.name==\"$1\")]"
	local value field
	value=$(k get deployment config-watcher -n "$ns" -o jsonpath="$path.value}" 2>/dev/null) || return 0
	field=$(k get deployment config-watcher -n "$ns" -o jsonpath="$path.valueFrom.fieldRef.fieldPath}" 2>/dev/null) || return 0
	if [[ $field == metadata.namespace ]]; then value=$ns; fi
	printf '%s' "$value"
}

watched=${WATCH_NAMESPACE:-$(deployment_env WATCH_NAMESPACE)}
watched=${watched:-$ns}
lease_name=${LEASE_NAME:-$(deployment_env LEASE_NAME)}
lease_name=${lease_name:-config-watcher}
lease_ns=${LEASE_NAMESPACE:-$(deployment_env LEASE_NAMESPACE)}
if [[ -z $lease_ns ]]; then
	lease_ns=${watched%%,*} # the first watched namespace, as the controller chooses
	[[ $lease_ns == "*" ]] && lease_ns=$ns
fi
# Where to look: one -n NS per watched namespace, or -A for every namespace.
scopes=()
if [[ $watched == "*" ]]; then
	scopes=("-A")
else
	IFS=, read -ra list <<<"$watched"
	for n in "${list[@]}"; do scopes+=("-n $(echo "$n" | tr -d ' ')"); done
fi
say "config-watcher in namespace $ns, watching ${watched}; Lease $lease_ns/$lease_name"

say "stopping the controller and waiting for its pods to be gone (up to $wait_timeout)"
if k get deployment config-watcher -n "$ns" >/dev/null 2>&1; then
	k scale deployment config-watcher -n "$ns" --replicas=0 >/dev/null
fi
k wait --for=delete pod -n "$ns" -l "$name_label" --timeout="$wait_timeout"

say "removing the Lease"
k delete lease "$lease_name" -n "$lease_ns" --ignore-not-found

say "removing the Secrets' state ConfigMaps, the Events and the digest key"
for scope in "${scopes[@]}"; do
	# shellcheck disable=SC2086
	k delete configmaps $scope -l app.kubernetes.io/managed-by=config-watcher
	# shellcheck disable=SC2086
	k delete events $scope --field-selector reportingComponent=config-watcher
done
k delete secret config-watcher-digest-key -n "$ns" --ignore-not-found

say "removing the annotations ${prefix}* from ConfigMaps"
for scope in "${scopes[@]}"; do
	# $scope is "-A" or "-n NS", two words on purpose; the template is Go's, not the shell's.
	# shellcheck disable=SC2086,SC2016
	k get configmaps $scope -o go-template='{{range .items}}{{$o := .}}{{range $k, $v := .metadata.annotations}}{{$o.metadata.namespace}} {{$o.metadata.name}} {{$k}}{{"\n"}}{{end}}{{end}}'
done | {
	declare -A remove=()
	while read -r cm_ns cm key; do
		[[ $key == "$prefix"* ]] && remove["$cm_ns $cm"]+=" $key-"
	done
	for target in "${!remove[@]}"; do
		read -r cm_ns cm <<<"$target"
		# shellcheck disable=SC2086 # one word per annotation to remove
		k annotate configmap "$cm" -n "$cm_ns" ${remove[$target]}
	done
}

say "deleting the installed objects"
kinds=deployment,poddisruptionbudget,service,networkpolicy,configmap,serviceaccount,role,rolebinding
if [[ -n $(k api-resources --api-group=monitoring.coreos.com -o name 2>/dev/null) ]]; then
	kinds+=,servicemonitors.monitoring.coreos.com,prometheusrules.monitoring.coreos.com
fi
k delete "$kinds" -n "$ns" -l "$name_label" --ignore-not-found
# Cluster-wide RBAC only if it is this install's: bound to this namespace's ServiceAccount
# (another install, in another namespace, may have its own).
bound_here=$(k get clusterrolebinding config-watcher -o jsonpath='{.subjects[?(@.kind=="ServiceAccount")].namespace}' 2>/dev/null || true)
if [[ $bound_here == "$ns" ]]; then
	k delete clusterrolebinding,clusterrole -l "$name_label" --ignore-not-found
fi
say "config-watcher is uninstalled"
