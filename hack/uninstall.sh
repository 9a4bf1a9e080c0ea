#!/usr/bin/env bash
# Removes one config-watcher install and what it wrote, whichever way it was installed (a
# release's install*.yaml, manifests/ from a clone, your own kustomization), and nothing of
# another install's or of yours:
#
#   1. lists what it will remove and asks; YES=1 removes without asking, and without an
#      answer on stdin (a pipe closed, /dev/null) it refuses and removes nothing;
#   2. stops the controller and waits until its pods are gone, so that nothing writes its
#      annotations back after they are removed;
#   3. in the namespaces it watched (a cluster-wide install: those its NAMESPACE_SELECTOR
#      selects now, every one if that is empty): removes its Lease, its Events
#      (reportingComponent=config-watcher), the Secrets' state ConfigMaps it made (the label
#      app.kubernetes.io/managed-by=config-watcher, the annotation that names the Secret,
#      and that Secret as owner: all three), and the annotations it writes on ConfigMaps
#      (restarted-for, restarted-for-keys, restarting, halted); then the digest key;
#   4. deletes the installed objects: those labelled app.kubernetes.io/name=config-watcher
#      in its namespace (Deployment, PodDisruptionBudget, ServiceAccount, Role, RoleBinding,
#      the monitoring component's Service, NetworkPolicy, ServiceMonitor, PrometheusRule and
#      dashboard), and the ClusterRole and ClusterRoleBinding of a cluster-wide install if
#      they are bound to this namespace's ServiceAccount.
#
# What was written after the list was shown, until the controller stopped, is removed by the
# same rules: the list is made again once it has stopped.
#
# What it watched and where its Lease is are read from the Deployment; WATCH_NAMESPACE,
# NAMESPACE_SELECTOR, LEASE_NAMESPACE and LEASE_NAME, if set, say it instead (for a
# Deployment already gone). It runs with your kubeconfig and needs the rights to do all of
# the above.
#
# Usage: hack/uninstall.sh [NAMESPACE]   (or: make uninstall [NAMESPACE=default] [YES=1]);
# NAMESPACE is the controller's own, default "default".
# Environment: YES, KUBECTL (default kubectl), WAIT_TIMEOUT (default 2m), kubectl's own.
set -euo pipefail

ns=${1:-${NAMESPACE:-default}}
kubectl=${KUBECTL:-kubectl}
wait_timeout=${WAIT_TIMEOUT:-2m}
prefix=config-watcher.k8spatterns.io/
# The annotations the controller writes on the ConfigMaps it acts for (policy/annotations.go,
# policy/keys.go); a state ConfigMap's own are removed with it.
written=("${prefix}restarted-for" "${prefix}restarted-for-keys" "${prefix}restarting" "${prefix}halted")
state_of=${prefix}state-of-secret
name_label=app.kubernetes.io/name=config-watcher
managed_label=app.kubernetes.io/managed-by=config-watcher
default_namespace_selector=config-watcher.k8spatterns.io/enabled=true

k() { "$kubectl" "$@"; }
say() { printf '==> %s\n' "$*" >&2; }

# The controller container's environment as the Deployment gives it, one NAME=VALUE a line:
# a value from metadata.namespace (the Downward API) is this namespace.
deployment_env=$(k get deployment config-watcher -n "$ns" --ignore-not-found -o go-template='{{range .spec.template.spec.containers}}{{if eq .name "config-watcher"}}{{range .env}}{{.name}}={{with .value}}{{.}}{{end}}{{with .valueFrom}}{{with .fieldRef}}{{if eq .fieldPath "metadata.namespace"}}@namespace{{end}}{{end}}{{end}}{{"\n"}}{{end}}{{end}}{{end}}')

