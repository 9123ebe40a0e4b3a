{{- /*
The mixin config (.Values.mixin) applied to the embedded rules and dashboards. deploy/helm/generate.py
builds files/ with a placeholder for each setting (its CHART_CONFIG: keep the two in step), where the
mixin (`gpulens mixin build`) puts the setting:
  selector          gpulens_chart_selector="values", first in a selector's braces: `{P}` or `{P, ...}`
  remediateSelector gpulens_chart_remediate_selector="values", the same, on the receiver's series
  clusterLabel      gpulens_chart_cluster_label, in by/on lists and the dashboards' cluster matchers
  runbookURLPattern gpulens-chart-runbook:<Alert>, an alert's whole runbook_url
An empty selector drops its placeholder with its braces or its comma, as the mixin writes no
matcher then. "json": true escapes the values for a JSON string (the dashboards).
*/}}
{{- define "gpulens.mixin.apply" -}}
{{- $text := .text -}}
{{- $mixin := .mixin -}}
{{- $json := .json -}}
{{- $pairs := list (list "gpulens_chart_selector=\"values\"" $mixin.selector) (list "gpulens_chart_remediate_selector=\"values\"" $mixin.remediateSelector) -}}
{{- range $pair := $pairs -}}
{{- $placeholder := index $pair 0 -}}
{{- $value := trim (index $pair 1) -}}
{{- if $json -}}
{{- $placeholder = toJson $placeholder | trimPrefix "\"" | trimSuffix "\"" -}}
{{- $value = toJson $value | trimPrefix "\"" | trimSuffix "\"" -}}
{{- end -}}
{{- if $value -}}
{{- $text = replace $placeholder $value $text -}}
{{- else -}}
{{- $text = replace (printf "{%s}" $placeholder) "" $text | replace (printf "%s, " $placeholder) "" -}}
{{- end -}}
{{- end -}}
{{- $text = replace "gpulens_chart_cluster_label" $mixin.clusterLabel $text -}}
{{- $runbook := $mixin.runbookURLPattern -}}
{{- if $json -}}{{- $runbook = toJson $runbook | trimPrefix "\"" | trimSuffix "\"" -}}{{- end -}}
{{- /* an alert's name, or the dashboards' per-row `${__data.fields.alertname}` (Grafana fills it) */ -}}
{{- regexReplaceAll `gpulens-chart-runbook:([A-Za-z0-9_]+|\$\{__data\.fields\.alertname\})` $text (replace "%s" "${1}" (replace "$" "$$" $runbook)) -}}
{{- end -}}

{{- /*
The runbook address: mixin.runbookURLPattern, or when it is "" (the default) the runbooks this
release serves itself at /runbooks/<Alert> (gpulens.httpd.runbooks), so the alerts' links work
with no override: the receiver's Service when remediate.enabled (no credentials on that path),
else the exporter's (headless: any node's exporter answers; https with web.tls; behind basic auth
when that is on). With neither Service, the mixin's own default (the project's repository).
*/}}
{{- define "gpulens.mixin.runbookURLPattern" -}}
{{- $pattern := .Values.mixin.runbookURLPattern -}}
{{- if not $pattern -}}
{{- if .Values.remediate.enabled -}}
{{- $pattern = printf "http://%s.%s.svc:%v/runbooks/%%s" (include "gpulens.componentName" (dict "root" . "component" "remediate")) .Release.Namespace .Values.remediate.port -}}
{{- else if or .Values.exporter.service.enabled .Values.serviceMonitor.enabled -}}
{{- $scheme := ternary "https" "http" .Values.web.tls.enabled -}}
{{- $pattern = printf "%s://%s.%s.svc:%v/runbooks/%%s" $scheme (include "gpulens.componentName" (dict "root" . "component" "exporter")) .Release.Namespace .Values.exporter.port -}}
{{- else -}}
{{- $pattern = "https://github.com/gpulens/gpulens/blob/main/alerts/runbooks/%s.md" -}}
{{- end -}}
{{- end -}}
{{- $pattern -}}
{{- end -}}

{{- /* .Values.mixin with the runbook address resolved: what gpulens.mixin.apply takes. */}}
{{- define "gpulens.mixin.values" -}}
{{- toYaml (merge (dict "runbookURLPattern" (include "gpulens.mixin.runbookURLPattern" .)) (deepCopy .Values.mixin)) -}}
{{- end -}}

{{- /* Refuse a config the mixin would refuse (the schema checks each value's form). */}}
{{- define "gpulens.mixin.check" -}}
{{- $pattern := include "gpulens.mixin.runbookURLPattern" . -}}
{{- if ne (len (splitList "%s" $pattern)) 2 -}}
{{- fail (printf "mixin.runbookURLPattern: expected exactly one %%s (the alert name), got %q" $pattern) -}}
{{- end -}}
{{- end -}}
