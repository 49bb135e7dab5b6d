{{/*
The gpuwarden config file (docs/configuration.md) the values produce, as a YAML document; config: is merged
over it last. Shared by the adapter and the controller, as deploy/base/configmap.yaml.
*/}}
{{- define "gpuwarden.config" -}}
{{- $v := .Values -}}
{{- $adapter := dict "secure_port" (int $v.listenPort) "relist_interval_seconds" (include "gpuwarden.seconds" (dict "key" "metricsRelistInterval" "value" $v.metricsRelistInterval) | atoi) -}}
{{- /* rules.existing: the adapter alone reads it, as its rules_file (GPUWARDEN_ADAPTER__RULES_FILE). */ -}}
{{- if not $v.rules.existing -}}
{{- $rules := list -}}
{{- if $v.rules.default -}}
{{- $rules = concat $rules (include "gpuwarden.defaultRules" . | fromYamlArray) -}}
{{- end -}}
{{- $rules = concat $rules ($v.rules.custom | default list) -}}
{{- with $rules }}{{ $_ := set $adapter "rules" . }}{{ end -}}
{{- with $v.rules.external }}{{ $_ := set $adapter "externalRules" . }}{{ end -}}
{{- with $v.rules.resource }}{{ $_ := set $adapter "resourceRules" . }}{{ end -}}
{{- end -}}
{{- if $v.tls.enable -}}
{{- $_ := set $adapter "tls" (dict "cert_file" "/etc/gpuwarden-tls/tls.crt" "key_file" "/etc/gpuwarden-tls/tls.key") -}}
{{- end -}}
{{- /* keda.enabled itself is the adapter's env (GPUWARDEN_ADAPTER__KEDA__ENABLED), as in deploy/overlays/keda;
     only settings that differ from the defaults go into the shared config. */ -}}
{{- if $v.keda.enabled -}}
{{- $keda := dict -}}
{{- if ne (int $v.keda.port) 6000 }}{{ $_ := set $keda "port" (int $v.keda.port) }}{{ end -}}
{{- if $v.keda.tls.plaintext }}{{ $_ := set $keda "tls" (dict "plaintext" true) }}{{ end -}}
{{- if $v.keda.tls.existingSecret -}}
{{- $kedaTLS := dict "cert_file" "/etc/gpuwarden-keda-tls/tls.crt" "key_file" "/etc/gpuwarden-keda-tls/tls.key" -}}
{{- if $v.keda.tls.mutualTLS }}{{ $_ := set $kedaTLS "client_ca_file" "/etc/gpuwarden-keda-tls/ca.crt" }}{{ end -}}
{{- $_ := set $keda "tls" $kedaTLS -}}
{{- end -}}
{{- with $keda }}{{ $_ := set $adapter "keda" . }}{{ end -}}
{{- end -}}
{{- $port := ternary (printf ":%v" $v.prometheus.port) "" (not (empty (toString ($v.prometheus.port | default "")))) -}}
{{- $url := printf "%s%s%s" (tpl $v.prometheus.url .) $port ($v.prometheus.path | default "") -}}
{{- $level := ternary "debug" "info" (ge (int $v.logLevel) 5) -}}
{{- $cfg := dict
      "prometheus" (dict "url" $url)
      "kubernetes" (dict "namespace" (include "gpuwarden.namespace" .) "leader_election" (dict "lease_name" "gpuwarden-controller"))
      "adapter" $adapter
      "extender" (dict "port" 8888 "path_prefix" "/gpuwarden")
      "logging" (dict "format" "json" "level" $level) -}}
{{- /* Each controller capability: on/off, and observe (dry_run) or act (controller.capabilities, mode). */ -}}
{{- $caps := $v.controller.capabilities -}}
{{- range $name, $section := dict "health" "health" "nominations" "nominations" "preemptionThrottle" "preemption" "drain" "drain" "idle" "idle" -}}
{{- $_ := set $cfg $section (include "gpuwarden.capability" (dict "root" $ "cap" (index $caps $name)) | fromYaml) -}}
{{- end -}}
{{- $_ := set $cfg.preemption "make_room" (include "gpuwarden.capability" (dict "root" $ "cap" $caps.gpuPreemption) | fromYaml) -}}
{{- $_ := set $cfg.extender "enabled" $caps.extender.enabled -}}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy ($v.config | default dict))) -}}
{{- end -}}

{{/* observe or act of one capability: (dict "root" $ "mode" "<its mode value>"); empty: the top-level mode. */}}
{{- define "gpuwarden.mode" -}}
{{- .mode | default .root.Values.mode -}}
{{- end -}}

