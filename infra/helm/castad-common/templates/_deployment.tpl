{{/*
The service's Deployment. Workers answer their probes and /metrics on containerPort
(CASTAD_<SERVICE>_HEALTH_PORT), the gateway on probesPort (CASTAD_API_HEALTH_PORT; unset: on its HTTP
port); metrics.scrape annotates the pods so that a Prometheus that finds pods by annotations scrapes them
there. The gateway mounts the artifacts read-only (it serves them, the stages write them) but for `images/`, where
it keeps the images tenants upload (with a bucket it uploads them from memory and writes nothing here). A stage
mounts its own place, `<stage>/`, read-write, and the places in `artifacts.reads` read-only (the video stage the
song's and the images); `artifacts.wholeVolume` mounts the whole volume read-write instead, as up to 0.2.
*/}}
{{- define "castad.deployment" -}}
{{- if and .Values.probesPort (eq (int .Values.probesPort) (int .Values.containerPort)) -}}
{{- fail (printf "probesPort (%v) must differ from containerPort, or be null to serve the probes on the API's port" .Values.probesPort) -}}
{{- end -}}
{{- $stopGrace := index (include "castad.settings" . | fromJson) (printf "CASTAD_%s_STOP_GRACE_S" (upper .Values.component)) -}}
{{- if and (not (kindIs "invalid" $stopGrace)) (lt (float64 .Values.terminationGracePeriodSeconds) (addf $stopGrace 20)) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed CASTAD_%s_STOP_GRACE_S (%v) by at least 20 s: the hand-back and the consumer's stop come after it" .Values.terminationGracePeriodSeconds (upper .Values.component) $stopGrace) -}}
{{- end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "castad.fullname" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
spec:
  {{- if not (and .Values.autoscaling .Values.autoscaling.enabled) }}
  replicas: {{ .Values.replicaCount }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 0
      maxSurge: 1
  selector:
    matchLabels:
      {{- include "castad.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "castad.labels" . | nindent 8 }}
      {{- if or .Values.metrics.scrape .Values.podAnnotations }}
      annotations:
        {{- if .Values.metrics.scrape }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ include "castad.probesPort" . | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- with .Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "castad.serviceAccountName" . }}
      automountServiceAccountToken: false
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      # Longer than the service's own drain: see terminationGracePeriodSeconds in values.yaml.
      terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
      securityContext:
        {{- toYaml .Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ .Values.component }}
          image: {{ include "castad.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args: ["run"]
          ports:
            - name: {{ .Values.portName }}
              containerPort: {{ .Values.containerPort }}
              protocol: TCP
            {{- if ne (include "castad.probesPortName" .) .Values.portName }}
            - name: {{ include "castad.probesPortName" . }}
              containerPort: {{ include "castad.probesPort" . }}
              protocol: TCP
            {{- end }}
          env:
            {{- include "castad.env" . | nindent 12 }}
          startupProbe:
            httpGet:
              path: /healthz
              port: {{ include "castad.probesPortName" . }}
            periodSeconds: 2
            failureThreshold: 60
          livenessProbe:
            httpGet:
              path: /healthz
              port: {{ include "castad.probesPortName" . }}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 6
          readinessProbe:
            httpGet:
              path: /readyz
              port: {{ include "castad.probesPortName" . }}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          resources:
            {{- toYaml .Values.resources | nindent 12 }}
          securityContext:
            {{- toYaml .Values.securityContext | nindent 12 }}
          {{- if and .Values.artifacts (eq .Values.artifacts.store "s3") .Values.artifacts.credentialsSecret }}
          envFrom:
            - secretRef:
                name: {{ .Values.artifacts.credentialsSecret }}
          {{- end }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if .Values.artifacts }}
            {{- if or (eq .Values.component "api") (eq .Values.artifacts.store "s3") .Values.artifacts.wholeVolume }}
            - name: artifacts
              mountPath: {{ .Values.artifacts.mountPath }}
              {{- if eq .Values.component "api" }}
              readOnly: true
              {{- end }}
            {{- end }}
            {{- if ne .Values.artifacts.store "s3" }}
            {{- if eq .Values.component "api" }}
            - name: artifacts
              mountPath: {{ .Values.artifacts.mountPath }}/images
              subPath: images
            {{- else if not .Values.artifacts.wholeVolume }}
            # The stage writes its own place alone, and reads only the places it must.
            - name: artifacts
              mountPath: {{ .Values.artifacts.mountPath }}/{{ .Values.component }}
              subPath: {{ .Values.component }}
            {{- range .Values.artifacts.reads }}
            - name: artifacts
              mountPath: {{ $.Values.artifacts.mountPath }}/{{ . }}
              subPath: {{ . }}
              readOnly: true
            {{- end }}
            {{- end }}
            {{- end }}
            {{- end }}
      volumes:
        # The root filesystem is read-only; scratch space lives here.
        - name: tmp
          emptyDir:
            sizeLimit: {{ .Values.tmpSizeLimit }}
        {{- if .Values.artifacts }}
        - name: artifacts
          {{- if eq .Values.artifacts.store "s3" }}
          # Artifacts live in the bucket; this is scratch space for the files being made.
          emptyDir:
            sizeLimit: {{ .Values.artifacts.scratchSizeLimit }}
          {{- else }}
          persistentVolumeClaim:
            claimName: {{ ((.Values.global.artifacts | default dict).claimName) | default .Values.artifacts.claimName }}
          {{- end }}
        {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "castad.topologySpreadConstraints" . }}
      # No two replicas on one node by default: see castad-common's _spread.tpl.
      topologySpreadConstraints:
        {{- . | nindent 8 }}
      {{- end }}
{{- end -}}
