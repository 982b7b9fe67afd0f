{{- define "wsync.fullname" -}}{{ printf "%s-wsync" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "wsync.labels" -}}
app.kubernetes.io/name: wsync
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "wsync.controllerSelector" -}}
app.kubernetes.io/name: wsync
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}
