{{/* Names: every name is cut to 63 characters (DNS label, a Service's limit). */}}
{{- define "wsync.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name leaves room for the longest suffix (-controller-state, 17
characters) so that every derived name stays within 63: release names of
47-53 characters no longer make Services over the limit. */}}
{{- define "wsync.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "wsync.controllerName" -}}{{ include "wsync.fullname" . }}-controller{{- end -}}

{{- define "wsync.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "wsync.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wsync.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "wsync.labels" -}}
helm.sh/chart: {{ include "wsync.chart" . }}
{{ include "wsync.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The chart's labels with more (dict "root" $ "extra" MAP): the chart's
win over extra ones of the same key, and no key appears twice. */}}
{{- define "wsync.labelsWith" -}}
{{- $base := include "wsync.labels" .root | fromYaml -}}
{{- toYaml (mergeOverwrite (deepCopy (.extra | default dict)) $base) -}}
{{- end -}}

{{- define "wsync.controllerSelector" -}}
{{ include "wsync.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Labels of pods carrying a worker sidecar: the PodMonitor selects them. */}}
{{- define "wsync.workerSelector" -}}
{{ include "wsync.selectorLabels" . }}
wsync.io/worker: "true"
{{- end -}}

{{/* metadata.annotations from commonAnnotations and the given map; empty
when both are. Use: {{- with include "wsync.annotations" (dict "root" . "extra" X) }}{{ . | nindent 2 }}{{ end }} */}}
{{- define "wsync.annotations" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (.root.Values.commonAnnotations | default dict) -}}
{{- with $all -}}
annotations: {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{- define "wsync.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "wsync.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag or repository@digest; the tag defaults to appVersion. */}}
{{- define "wsync.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "wsync.controllerAddress" -}}
{{ include "wsync.controllerName" . }}:{{ .Values.controller.grpcPort }}
{{- end -}}

{{- define "wsync.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}
