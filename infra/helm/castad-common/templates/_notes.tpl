{{- define "castad.notes" -}}
{{ include "castad.name" . }} {{ include "castad.version" . }} is {{ if .Release.IsInstall }}installed{{ else }}upgraded{{ end }} as {{ include "castad.fullname" . }} in {{ .Release.Namespace }}.

Follow the rollout (pods turn ready once /readyz reaches the database and RabbitMQ):
  kubectl -n {{ .Release.Namespace }} rollout status deployment/{{ include "castad.fullname" . }}
  kubectl -n {{ .Release.Namespace }} logs -l app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/name={{ include "castad.name" . }} -f
{{- if eq .Values.component "api" }}

Reach the gateway:
  kubectl -n {{ .Release.Namespace }} port-forward service/{{ include "castad.fullname" . }} 8000:{{ .Values.service.port }}
  castad --gateway http://127.0.0.1:8000 submit brief.json
{{- end }}
{{- if .Values.migrations }}{{ if .Values.migrations.enabled }}

The database was migrated by the hook Job {{ include "castad.fullname" . }}-migrate-{{ .Release.Revision }} before any new pod started.
{{- end }}{{ end }}
{{- $otel := .Values.global.otel | default .Values.otel }}
{{- if $otel.endpoint }}

Traces go to {{ $otel.endpoint }} (OTLP/HTTP) as service {{ include "castad.name" . }}.
{{- else }}

Tracing is off (otel.endpoint is empty).
{{- end }}

Roll back this service alone: helm -n {{ .Release.Namespace }} rollback {{ .Release.Name }} (see docs/deploy.md).
{{- end -}}
