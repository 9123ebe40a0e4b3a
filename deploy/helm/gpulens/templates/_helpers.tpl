{{/* Names and labels shared by every template. */}}

{{- define "gpulens.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: the release name when it already contains the chart name. */}}
{{- define "gpulens.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* <fullname>-<component>, within the 63 characters of a label value / DNS label. */}}
{{- define "gpulens.componentName" -}}
{{- printf "%s-%s" (include "gpulens.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpulens.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpulens
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "gpulens.selectorLabels" . }}
{{- end }}

{{/* What selectors match on: the chart, the release and the component. */}}
{{- define "gpulens.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpulens.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpulens.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* The receiver's image (remediate.image, else exporter.image): also its diagnostic Jobs' default. */}}
{{- define "gpulens.remediate.image" -}}
{{- $r := .Values.remediate.image }}
{{- $e := .Values.exporter.image }}
{{- include "gpulens.image" (dict "root" . "image" (dict "repository" (default $e.repository $r.repository) "tag" (default $e.tag $r.tag))) }}
{{- end }}

{{/* The image of the return diagnostic's Jobs (--diag-image; the admission policy admits only it). */}}
{{- define "gpulens.remediate.diagImage" -}}
{{- default (include "gpulens.remediate.image" .) .Values.remediate.diagnostic.image }}
{{- end }}

{{- define "gpulens.exporter.serviceAccountName" -}}
{{- if .Values.exporter.serviceAccount.create }}
{{- default (include "gpulens.componentName" (dict "root" . "component" "exporter")) .Values.exporter.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.exporter.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether /metrics needs TLS or credentials: then the probes are TCP checks. */}}
{{- define "gpulens.web.enabled" -}}
{{- if or .Values.web.tls.enabled .Values.web.basicAuth.enabled .Values.web.existingSecret }}true{{ end }}
{{- end }}

{{- define "gpulens.web.secretName" -}}
{{- default (include "gpulens.componentName" (dict "root" . "component" "web-config")) .Values.web.existingSecret }}
{{- end }}

{{/* A monitor endpoint's scheme and credentials (PodMonitor and ServiceMonitor share them). */}}
{{- define "gpulens.monitor.auth" -}}
{{- if .Values.web.tls.enabled }}
scheme: https
{{- end }}
{{- with .monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* instance and node are the node name, so alerts, dashboards and `kubectl cordon` agree. */}}
{{- define "gpulens.monitor.relabelings" -}}
{{- if .relabelings }}
{{- toYaml .relabelings }}
{{- else }}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: instance
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- end }}
{{- end }}
