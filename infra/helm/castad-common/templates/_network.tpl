{{/*
The service's NetworkPolicy (values `networkPolicy`, docs/deploy.md "Network"). Its pods, and the migrations Job's (the
same name and instance labels, the same database Secret), take connections only on their own ports: the gateway's API
port from `apiFrom` (empty: from anywhere: users, and providers calling back), the probe port's /metrics from
`metricsFrom`. The kubelet's probes come from the pod's own node, which NetworkPolicy never blocks. They reach only:
DNS, PostgreSQL, RabbitMQ, the trace collector (the port of otel.endpoint, when exporting), and where the service uses
them a stage's network provider (`provider`), the hosts of the photos briefs name by URL (`photos`, the video stage),
the gateway's webhook receivers (`webhooks`, given a webhook secret) and the object store (`objectStore`, artifacts.store
s3). No service calls the gateway: providers do, from outside.

Every ipBlock the chart renders has the link-local and cloud metadata ranges below taken out (its `except`), whatever
the values say: from there a cloud answers with the node's credentials. A peer that lies inside one is refused. Only
`extraEgress` is rendered as written, for what no value covers (DNS at a node-local address, a pod identity agent).
*/}}
{{/*
IPv4 link-local (AWS, GCP, Azure, OpenStack, Oracle and DigitalOcean's metadata at 169.254.169.254; ECS's and EKS Pod
Identity's credentials), Alibaba's metadata, IPv6 link-local, and AWS's (metadata, Pod Identity), GCP's and Oracle's
metadata over IPv6.
*/}}
{{- define "castad.metadataRanges" -}}
{{- list "169.254.0.0/16" "100.100.100.200/32" "fe80::/10" "fd00:ec2::254/128" "fd00:ec2::23/128" "fd20:ce::254/128" "fd00:c1::a9fe:a9fe/128" | toJson -}}
{{- end -}}

{{/*
A CIDR as the bits of its prefix, led by its family ("4" or "6"): one range holds another when its bits begin the
other's. IPv6 in hexadecimal groups, "::" allowed.
*/}}
{{- define "castad.cidrBits" -}}
{{- $parts := splitList "/" . -}}
{{- if ne (len $parts) 2 -}}{{- fail (printf "networkPolicy: %q is not a CIDR (address/prefix)" .) -}}{{- end -}}
{{- $address := index $parts 0 -}}
{{- $prefix := atoi (index $parts 1) -}}
{{- $bits := "" -}}
{{- $family := "4" -}}
{{- if contains ":" $address -}}
{{- $family = "6" -}}
{{- $hex := dict "0" "0000" "1" "0001" "2" "0010" "3" "0011" "4" "0100" "5" "0101" "6" "0110" "7" "0111" "8" "1000" "9" "1001" "a" "1010" "b" "1011" "c" "1100" "d" "1101" "e" "1110" "f" "1111" -}}
{{- $halves := splitList "::" (lower $address) -}}
{{- $head := list -}}
{{- if index $halves 0 }}{{ $head = splitList ":" (index $halves 0) }}{{ end -}}
{{- $tail := list -}}
{{- if and (eq (len $halves) 2) (index $halves 1) }}{{ $tail = splitList ":" (index $halves 1) }}{{ end -}}
{{- $groups := $head -}}
{{- if eq (len $halves) 2 -}}
{{- range until (int (sub 8 (add (len $head) (len $tail)))) }}{{ $groups = append $groups "0" }}{{ end -}}
{{- end -}}
{{- $groups = concat $groups $tail -}}
{{- if or (ne (len $groups) 8) (gt $prefix 128) -}}{{- fail (printf "networkPolicy: %q is not an IPv6 CIDR" .) -}}{{- end -}}
{{- range $groups -}}
{{- if gt (len .) 4 }}{{ fail (printf "networkPolicy: %q is not an IPv6 address" $address) }}{{ end -}}
{{- range splitList "" (printf "%4s" . | replace " " "0") -}}
{{- $bits = print $bits (required (printf "networkPolicy: %q is not an IPv6 address" $address) (get $hex .)) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $octets := splitList "." $address -}}
{{- if or (ne (len $octets) 4) (gt $prefix 32) -}}{{- fail (printf "networkPolicy: %q is not an IPv4 CIDR" .) -}}{{- end -}}
{{- range $octets -}}
{{- if gt (atoi .) 255 }}{{ fail (printf "networkPolicy: %q is not an IPv4 address" $address) }}{{ end -}}
{{- $bits = print $bits (printf "%08b" (atoi .)) -}}
{{- end -}}
{{- end -}}
{{- print $family (trunc $prefix $bits) -}}
{{- end -}}

{{/*
Peers (NetworkPolicyPeers) with every metadata range an ipBlock holds added to its except (unless an except of its
own covers it); `what` names the value in a refusal. As JSON.
*/}}
{{- define "castad.guardedPeers" -}}
{{- $ranges := include "castad.metadataRanges" . | fromJsonArray -}}
{{- $peers := list -}}
{{- range .peers -}}
{{- $peer := deepCopy . -}}
{{- if $peer.ipBlock -}}
{{- $block := $peer.ipBlock -}}
{{- $peerBits := include "castad.cidrBits" $block.cidr -}}
{{- $except := $block.except | default list -}}
{{- range $ranges -}}
{{- $rangeBits := include "castad.cidrBits" . -}}
{{- if hasPrefix $rangeBits $peerBits -}}
{{- fail (printf "networkPolicy.%s: %s lies inside %s, a link-local or cloud metadata range that no Castad pod may reach" $.what $block.cidr .) -}}
{{- else if hasPrefix $peerBits $rangeBits -}}
{{- $covered := false -}}
{{- range $except }}{{ if hasPrefix (include "castad.cidrBits" .) $rangeBits }}{{ $covered = true }}{{ end }}{{ end -}}
{{- if not $covered }}{{ $except = append $except . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if $except }}{{ $_ := set $block "except" $except }}{{ end -}}
{{- end -}}
{{- $peers = append $peers $peer -}}
{{- end -}}
{{- toJson $peers -}}
{{- end -}}

