{{- define "castad.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "castad.serviceAccountName" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
  {{- with .Values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: false
{{- end -}}
{{- end -}}

{{- define "castad.podDisruptionBudget" -}}
{{- if .Values.podDisruptionBudget.enabled -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "castad.fullname" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "castad.selectorLabels" . | nindent 6 }}
{{- end -}}
{{- end -}}

{{- define "castad.horizontalPodAutoscaler" -}}
{{- if .Values.autoscaling.enabled -}}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "castad.fullname" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "castad.fullname" . }}
  minReplicas: {{ .Values.autoscaling.minReplicas }}
  maxReplicas: {{ .Values.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ .Values.autoscaling.targetCPUUtilizationPercentage }}
  behavior:
    scaleDown:
      # A stage scaled in hands its running attempts back; scale in slowly.
      stabilizationWindowSeconds: 300
{{- end -}}
{{- end -}}

{{- define "castad.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "castad.fullname" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
spec:
  type: {{ .Values.service.type }}
  ports:
    - name: {{ .Values.portName }}
      port: {{ .Values.service.port }}
      targetPort: {{ .Values.portName }}
      protocol: TCP
  selector:
    {{- include "castad.selectorLabels" . | nindent 4 }}
{{- end -}}

{{/*
Migrations of the service's database, run by Helm before an install or upgrade starts any new pod.
Safe twice and beside the old pods: the service's migrate command takes an advisory lock, and
every migration only adds (expand/contract; see docs/deploy.md).
*/}}
{{- define "castad.migrationsJob" -}}
{{- if .Values.migrations.enabled -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ printf "%s-migrate-%d" (include "castad.fullname" .) .Release.Revision | trunc 63 | trimSuffix "-" }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
  annotations:
    helm.sh/hook: pre-install,pre-upgrade
    helm.sh/hook-weight: "-5"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  backoffLimit: {{ .Values.migrations.backoffLimit }}
  activeDeadlineSeconds: {{ .Values.migrations.activeDeadlineSeconds }}
  ttlSecondsAfterFinished: 86400
  template:
    metadata:
      labels:
        {{- include "castad.selectorLabels" . | nindent 8 }}
        app.kubernetes.io/component: migrations
    spec:
      restartPolicy: Never
      # Runs before the chart's ServiceAccount exists; it needs no Kubernetes API.
      automountServiceAccountToken: false
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.podSecurityContext | nindent 8 }}
      containers:
        - name: migrate
          image: {{ include "castad.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args: ["migrate"]
          env:
            {{- include "castad.env" . | nindent 12 }}
          resources:
            {{- toYaml .Values.migrations.resources | nindent 12 }}
          securityContext:
            {{- toYaml .Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
{{- end -}}
{{- end -}}

{{/*
The service's queues and bindings, and the exchanges every service shares, declared by Helm before an install or
upgrade starts any new pod (topology.enabled), with a broker user that may configure the vhost: so that an event
never waits on the order in which charts are installed, and a release that binds a new event type has its binding
before its first pod. Before the migrations (their weight is -5); safe twice, every declare is idempotent.
*/}}
{{- define "castad.topologyJob" -}}
{{- if .Values.topology.enabled -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ printf "%s-topology-%d" (include "castad.fullname" .) .Release.Revision | trunc 63 | trimSuffix "-" }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
  annotations:
    helm.sh/hook: pre-install,pre-upgrade
    helm.sh/hook-weight: "-10"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  backoffLimit: {{ .Values.topology.backoffLimit }}
  activeDeadlineSeconds: {{ .Values.topology.activeDeadlineSeconds }}
  ttlSecondsAfterFinished: 86400
  template:
    metadata:
      labels:
        {{- include "castad.selectorLabels" . | nindent 8 }}
        app.kubernetes.io/component: topology
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.podSecurityContext | nindent 8 }}
      containers:
        - name: declare
          image: {{ include "castad.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args: ["declare"]
          env:
            {{- include "castad.env" . | nindent 12 }}
            - name: CASTAD_TOPOLOGY_AMQP_URL
              valueFrom:
                secretKeyRef:
                  name: {{ required "topology.existingSecret: a Secret holding the URL of a broker user that may configure the vhost" .Values.topology.existingSecret | quote }}
                  key: {{ .Values.topology.key | quote }}
          resources:
            {{- toYaml .Values.migrations.resources | nindent 12 }}
          securityContext:
            {{- toYaml .Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
{{- end -}}
{{- end -}}

{{/*
A PodMonitor for the Prometheus Operator (metrics.podMonitor.enabled): the pods' /metrics on their port,
the job named after the service (castad-api, ...) as infra/observability/alerts.yml expects. A PodMonitor,
not a ServiceMonitor: only the gateway has a Service.
*/}}
{{- define "castad.podMonitor" -}}
{{- if .Values.metrics.podMonitor.enabled -}}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ include "castad.fullname" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
    {{- with .Values.metrics.podMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  jobLabel: app.kubernetes.io/name
  selector:
    matchLabels:
      {{- include "castad.selectorLabels" . | nindent 6 }}
  podMetricsEndpoints:
    - port: {{ include "castad.probesPortName" . }}
      path: /metrics
      interval: {{ .Values.metrics.podMonitor.interval }}
{{- end -}}
{{- end -}}
