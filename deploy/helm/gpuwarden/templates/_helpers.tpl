{{/*
Names are fixed (gpuwarden-adapter, gpuwarden-controller, ...), as in deploy/: the APIServices are
cluster-wide, so one release per cluster; the config, the RBAC resourceNames and the scheduler's urlPrefix
refer to these names.
*/}}

{{- define "gpuwarden.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "gpuwarden.adapterServiceAccount" -}}
{{- default "gpuwarden-adapter" .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels of every object: (dict "root" $ "component" "adapter"); component may be empty. */}}
{{- define "gpuwarden.labels" -}}
app.kubernetes.io/name: gpuwarden
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
app.kubernetes.io/part-of: gpuwarden
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- if .root.Values.controller.dryRun }}
gpuwarden.io/mode: dry-run
{{- end }}
{{- with .root.Values.customLabels }}
{{ toYaml . }}
{{- end }}
{{- with .labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
metadata: of an object: (dict "root" $ "name" "gpuwarden-adapter" "component" "adapter" "namespace" "...").
"namespace" absent: cluster-scoped. "labels" / "annotations": extra labels / annotations of this object.
*/}}
{{- define "gpuwarden.metadata" -}}
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "gpuwarden.labels" . | nindent 4 }}
  {{- $annotations := merge (dict) (.annotations | default dict) (.root.Values.customAnnotations | default dict) }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The selector labels of a component's pods (as deploy/: never changed, Deployment selectors are immutable). */}}
{{- define "gpuwarden.selector" -}}
app.kubernetes.io/name: gpuwarden
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/* gpuwarden's image; a prometheus-adapter image from a migrated values file is replaced by gpuwarden's. */}}
{{- define "gpuwarden.image" -}}
{{- $repo := .Values.image.repository -}}
{{- $tag := .Values.image.tag | default "" | toString -}}
{{- if contains "prometheus-adapter" $repo -}}
{{- $repo = "ghcr.io/gpuwarden/gpuwarden" -}}
{{- $tag = "" -}}
{{- end -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion $tag) -}}
{{- end -}}

