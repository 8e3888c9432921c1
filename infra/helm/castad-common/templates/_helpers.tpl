{{/*
Names and labels. A service chart sets `component` in its values (api, relay, lyric, song, video).
*/}}
{{- define "castad.name" -}}
{{- printf "castad-%s" .Values.component -}}
{{- end -}}

{{- define "castad.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "castad.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "castad.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "castad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "castad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "castad.labels" -}}
{{ include "castad.selectorLabels" . }}
app.kubernetes.io/version: {{ include "castad.version" . | quote }}
app.kubernetes.io/component: {{ .Values.component }}
app.kubernetes.io/part-of: castad
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "castad.version" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "castad.image" -}}
{{- $registry := .Values.global.imageRegistry | default .Values.image.registry -}}
{{- printf "%s/%s:%s" $registry .Values.image.repository (include "castad.version" .) -}}
{{- end -}}

{{/*
Where the service answers /healthz, /readyz and /metrics: a worker on containerPort, the gateway on probesPort when
set (CASTAD_API_HEALTH_PORT), else on its HTTP port.
*/}}
{{- define "castad.probesPort" -}}
{{- if and (eq .Values.component "api") .Values.probesPort -}}
{{- .Values.probesPort -}}
{{- else -}}
{{- .Values.containerPort -}}
{{- end -}}
{{- end -}}

{{- define "castad.probesPortName" -}}
{{- if and (eq .Values.component "api") .Values.probesPort -}}
probes
{{- else -}}
{{- .Values.portName -}}
{{- end -}}
{{- end -}}

{{- define "castad.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "castad.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The effective settings: the service's own, with the umbrella chart's global.settings on top.
*/}}
{{- define "castad.settings" -}}
{{- $settings := deepCopy .Values.settings -}}
{{- range $name, $value := (.Values.global.settings | default dict) -}}
{{- $_ := set $settings $name $value -}}
{{- end -}}
{{- toJson $settings -}}
{{- end -}}

{{/*
A value for an environment variable: strings as they are, numbers and booleans as JSON (so
16777216 stays 16777216, never 1.6777216e+07).
*/}}
{{- define "castad.envValue" -}}
{{- if kindIs "string" . -}}{{ . | quote }}{{- else -}}{{ . | toJson | quote }}{{- end -}}
{{- end -}}

{{- define "castad.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s: the name of an existing Secret is required" .what) .secret.existingSecret }}
      key: {{ .secret.key }}
{{- end -}}

{{/*
Environment of every container of the service (the Deployment's and the migrations Job's):
connection URLs from existing Secrets, every CASTAD_* setting, OpenTelemetry.
*/}}
{{- define "castad.env" -}}
{{- $upper := upper .Values.component -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{ include "castad.secretEnv" (dict "name" "CASTAD_AMQP_URL" "secret" .Values.broker "what" "broker") }}
{{- if .Values.database }}
{{ include "castad.secretEnv" (dict "name" (printf "CASTAD_%s_DATABASE_URL" $upper) "secret" .Values.database "what" "database") }}
{{- end }}
{{- if eq .Values.component "api" }}
- name: CASTAD_API_HOST
  value: "0.0.0.0"
- name: CASTAD_API_PORT
  value: {{ .Values.containerPort | quote }}
{{- if .Values.probesPort }}
- name: CASTAD_API_HEALTH_PORT
  value: {{ .Values.probesPort | quote }}
{{- end }}
{{- else }}
- name: {{ printf "CASTAD_%s_HEALTH_PORT" $upper }}
  value: {{ .Values.containerPort | quote }}
{{- end }}
{{- $sources := list }}
{{- range .Values.sources }}
{{ include "castad.secretEnv" (dict "name" (printf "CASTAD_RELAY_SOURCE_%s" (upper .name)) "secret" . "what" (printf "sources (%s)" .name)) }}
{{- $sources = append $sources (printf "%s=$(CASTAD_RELAY_SOURCE_%s)" .name (upper .name)) }}
{{- end }}
{{- if $sources }}
- name: CASTAD_RELAY_SOURCES
  value: {{ join "," $sources | quote }}
{{- end }}
{{- range $name, $secret := .Values.secretSettings }}
{{ include "castad.secretEnv" (dict "name" $name "secret" $secret "what" (printf "secretSettings (%s)" $name)) }}
{{- end }}
{{- range $name, $value := (include "castad.settings" . | fromJson) }}
{{- if not (kindIs "invalid" $value) }}{{/* null: the service's own default */}}
- name: {{ $name }}
  value: {{ include "castad.envValue" $value }}
{{- end }}
{{- end }}
{{- if .Values.artifacts }}
- name: CASTAD_ARTIFACTS_DIR
  value: {{ .Values.artifacts.mountPath | quote }}
- name: CASTAD_ARTIFACTS_STORE
  value: {{ .Values.artifacts.store | quote }}
{{- end }}
{{- $otel := .Values.global.otel | default .Values.otel }}
{{- if $otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: http/protobuf
{{- else }}
- name: OTEL_TRACES_EXPORTER
  value: none
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ include "castad.name" . }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)"
{{- end -}}
