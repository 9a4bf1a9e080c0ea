{{/*
The labels of every object's metadata: the kustomize install's (app.kubernetes.io/name) and
Helm's. Selectors and the pod template keep the kustomize labels alone: a selector is
immutable, and a chart version in the template would roll the pods at each upgrade.
*/}}
{{- define "config-watcher.labels" -}}
app.kubernetes.io/name: config-watcher
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
{{- end }}

{{/* An image reference: repository@digest when a digest is given, else repository:tag. */}}
{{- define "config-watcher.image" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end -}}
{{- end }}

{{/*
The opt-in labels of the cluster-wide install (docs/operations.md, "Who can make the
controller delete what").
*/}}
{{- define "config-watcher.namespaceOptIn" -}}config-watcher.k8spatterns.io/enabled=true{{- end }}
{{- define "config-watcher.podOptIn" -}}config-watcher.k8spatterns.io/restart=true{{- end }}

{{/*
The controller's environment: each setting of .Values.settings that is not null, as its
variable (maxUnavailable: MAX_UNAVAILABLE), and the ones the chart wires where left null
(values.yaml says which). The variables of the kustomize install in its order, for the
variant; then the others in alphabetical order. The order is part of the pod template: a
chart adopting a kustomize install in another order would roll its pods
(docs/deployment.md, "Helm chart").
*/}}
{{- define "config-watcher.env" -}}
{{- $s := .Values.settings | default dict -}}
{{- $fieldRef := dict -}}
{{- $values := dict -}}
{{- range $k, $v := $s }}
{{- if not (kindIs "invalid" $v) }}
{{- $_ := set $values ($k | snakecase | upper) (toString $v) }}
{{- end }}
{{- end }}
{{- range $name, $path := dict "POD_NAME" "metadata.name" "POD_NAMESPACE" "metadata.namespace" "POD_UID" "metadata.uid" }}
{{- if not (hasKey $values $name) }}{{ $_ := set $fieldRef $name $path }}{{ end }}
{{- end }}
{{- if not (hasKey $values "WATCH_NAMESPACE") }}
{{- if .Values.clusterWide.enabled }}
{{- $_ := set $values "WATCH_NAMESPACE" "*" }}
{{- else }}
{{- $_ := set $fieldRef "WATCH_NAMESPACE" "metadata.namespace" }}
{{- end }}
{{- end }}
{{- if .Values.clusterWide.enabled }}
{{- if not (hasKey $values "LEASE_NAMESPACE") }}{{ $_ := set $fieldRef "LEASE_NAMESPACE" "metadata.namespace" }}{{ end }}
{{- if not (hasKey $values "NAMESPACE_SELECTOR") }}{{ $_ := set $values "NAMESPACE_SELECTOR" (include "config-watcher.namespaceOptIn" .) }}{{ end }}
{{- if not (hasKey $values "POD_OPT_IN_LABEL") }}{{ $_ := set $values "POD_OPT_IN_LABEL" (include "config-watcher.podOptIn" .) }}{{ end }}
{{- end }}
{{- if and .Values.secrets.enabled (not (hasKey $values "WATCH_SECRETS")) }}
{{- $_ := set $values "WATCH_SECRETS" "true" }}
{{- end }}
{{- $order := list "API_URL" "WATCH_NAMESPACE" }}
{{- if .Values.clusterWide.enabled }}
{{- $order = list "WATCH_NAMESPACE" "LEASE_NAMESPACE" "NAMESPACE_SELECTOR" "POD_OPT_IN_LABEL" "API_URL" }}
{{- end }}
{{- $order = concat (list "WATCH_SECRETS") $order (list "POD_NAME" "POD_NAMESPACE" "POD_UID" "LEADER_ELECT" "LOG_FORMAT") }}
{{- $all := list }}
{{- range $order }}
{{- if or (hasKey $values .) (hasKey $fieldRef .) }}{{ $all = append $all . }}{{ end }}
{{- end }}
{{- range concat (keys $values) (keys $fieldRef) | sortAlpha }}
{{- if not (has . $order) }}{{ $all = append $all . }}{{ end }}
{{- end }}
{{- range $all }}
- name: {{ . }}
{{- if hasKey $fieldRef . }}
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: {{ index $fieldRef . }}
{{- else }}
  value: {{ index $values . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Lease's name, which the Role grants by name. */}}
{{- define "config-watcher.leaseName" -}}
{{- (.Values.settings | default dict).leaseName | default "config-watcher" -}}
{{- end }}

{{/* Whether pods are evicted rather than deleted: the rules then grant the eviction. */}}
{{- define "config-watcher.evicts" -}}
{{- if eq (lower (toString ((.Values.settings | default dict).restartStrategy | default "delete"))) "evict" }}true{{ end -}}
{{- end }}

{{/* The name of the Secret holding the digest key; fails, saying how, without one. */}}
{{- define "config-watcher.digestKeySecret" -}}
{{- $k := .Values.secrets.digestKey -}}
{{- if $k.existingSecret -}}
{{ $k.existingSecret }}
{{- else if $k.key -}}
config-watcher-digest-key
{{- else -}}
{{ fail "secrets.enabled needs the digest key: set secrets.digestKey.existingSecret to a Secret holding it under `key` (kubectl create secret generic config-watcher-digest-key --from-literal=key=\"$(head -c 32 /dev/urandom | base64)\"), or secrets.digestKey.key to such a key (head -c 32 /dev/urandom | base64), which the chart keeps in a Secret" }}
{{- end -}}
{{- end }}