{{/* Restricted-profile pod and container security contexts of the gpuwarden Deployments. */}}
{{- define "gpuwarden.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuwarden.securityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Spread a Deployment's replicas over nodes. */}}
{{- define "gpuwarden.spread" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "gpuwarden.selector" . | nindent 6 }}
{{- end -}}

{{/* An APIService of the adapter: (dict "root" $ "group" "custom.metrics.k8s.io" "version" "v1beta2" "priority" 200). */}}
{{- define "gpuwarden.apiservice" -}}
{{- $v := .root.Values -}}
apiVersion: apiregistration.k8s.io/v1
kind: APIService
{{ include "gpuwarden.metadata" (dict "root" .root "name" (printf "%s.%s" .version .group) "component" "adapter") }}
{{- with .displaced }}
  annotations:
    # apiServices.takeOver: who served it before this release (docs/uninstall.md restores it)
    gpuwarden.io/displaced-service: {{ . | quote }}
{{- end }}
spec:
  group: {{ .group }}
  version: {{ .version }}
  service:
    name: gpuwarden-adapter
    namespace: {{ include "gpuwarden.namespace" .root }}
    port: {{ $v.service.port }}
  groupPriorityMinimum: 100
  versionPriority: {{ .priority }}
  {{- if $v.tls.enable }}
  caBundle: {{ $v.tls.ca | b64enc }}
  {{- else }}
  insecureSkipTLSVerify: true
  {{- if .displaced }}
  # taken over: the displaced owner's caBundle is emptied (Helm's patch of the live object keeps a field the
  # manifest leaves out or sets null, and the API server refuses insecureSkipTLSVerify beside a caBundle -
  # seen against KEDA and prometheus-adapter)
  caBundle: ""
  {{- end }}
  {{- end }}
{{- end -}}

{{/*
The APIServices this release registers, as a YAML list of {group, version, priority, value}: value is the
chart value that switches it off. Empty unless adapter.enabled.
*/}}
{{- define "gpuwarden.apiServiceList" -}}
{{- $v := .Values -}}
{{- $list := list -}}
{{- if $v.adapter.enabled -}}
{{- if $v.apiServices.customMetrics.enabled -}}
{{- $list = append $list (dict "group" "custom.metrics.k8s.io" "version" "v1beta1" "priority" 100 "value" "apiServices.customMetrics.enabled=false") -}}
{{- $list = append $list (dict "group" "custom.metrics.k8s.io" "version" "v1beta2" "priority" 200 "value" "apiServices.customMetrics.enabled=false") -}}
{{- end -}}
{{- $external := $v.apiServices.externalMetrics.enabled -}}
{{- if kindIs "invalid" $external }}{{ $external = not $v.keda.enabled }}{{ end -}}
{{- if $external -}}
{{- $list = append $list (dict "group" "external.metrics.k8s.io" "version" "v1beta1" "priority" 100 "value" "apiServices.externalMetrics.enabled=false") -}}
{{- end -}}
{{- if include "gpuwarden.resourceMetrics" . -}}
{{- $list = append $list (dict "group" "metrics.k8s.io" "version" "v1beta1" "priority" 100 "value" "resourceMetrics.enabled=false") -}}
{{- end -}}
{{- end -}}
{{- toYaml $list -}}
{{- end -}}

{{/*
The APIService (dict "root" $ "api" <an apiServiceList item>) as the cluster has it now (lookup; nothing in
`helm template`): "" when absent or this release's own (its Service is gpuwarden-adapter in the release
namespace, or Helm's release annotations name this release). Served by someone else: fails naming the owner
and the value to set, or with apiServices.takeOver returns "<namespace>/<name>" of the displaced Service.
*/}}
{{- define "gpuwarden.apiServiceOwner" -}}
{{- $root := .root -}}
{{- $name := printf "%s.%s" .api.version .api.group -}}
{{- $found := lookup "apiregistration.k8s.io/v1" "APIService" "" $name -}}
{{- if $found -}}
{{- $ns := include "gpuwarden.namespace" $root -}}
{{- $svc := $found.spec.service | default dict -}}
{{- $meta := $found.metadata.annotations | default dict -}}
{{- $labels := $found.metadata.labels | default dict -}}
{{- $ourService := and (eq ($svc.name | default "") "gpuwarden-adapter") (eq ($svc.namespace | default "") $ns) -}}
{{- $ourRelease := and (eq (index $meta "meta.helm.sh/release-name" | default "") $root.Release.Name) (eq (index $meta "meta.helm.sh/release-namespace" | default "") $root.Release.Namespace) -}}
{{- if not (or $ourService $ourRelease) -}}
{{- $owner := "kube-apiserver itself (a Local APIService)" -}}
{{- if $svc.name -}}
{{- $owner = printf "Service %s/%s" $svc.namespace $svc.name -}}
{{- with index $meta "meta.helm.sh/release-name" -}}
{{- $owner = printf "%s of Helm release %s/%s" $owner (index $meta "meta.helm.sh/release-namespace") . -}}
{{- else -}}
{{- with index $labels "app.kubernetes.io/name" -}}{{- $owner = printf "%s (app.kubernetes.io/name=%s)" $owner . -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $root.Values.apiServices.takeOver -}}
{{- fail (printf "APIService %s is served by %s. To leave it to its owner set %s; to move it to gpuwarden set apiServices.takeOver=true and run helm with --take-ownership (docs/install.md#beside-prometheus-adapter-and-keda)." $name $owner .api.value) -}}
{{- end -}}
{{- /* An upgrade cannot take it: Helm patches it against the previous release, which did not hold it, and
     leaves it with its owner while reporting success (seen with Helm v3.22.0, tests/e2e/test_beside_incumbents.py). */ -}}
{{- if $root.Release.IsUpgrade -}}
{{- fail (printf "APIService %s is served by %s, and helm upgrade cannot take it over (Helm would leave it with its owner). Take it over with a fresh install: helm uninstall %s, then helm install --take-ownership --set apiServices.takeOver=true (docs/install.md#beside-prometheus-adapter-and-keda)." $name $owner $root.Release.Name) -}}
{{- end -}}
{{- if $svc.name -}}{{ printf "%s/%s" $svc.namespace $svc.name }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Which capabilities' rights the controller's RBAC grants, read from the config it runs with (include
"gpuwarden.config": controller.capabilities, mode and config: merged), so RBAC and behaviour cannot disagree.
rbac.everyCapability: all of them (as deploy/base, whose config can switch any on).
*/}}
{{- define "gpuwarden.controllerRights" -}}
{{- $cfg := include "gpuwarden.config" . | fromYaml -}}
{{- $all := .Values.rbac.everyCapability -}}
{{- $get := dict -}}
{{- range $name := list "health" "nominations" "drain" "idle" "extender" -}}
{{- $_ := set $get $name (or $all (index $cfg $name | default dict).enabled) -}}
{{- end -}}
{{- $room := or $all ((($cfg.preemption | default dict).make_room | default dict).enabled) -}}
{{- $escalation := or $all (((($cfg.nominations | default dict).escalation | default dict).enabled) | default false) -}}
{{- $validation := or $all (((($cfg.health | default dict).validation | default dict).enabled) | default false) -}}
health: {{ $get.health }}
nominations: {{ $get.nominations }}
drain: {{ $get.drain }}
idle: {{ $get.idle }}
extender: {{ $get.extender }}
gpuPreemption: {{ $room }}
validation: {{ and $validation $get.health }}
eviction: {{ or $get.drain $room $get.idle (and $escalation $get.nominations) }}
{{- end -}}

{{/*
gpuwarden-scheduler's image: scheduler.image when pinned, else kube-scheduler of the cluster's own version
(.Capabilities.KubeVersion, "v1.36.2-eks-1f2a" -> v1.36.2), as a managed control plane runs it.
*/}}
{{- define "gpuwarden.schedulerImage" -}}
{{- if .Values.scheduler.image -}}
{{- .Values.scheduler.image -}}
{{- else -}}
{{- printf "registry.k8s.io/kube-scheduler:%s" (regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