# setting NAME DEFAULT prints the variable's value: the environment's if set, else the
# Deployment's if it sets it (even empty), else DEFAULT.
setting() {
	if [[ -n ${!1+set} ]]; then
		printf '%s' "${!1}"
		return
	fi
	local line
	line=$(grep -m1 "^$1=" <<<"$deployment_env" || true)
	if [[ -z $line ]]; then
		printf '%s' "$2"
		return
	fi
	line=${line#*=}
	[[ $line == @namespace ]] && line=$ns
	printf '%s' "$line"
}

watched=$(setting WATCH_NAMESPACE "$ns")
watched=${watched:-$ns}
lease_name=$(setting LEASE_NAME config-watcher)
lease_ns=$(setting LEASE_NAMESPACE "")
if [[ -z $lease_ns ]]; then
	lease_ns=${watched%%,*} # the first watched namespace, as the controller chooses
	[[ $lease_ns == "*" ]] && lease_ns=$ns
fi

# The namespaces it watched: its list, or those its selector picks among all.
namespaces=()
if [[ $watched == "*" ]]; then
	selector=$(setting NAMESPACE_SELECTOR "$default_namespace_selector")
	selected=(get namespaces -o go-template='{{range .items}}{{.metadata.name}}{{"\n"}}{{end}}')
	[[ -n $selector ]] && selected+=(-l "$selector")
	mapfile -t namespaces < <(k "${selected[@]}")
	say "config-watcher in namespace $ns, watching every namespace selected by '${selector}': ${namespaces[*]:-none}; Lease $lease_ns/$lease_name"
else
	IFS=, read -ra list <<<"$watched"
	for n in "${list[@]}"; do namespaces+=("$(echo "$n" | tr -d ' ')"); done
	say "config-watcher in namespace $ns, watching ${namespaces[*]}; Lease $lease_ns/$lease_name"
fi

# state_configmaps prints "NAMESPACE NAME" of each state ConfigMap it made: our label, the
# annotation naming a Secret, and that Secret as an owner. A ConfigMap that has the label
# alone is someone else's.
state_configmaps() {
	local n
	for n in "${namespaces[@]}"; do
		# shellcheck disable=SC2016 # the template is Go's, not the shell's
		k get configmaps -n "$n" -l "$managed_label" -o go-template='{{range .items}}{{$o := .}}{{with .metadata.annotations}}{{with index . "'"$state_of"'"}}{{$s := .}}{{range $o.metadata.ownerReferences}}{{if and (eq .kind "Secret") (eq .name $s)}}{{$o.metadata.namespace}} {{$o.metadata.name}}{{"\n"}}{{end}}{{end}}{{end}}{{end}}{{end}}'
	done
}

# annotated_configmaps prints "NAMESPACE NAME KEY..." of each ConfigMap that carries an
# annotation the controller writes, with those keys.
annotated_configmaps() {
	local n cm_ns cm key
	for n in "${namespaces[@]}"; do
		# shellcheck disable=SC2016 # the template is Go's, not the shell's
		k get configmaps -n "$n" -o go-template='{{range .items}}{{$o := .}}{{range $k, $v := .metadata.annotations}}{{$o.metadata.namespace}} {{$o.metadata.name}} {{$k}}{{"\n"}}{{end}}{{end}}'
	done | {
		declare -A keys=()
		while read -r cm_ns cm key; do
			for w in "${written[@]}"; do
				[[ $key == "$w" ]] && keys["$cm_ns $cm"]+=" $key"
			done
		done
		for target in "${!keys[@]}"; do
			printf '%s%s\n' "$target" "${keys[$target]}"
		done | sort
	}
}

# events prints the Events it recorded, as NAMESPACE KIND/NAME.
events() {
	local n e
	for n in "${namespaces[@]}"; do
		for e in $(k get events -n "$n" --field-selector reportingComponent=config-watcher -o name); do
			printf '%s %s\n' "$n" "$e"
		done
	done
}

monitoring_kinds=""
if [[ -n $(k api-resources --api-group=monitoring.coreos.com -o name 2>/dev/null) ]]; then
	monitoring_kinds=,servicemonitors.monitoring.coreos.com,prometheusrules.monitoring.coreos.com
fi
installed_kinds=deployment,poddisruptionbudget,service,networkpolicy,configmap,serviceaccount,role,rolebinding$monitoring_kinds
# Cluster-wide RBAC only if it is this install's: bound to this namespace's ServiceAccount
# (another install, in another namespace, may have its own).
# shellcheck disable=SC2016 # the template is Go's, not the shell's
bound_here=$(k get clusterrolebinding config-watcher --ignore-not-found -o go-template='{{range .subjects}}{{if and (eq .kind "ServiceAccount") (eq .name "config-watcher")}}{{.namespace}}{{"\n"}}{{end}}{{end}}')
cluster_rbac=false
grep -qxF "$ns" <<<"$bound_here" && cluster_rbac=true

indent() { sed 's/^/    /' >&2; }
say "this will remove:"
{
	echo "the controller: Deployment $ns/config-watcher scaled to 0, its pods gone"
	k get lease "$lease_name" -n "$lease_ns" --ignore-not-found -o name | sed "s|^|$lease_ns |"
	state_configmaps | sed 's/^/state ConfigMap /'
	annotated_configmaps | sed 's/^/annotations of ConfigMap /'
	count=$(events | wc -l)
	echo "$count Events of config-watcher's in ${namespaces[*]:-no namespace}"
	k get secret config-watcher-digest-key -n "$ns" --ignore-not-found -o name | sed "s|^|$ns |"
	k get "$installed_kinds" -n "$ns" -l "$name_label" -o name | sed "s|^|$ns |"
	if $cluster_rbac; then
		k get clusterrolebinding,clusterrole -l "$name_label" -o name
	fi
} | indent

if [[ ${YES:-} != 1 ]]; then
	printf 'Remove all of the above? Type yes (YES=1 skips this question): ' >&2
	if ! read -r answer; then
		echo >&2
		say "no answer on stdin: nothing removed (YES=1 removes without asking)"
		exit 1
	fi
	if [[ $answer != yes ]]; then
		say "nothing removed"
		exit 1
	fi
fi

say "stopping the controller and waiting for its pods to be gone (up to $wait_timeout)"
if [[ -n $deployment_env ]] || k get deployment config-watcher -n "$ns" >/dev/null 2>&1; then
	k scale deployment config-watcher -n "$ns" --replicas=0 >/dev/null
fi
k wait --for=delete pod -n "$ns" -l "$name_label" --timeout="$wait_timeout"

say "removing the Lease"
k delete lease "$lease_name" -n "$lease_ns" --ignore-not-found

say "removing its state ConfigMaps, Events and digest key"
state_configmaps | while read -r cm_ns cm; do
	k delete configmap "$cm" -n "$cm_ns" --ignore-not-found
done
for n in "${namespaces[@]}"; do
	k delete events -n "$n" --field-selector reportingComponent=config-watcher
done
k delete secret config-watcher-digest-key -n "$ns" --ignore-not-found

say "removing its annotations from ConfigMaps"
annotated_configmaps | while read -r cm_ns cm keys; do
	read -ra remove <<<"$keys"
	k annotate configmap "$cm" -n "$cm_ns" "${remove[@]/%/-}"
done

say "deleting the installed objects"
k delete "$installed_kinds" -n "$ns" -l "$name_label" --ignore-not-found
if $cluster_rbac; then
	k delete clusterrolebinding,clusterrole -l "$name_label" --ignore-not-found
fi
say "config-watcher is uninstalled"