{{/*
A capability's config keys (dict "root" $ "cap" <controller.capabilities item>): enabled, and dry_run true when
it observes, false when it acts and is on (off and acting: the section's own default, e.g. idle's dry-run).
*/}}
{{- define "gpuwarden.capability" -}}
{{- $observe := eq (include "gpuwarden.mode" (dict "root" .root "mode" .cap.mode)) "observe" -}}
enabled: {{ .cap.enabled }}
{{- if or $observe .cap.enabled }}
dry_run: {{ $observe }}
{{- end }}
{{- end -}}

{{/* A duration value ("90s", "1m", "2h", or a number of seconds) in whole seconds; fails naming the key. */}}
{{- define "gpuwarden.seconds" -}}
{{- $s := toString .value -}}
{{- if regexMatch "^[0-9]+$" $s -}}{{ $s }}
{{- else if regexMatch "^[0-9]+s$" $s -}}{{ trimSuffix "s" $s }}
{{- else if regexMatch "^[0-9]+m$" $s -}}{{ mul (trimSuffix "m" $s | atoi) 60 }}
{{- else if regexMatch "^[0-9]+h$" $s -}}{{ mul (trimSuffix "h" $s | atoi) 3600 }}
{{- else -}}{{ fail (printf "%s: %q is not a duration gpuwarden reads; use whole seconds, minutes or hours (90s, 1m, 2h)" .key $s) }}
{{- end -}}
{{- end -}}

{{/*
prometheus-adapter chart's `rules.default: true` set: its six discovery rules, so a migrated values file serves
the same custom metrics (container_* per pod, and every other namespaced series).
*/}}
{{- define "gpuwarden.defaultRules" -}}
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: []
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: ^container_(.*)_seconds_total$, as: ""}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_seconds_total$}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: ^container_(.*)_total$, as: ""}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_total$}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: ^container_(.*)$, as: ""}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_total$}]
  resources: {template: <<.Resource>>}
  name: {matches: "", as: ""}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_seconds_total}]
  resources: {template: <<.Resource>>}
  name: {matches: ^(.*)_total$, as: ""}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: []
  resources: {template: <<.Resource>>}
  name: {matches: ^(.*)_seconds_total$, as: ""}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
{{- end -}}

