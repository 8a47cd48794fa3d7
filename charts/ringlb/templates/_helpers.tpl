{{/*
Names. ringlb is one per cluster: its CRDs and ClusterRoles are cluster-scoped, its
edges own the host's XDP hook and BGP port, and the Lease name is part of the
controller's Role. So objects carry fixed names (ringlb-controller, ringlb-edge,
ringlb-node) whatever the release is called; the RBAC files spell the same names, and
e2e/tests/chart.rs checks that the workloads, the ServiceAccounts and the Lease agree.
*/}}
{{- define "ringlb.controller.name" -}}ringlb-controller{{- end -}}
{{- define "ringlb.edge.name" -}}ringlb-edge{{- end -}}
{{- define "ringlb.node.name" -}}ringlb-node{{- end -}}

{{/* The leader Lease: controller-rbac.yaml grants get/update on this name only. */}}
{{- define "ringlb.controller.leaseName" -}}ringlb-controller{{- end -}}

{{/* Selector labels of one component (immutable in a Deployment/DaemonSet). */}}
{{- define "ringlb.selectorLabels" -}}
app.kubernetes.io/name: ringlb
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels on every object the templates render; `.component` and `.root` (the chart's context). */}}
{{- define "ringlb.labels" -}}
{{ include "ringlb.selectorLabels" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* An image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "ringlb.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* imagePullSecrets, when any. */}}
{{- define "ringlb.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The node's primary address, for flags whose value is "hostIP". */}}
{{- define "ringlb.hostIPEnv" -}}
- name: HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
{{- end -}}

{{/*
A flag whose value may be "hostIP" (the node's status.hostIP through $(HOST_IP)),
an address, or "" (no flag: renders nothing). Context: (list "flag-name" value).
*/}}
{{- define "ringlb.addrFlag" -}}
{{- $flag := index . 0 -}}{{- $v := index . 1 -}}
{{- if eq $v "hostIP" -}}
--{{ $flag }}=$(HOST_IP)
{{- else if $v -}}
--{{ $flag }}={{ $v }}
{{- end -}}
{{- end -}}

{{/* The edge's grace period: longer than its BGP drain, so the drain is never cut short. */}}
{{- define "ringlb.edge.gracePeriod" -}}
{{- $drain := int .Values.edge.drainSeconds -}}
{{- $grace := int (default 0 .Values.edge.terminationGracePeriodSeconds) -}}
{{- if eq $grace 0 -}}
{{- add $drain 15 -}}
{{- else if le $grace $drain -}}
{{- fail (printf "edge.terminationGracePeriodSeconds (%d) must be longer than edge.drainSeconds (%d): the kubelet would kill the edge before its BGP drain ends" $grace $drain) -}}
{{- else -}}
{{- $grace -}}
{{- end -}}
{{- end -}}