{{/*
The effective values: the service's own networkPolicy, with the umbrella chart's global.networkPolicy on top (each of
its keys, and within a key each field, wins). As JSON.
*/}}
{{- define "castad.networkPolicyValues" -}}
{{- $values := deepCopy .Values.networkPolicy -}}
{{- range $key, $value := (.Values.global.networkPolicy | default dict) -}}
{{- if and (kindIs "map" $value) (kindIs "map" (index $values $key)) -}}
{{- $merged := deepCopy (index $values $key) -}}
{{- range $field, $given := $value }}{{ $_ := set $merged $field $given }}{{ end -}}
{{- $_ := set $values $key $merged -}}
{{- else -}}
{{- $_ := set $values $key $value -}}
{{- end -}}
{{- end -}}
{{- toJson $values -}}
{{- end -}}

{{/* One egress rule: `target` {to, ports} (ports over `protocols`), its peers guarded. */}}
{{- define "castad.egressRule" -}}
- to:
    {{- include "castad.guardedPeers" (dict "peers" .target.to "what" .what) | fromJsonArray | toYaml | nindent 4 }}
  ports:
    {{- range $port := .target.ports }}
    {{- range $protocol := ($.protocols | default (list "TCP")) }}
    - port: {{ $port }}
      protocol: {{ $protocol }}
    {{- end }}
    {{- end }}
{{- end -}}

{{/* The trace collector's port: the one in otel.endpoint, else its scheme's. */}}
{{- define "castad.otelPort" -}}
{{- $url := urlParse . -}}
{{- $port := regexFind ":[0-9]+$" $url.host | trimPrefix ":" -}}
{{- $port | default (ternary "443" "80" (eq $url.scheme "https")) -}}
{{- end -}}

{{- define "castad.networkPolicy" -}}
{{- $np := include "castad.networkPolicyValues" . | fromJson -}}
{{- if $np.enabled -}}
{{- $settings := include "castad.settings" . | fromJson -}}
{{- $otel := .Values.global.otel | default .Values.otel -}}
{{- $provider := index $settings (printf "CASTAD_%s_PROVIDER" (upper .Values.component)) | default "local" -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "castad.fullname" . }}
  labels:
    {{- include "castad.labels" . | nindent 4 }}
spec:
  # The service's pods and its migrations Job's.
  podSelector:
    matchLabels:
      {{- include "castad.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress, Egress]
  ingress:
    {{- if eq .Values.component "api" }}
    # The API: users, and network providers calling back (apiFrom; none given: from anywhere).
    - ports:
        - port: {{ .Values.containerPort }}
          protocol: TCP
      {{- with $np.apiFrom }}
      from:
        {{- include "castad.guardedPeers" (dict "peers" . "what" "apiFrom") | fromJsonArray | toYaml | nindent 8 }}
      {{- end }}
    {{- end }}
    {{- if or (ne .Values.component "api") .Values.probesPort }}
    # /metrics, /readyz and /healthz: Prometheus (metricsFrom); the kubelet's probes come from the node, never blocked.
    - ports:
        - port: {{ include "castad.probesPort" . }}
          protocol: TCP
      {{- with $np.metricsFrom }}
      from:
        {{- include "castad.guardedPeers" (dict "peers" . "what" "metricsFrom") | fromJsonArray | toYaml | nindent 8 }}
      {{- end }}
    {{- end }}
  egress:
    {{- include "castad.egressRule" (dict "target" $np.dns "what" "dns" "protocols" (list "UDP" "TCP")) | nindent 4 }}
    {{- include "castad.egressRule" (dict "target" $np.postgresql "what" "postgresql") | nindent 4 }}
    {{- include "castad.egressRule" (dict "target" $np.rabbitmq "what" "rabbitmq") | nindent 4 }}
    {{- if $otel.endpoint }}
    {{- $target := dict "to" $np.otel.to "ports" (list (include "castad.otelPort" $otel.endpoint)) }}
    {{- include "castad.egressRule" (dict "target" $target "what" "otel") | nindent 4 }}
    {{- end }}
    {{- if and $np.provider (not (has $provider (list "local" "instant"))) }}
    # The {{ $provider }} provider: its API and the downloads of its results.
    {{- include "castad.egressRule" (dict "target" $np.provider "what" "provider") | nindent 4 }}
    {{- end }}
    {{- if $np.photos }}
    # The hosts of the photos briefs name by URL (the video stage fetches them).
    {{- include "castad.egressRule" (dict "target" $np.photos "what" "photos") | nindent 4 }}
    {{- end }}
    {{- $secrets := .Values.secretSettings | default dict }}
    {{- if and $np.webhooks (or (hasKey $secrets "CASTAD_API_WEBHOOK_SECRETS_KEY") (hasKey $secrets "CASTAD_API_WEBHOOK_SECRET")) }}
    # Notices to the briefs' callback URLs.
    {{- include "castad.egressRule" (dict "target" $np.webhooks "what" "webhooks") | nindent 4 }}
    {{- end }}
    {{- if and $np.objectStore .Values.artifacts (eq .Values.artifacts.store "s3") }}
    # The bucket (and the token service of the pod's identity).
    {{- include "castad.egressRule" (dict "target" $np.objectStore "what" "objectStore") | nindent 4 }}
    {{- end }}
    {{- with $np.extraEgress }}
    # Given as they are (extraEgress).
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
{{- end -}}