{{/*
prometheus-adapter values that have no meaning here, or only some values of which do: each fails with the key
and what to do instead. Called by every template run (templates/validate.yaml).
*/}}
{{- define "gpuwarden.validate" -}}
{{- $v := .Values -}}
{{- if $v.psp.create -}}
{{- fail "psp.create: PodSecurityPolicy was removed in Kubernetes 1.25; gpuwarden relies on Pod Security Admission (label the release namespace pod-security.kubernetes.io/enforce=restricted). Remove psp.create or set it to false." -}}
{{- end -}}
{{- if $v.hostNetwork.enabled -}}
{{- fail "hostNetwork.enabled: not supported: the adapter runs under the restricted Pod Security level, which forbids host networking; kube-apiserver's aggregator reaches it through its Service. Set it to false." -}}
{{- end -}}
{{- with $v.extraArguments -}}
{{- fail (printf "extraArguments: %v: prometheus-adapter command-line flags mean nothing to `gpuwarden adapter`; set the equivalent under config: (docs/configuration.md, section adapter), e.g. --metrics-max-age -> config.adapter.metrics_max_age_seconds, --tls-cert-file -> tls.certificate" .) -}}
{{- end -}}
{{- if $v.certManager.enabled -}}
{{- fail "certManager.enabled: not supported: issue a Certificate for gpuwarden-adapter.<namespace>.svc yourself and pass it as tls.certificate / tls.key / tls.ca with tls.enable: true (the adapter reloads a rotated pair without a restart)." -}}
{{- end -}}
{{- if ne $v.service.type "ClusterIP" -}}
{{- fail (printf "service.type: %q is not supported: the APIServices reach the adapter through a ClusterIP Service; use ClusterIP." $v.service.type) -}}
{{- end -}}
{{- if and (not $v.serviceAccount.create) (not $v.serviceAccount.name) -}}
{{- fail "serviceAccount.name: required when serviceAccount.create is false (the adapter's pods and RBAC bindings name it)." -}}
{{- end -}}
{{- if and $v.keda.tls.plaintext $v.keda.tls.existingSecret -}}
{{- fail "keda.tls.plaintext: cannot be combined with keda.tls.existingSecret; drop one of them." -}}
{{- end -}}
{{- if and $v.keda.tls.mutualTLS (not $v.keda.tls.existingSecret) -}}
{{- fail "keda.tls.mutualTLS: needs keda.tls.existingSecret, a Secret whose ca.crt signs the client certificate KEDA presents." -}}
{{- end -}}
{{- if and $v.keda.enabled (eq (int $v.keda.port) (int $v.listenPort)) -}}
{{- fail (printf "keda.port: %v is listenPort too; choose another port." $v.keda.port) -}}
{{- end -}}
{{- if $v.tls.enable -}}
{{- range $key := list "ca" "certificate" "key" -}}
{{- if not (contains "-----BEGIN" (index $v.tls $key | default "")) -}}
{{- fail (printf "tls.%s: a PEM block is required when tls.enable is true" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $kp := $v.resourceMetrics.kubePrometheusRules -}}
{{- if and (eq (toString $v.resourceMetrics.enabled) "true") (not $v.rules.resource) (not $v.rules.existing) (not $kp) -}}
{{- fail "resourceMetrics.enabled: metrics.k8s.io needs resource rules: rules.resource (cpu and memory queries), rules.existing, or resourceMetrics.kubePrometheusRules: true." -}}
{{- end -}}
{{- if and $kp (or $v.rules.existing $v.rules.resource) -}}
{{- fail "resourceMetrics.kubePrometheusRules: the adapter reads one rules file and one set of resourceRules; drop rules.existing / rules.resource, or this." -}}
{{- end -}}
{{- if and $kp (eq (toString $v.resourceMetrics.enabled) "false") -}}
{{- fail "resourceMetrics.kubePrometheusRules: needs resourceMetrics.enabled (null or true): without the metrics.k8s.io APIService nothing reads them." -}}
{{- end -}}
{{- if hasKey (($v.config | default dict).adapter | default dict) "secure_port" -}}
{{- fail "config.adapter.secure_port: set listenPort instead (the container port and the Service's target follow it)." -}}
{{- end -}}
{{- with $v.podDisruptionBudget -}}
{{- if and .enabled (not (kindIs "invalid" .minAvailable)) (not (kindIs "invalid" .maxUnavailable)) -}}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both (set the other to null)." -}}
{{- end -}}
{{- end -}}
{{- $_ := include "gpuwarden.seconds" (dict "key" "metricsRelistInterval" "value" $v.metricsRelistInterval) -}}
{{- if not $v.adapter.enabled -}}
{{- if $v.keda.enabled -}}
{{- fail "keda.enabled: KEDA's scaler is served by the adapter; set adapter.enabled=true, or keda.enabled=false." -}}
{{- end -}}
{{- if eq (toString $v.resourceMetrics.enabled) "true" -}}
{{- fail "resourceMetrics.enabled: metrics.k8s.io is served by the adapter; set adapter.enabled=true, or resourceMetrics.enabled=false." -}}
{{- end -}}
{{- end -}}
{{- if and $v.scheduler.enabled (not (and $v.controller.enabled $v.controller.capabilities.extender.enabled)) -}}
{{- fail "scheduler.enabled: gpuwarden-scheduler calls the controller's extender; set controller.enabled=true and controller.capabilities.extender.enabled=true, or scheduler.enabled=false." -}}
{{- end -}}
{{- if and $v.controller.capabilities.drain.enabled (not $v.controller.capabilities.health.enabled) -}}
{{- fail "controller.capabilities.drain.enabled: drain moves work off nodes health quarantined; set controller.capabilities.health.enabled=true, or drain off." -}}
{{- end -}}
{{- end -}}

{{/* Whether metrics.k8s.io is served: resourceMetrics.enabled, or null and resource rules given. */}}
{{- define "gpuwarden.resourceMetrics" -}}
{{- $on := .Values.resourceMetrics.enabled -}}
{{- if kindIs "invalid" $on -}}{{ $on = or (not (empty .Values.rules.resource)) .Values.resourceMetrics.kubePrometheusRules }}{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* prometheus-adapter chart 4.x's default probes: taken as "no opinion", gpuwarden's own are used. */}}
{{- define "gpuwarden.probe" -}}
{{- $upstream := dict "httpGet" (dict "path" "/healthz" "port" "https" "scheme" "HTTPS") "initialDelaySeconds" 30 "timeoutSeconds" 5 -}}
{{- if or (not .value) (eq (toJson .value) (toJson $upstream)) -}}
{{- .default -}}
{{- else -}}
{{- toYaml .value -}}
{{- end -}}
{{- end -}}
