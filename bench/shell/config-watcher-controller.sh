#!/bin/bash
# The book's controller: "Kubernetes Patterns" (Ibryam & Huß), chapter "Controller",
# config-watcher-controller.sh from github.com/k8spatterns/examples
# (advanced/Controller/config-watcher/). Kept as it is in the book, flaws included
# (they are what the benchmark compares against):
#   - it watches without a resourceVersion, so every (re)connect replays the whole
#     namespace as ADDED, and changes made while disconnected are lost;
#   - it acts on every MODIFIED, metadata-only edits too;
#   - `local pod_selector` is set only when annotations exist, so a ConfigMap without
#     annotations that follows an annotated one reuses the previous selector;
#   - it forks 4-5 jq processes per event and dies when the watch ends.
#
# Adapted, and only here (marked "ADAPTED" below), for the benchmark's env interface,
# the same as config-watcher's:
#   - API_URL replaces the hard-coded base=http://localhost:8001 (same default);
#   - SELECTOR_ANNOTATION replaces the hard-coded "k8spatterns.io/podDeleteSelector"
#     in the jq filter (same default), passed with --arg instead of inline;
# Everything else (curl flags, jq filters, echo lines, quoting) is the book's.
# shellcheck disable=SC2086,SC2155 # the book's quoting and `local x=$(…)`, kept as they are

# Namespace to watch (or 'default' if not given)
namespace=${WATCH_NAMESPACE:-default}

# API URL setup. Requires an ambassador API proxy running side-by-side on localhost
base=${API_URL:-http://localhost:8001}                                   # ADAPTED
annotation=${SELECTOR_ANNOTATION:-k8spatterns.io/podDeleteSelector}      # ADAPTED
ns=namespaces/$namespace

# Main event loop
start_event_loop() {
  # Watch the K8s API on events on service objects
  echo "::: Starting to wait for events"

  # Event loop listening for changes in config maps
  curl -N -s $base/api/v1/${ns}/configmaps?watch=true | while read -r event
  do
    # Sanitize new lines
    event=$(echo "$event" | tr '\r\n' ' ')

    # Event type & name
    local type=$(echo "$event" | jq -r .type)
    local config_map=$(echo "$event" | jq -r .object.metadata.name)

    # Fetch annotations of ConfigMap and extract our trigger annotation if any
    # The extracted pod selector is expected to have
    # the format "label1=value1,label2=value2,.."
    local annotations=$(echo "$event" | jq -r '.object.metadata.annotations')
    if [ "$annotations" != "null" ]; then
      local pod_selector=$(echo $annotations | jq -r --arg a "$annotation" 'to_entries | .[] | select(.key == $a) | .value | @uri')  # ADAPTED: --arg
    fi
    echo "::: $type -- $config_map -- $pod_selector"

    # Act only when configmap is modified and an annotation has been given
    if [ $type = "MODIFIED" ] && [ -n "$pod_selector" ]; then
      delete_pods_with_selector "$pod_selector"
    fi
  done
}

# Delete all pods that match a selector
delete_pods_with_selector() {
  local selector=${1}

  echo "::::: Deleting pods with $selector"

  # Pick up all pod names which match the given selector
  local pods=$(curl -s $base/api/v1/${ns}/pods?labelSelector=$selector | \
               jq -r .items[].metadata.name)

  # Delete all pods that matched
  for pod in $pods; do
    # Delete but also check exit code
    exit_code=$(curl -s -X DELETE -o /dev/null -w "%{http_code}" $base/api/v1/${ns}/pods/$pod)
    if [ $exit_code -eq 200 ]; then
      echo "::::: Deleted pod $pod"
    else
      echo "::::: Error deleting pod $pod: $exit_code"
    fi
  done
}

# ==============================================
# Fire up
start_event_loop
