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

{{- /* Refuse a config the mixin would refuse (the schema checks each value's form). */}}
{{- define "gpulens.mixin.check" -}}
{{- if ne (len (splitList "%s" .Values.mixin.runbookURLPattern)) 2 -}}
{{- fail (printf "mixin.runbookURLPattern: expected exactly one %%s (the alert name), got %q" .Values.mixin.runbookURLPattern) -}}
{{- end -}}
{{- end -}}
