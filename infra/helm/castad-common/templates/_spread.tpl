{{/*
Where a service's replicas run: by default never two on one node, and over zones where the cluster has
them (values `spread`; docs/deploy.md, "Replicas"). Constraints of the operator's own
(`topologySpreadConstraints`) replace these; one without a labelSelector gets this service's pods.

Why topology spread and not a required podAntiAffinity on kubernetes.io/hostname: both keep two replicas
off one node, but the anti-affinity counts the replicas of the old version too, so on a cluster with as
many nodes as replicas it refuses the rolling update's surge pod (maxSurge 1) everywhere; with
maxUnavailable 0 no old pod goes before a new one is ready, and the rollout never ends. Anti-affinity can
leave the old version out (matchLabelKeys) only from Kubernetes 1.31 on; the charts support 1.29.

matchLabelKeys pod-template-hash: each version of the pod template spreads on its own. The surge pod,
the first of its version, may join a node that still runs an old replica (which goes once it is ready,
the ReplicaSet taking first an old pod that shares its node); the next new pod goes to a node with none
of the new ones. Counted together, old and new would let two new pods end up on one node once the old
ones are gone.

minDomains (the replicas the service always has: replicaCount, or the autoscaler's minReplicas) makes
"never two on one node" hold on a cluster with fewer nodes than that: there the scheduler takes the
emptiest node's count as 0, so no node takes a second replica and the replica waits, Pending (without
it, a 1-node cluster runs both replicas on its one node, whose loss takes the whole service). Where
there are enough nodes, maxSkew 1 leaves no node with two while one has none; replicas the autoscaler
adds beyond the number of nodes spread evenly.

nodeTaintsPolicy Honor: only nodes whose taints the pod tolerates count. A node it may not run on (a
tainted control-plane node) would otherwise count as a node with no replica, and hold every node at
one replica whatever the autoscaler asks. Nodes its nodeSelector excludes never count (the default,
nodeAffinityPolicy Honor).

The selector names the component too: the migrations Job's pods share the name and instance labels
(component "migrations") and are not replicas.
*/}}
{{- define "castad.topologySpreadConstraints" -}}
{{- $selector := dict "matchLabels" (set (include "castad.selectorLabels" . | fromYaml) "app.kubernetes.io/component" .Values.component) -}}
{{- $constraints := list -}}
{{- if .Values.topologySpreadConstraints -}}
{{- range .Values.topologySpreadConstraints -}}
{{- $constraint := deepCopy . -}}
{{- if not $constraint.labelSelector -}}
{{- $_ := set $constraint "labelSelector" $selector -}}
{{- end -}}
{{- $constraints = append $constraints $constraint -}}
{{- end -}}
{{- else if .Values.spread.enabled -}}
{{- $replicas := .Values.replicaCount -}}
{{- if and .Values.autoscaling .Values.autoscaling.enabled -}}
{{- $replicas = .Values.autoscaling.minReplicas -}}
{{- end -}}
{{- $nodes := dict "maxSkew" 1 "topologyKey" "kubernetes.io/hostname" "whenUnsatisfiable" .Values.spread.nodes "nodeTaintsPolicy" "Honor" "labelSelector" $selector "matchLabelKeys" (list "pod-template-hash") -}}
{{- if and (eq .Values.spread.nodes "DoNotSchedule") (gt (int $replicas) 1) -}}
{{- $_ := set $nodes "minDomains" (int $replicas) -}}{{/* Kubernetes takes minDomains with DoNotSchedule only */}}
{{- end -}}
{{- $zones := dict "maxSkew" 1 "topologyKey" "topology.kubernetes.io/zone" "whenUnsatisfiable" .Values.spread.zones "nodeTaintsPolicy" "Honor" "labelSelector" $selector "matchLabelKeys" (list "pod-template-hash") -}}
{{- $constraints = list $nodes $zones -}}
{{- end -}}
{{- if $constraints -}}
{{- toYaml $constraints -}}
{{- end -}}
{{- end -}}
