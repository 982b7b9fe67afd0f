{{/* The worker sidecar (docs/deployment.md). Call with
(dict "root" $ "side" <one of .Values.worker.sides>). The worker reads every
setting from WSYNC_* variables (wsync-worker --help); its rank from the pod
(RANK, JOB_COMPLETION_INDEX, or POD_NAME's StatefulSet ordinal). */}}

{{- define "wsync.worker.controllerAddress" -}}
{{- if .Values.worker.controllerAddress -}}
{{- .Values.worker.controllerAddress -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "wsync.controllerName" .) .Release.Namespace (int .Values.controller.grpcPort) -}}
{{- end -}}
{{- end -}}

{{- define "wsync.worker.socket" -}}/run/wsync/private/worker.sock{{- end -}}

{{/* The native sidecar: an init container with restartPolicy: Always starts
before the pod's containers, runs beside them, and does not keep a Job's pod
from completing. The startup probe holds the owner back until the worker's
local socket serves (its --port_file is written then). */}}
{{- define "wsync.worker.container" -}}
{{- $root := .root -}}
{{- $side := .side -}}
{{- $w := $root.Values.worker -}}
name: wsync-worker
image: {{ include "wsync.imageRef" (dict "image" $w.image "root" $root) | quote }}
imagePullPolicy: {{ $w.image.pullPolicy }}
restartPolicy: Always
command: ["/usr/local/bin/wsync-worker"]
{{- with $w.extraArgs }}
args: {{- toYaml . | nindent 2 }}
{{- end }}
env:
  - {name: WSYNC_CONTROLLER, value: {{ include "wsync.worker.controllerAddress" $root | quote }}}
  - {name: WSYNC_GROUP, value: {{ $side.group | quote }}}
  {{- if $side.groupSize }}
  - {name: WSYNC_GROUP_SIZE, value: {{ $side.groupSize | quote }}}
  {{- end }}
  {{- if $side.device }}
  - {name: WSYNC_DEVICE, value: {{ $side.device | quote }}}
  {{- end }}
  - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
  - {name: WSYNC_NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
  # Peers reach this worker's data plane at the pod's IP, not 127.0.0.1.
  - {name: WSYNC_DATA_ADDRESS, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
  - {name: WSYNC_METRICS_PORT, value: {{ $w.metricsPort | quote }}}
  - {name: WSYNC_ROUND_TIMEOUT, value: {{ $w.roundTimeout | quote }}}
  - {name: WSYNC_STAGING_LIMIT_BYTES, value: {{ $w.stagingLimitBytes | int64 | quote }}}
  - {name: WSYNC_DIRECT_WRITES, value: {{ $w.directWrites | quote }}}
  - {name: WSYNC_LOCAL_SOCKET, value: {{ include "wsync.worker.socket" . }}}
  - {name: WSYNC_PORT_FILE, value: /run/wsync/private/ports}
  {{- with $w.localSocketGroup }}
  - {name: WSYNC_LOCAL_SOCKET_GROUP, value: {{ . | quote }}}
  {{- end }}
  {{- with $w.localAllowedUids }}
  - {name: WSYNC_LOCAL_ALLOWED_UIDS, value: {{ . | quote }}}
  {{- end }}
  {{- with $w.visibleDevices }}
  - {name: NVIDIA_VISIBLE_DEVICES, value: {{ . | quote }}}
  {{- end }}
  {{- if $root.Values.tls.enabled }}
  - {name: WSYNC_CONTROLLER_CA, value: /etc/wsync/tls/ca.crt}
  - {name: WSYNC_CERT, value: /etc/wsync/tls/tls.crt}
  - {name: WSYNC_KEY, value: /etc/wsync/tls/tls.key}
  - {name: WSYNC_TLS_RELOAD_INTERVAL, value: {{ $root.Values.tls.reloadInterval | quote }}}
  {{- else }}
  - {name: WSYNC_INSECURE, value: "true"}
  {{- end }}
  {{- with $w.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - {name: wsync-metrics, containerPort: {{ $w.metricsPort }}, protocol: TCP}
startupProbe:
  exec: {command: ["/usr/bin/test", "-s", "/run/wsync/private/ports"]}
  periodSeconds: 2
  failureThreshold: {{ $w.probes.startupFailureThreshold }}
livenessProbe:
  httpGet: {path: /metrics, port: wsync-metrics}
  periodSeconds: {{ $w.probes.periodSeconds }}
  failureThreshold: {{ $w.probes.failureThreshold }}
readinessProbe:
  httpGet: {path: /metrics, port: wsync-metrics}
  periodSeconds: {{ $w.probes.periodSeconds }}
  failureThreshold: {{ $w.probes.failureThreshold }}
resources:
  {{- toYaml $w.resources | nindent 2 }}
  {{- with $w.gpuResourceClaims }}
  claims:
    {{- range . }}
    - {name: {{ . }}}
    {{- end }}
  {{- end }}
{{- $ids := dict "runAsUser" $root.Values.podSecurityContext.runAsUser "runAsGroup" $root.Values.podSecurityContext.runAsGroup }}
securityContext:
  {{- toYaml (mergeOverwrite (deepCopy $root.Values.containerSecurityContext) $ids (deepCopy $w.securityContext)) | nindent 2 }}
volumeMounts:
  - {name: wsync-run, mountPath: /run/wsync}
  - {name: wsync-dshm, mountPath: /dev/shm}
  {{- if $root.Values.tls.enabled }}
  - {name: wsync-tls, mountPath: /etc/wsync/tls, readOnly: true}
  {{- end }}
{{- end -}}

{{- define "wsync.worker.volumes" -}}
{{- $root := .root -}}
- {name: wsync-run, emptyDir: {medium: Memory, sizeLimit: 16Mi}}
- {name: wsync-dshm, emptyDir: {medium: Memory, sizeLimit: {{ $root.Values.worker.shmSizeLimit }}}}
{{- if $root.Values.tls.enabled }}
- {name: wsync-tls, secret: {secretName: {{ $root.Values.tls.workerSecret }}}}
{{- end }}
{{- end -}}

{{/* The pod spec fields a worker-carrying pod needs: merge them into a pod
template (a parent chart: include it under the template's spec; kustomize:
the ConfigMap's patch). With ownerContainer set, the owner gets the socket
and /dev/shm volumes and WSYNC_LOCAL_SOCKET. */}}
{{- define "wsync.worker.podSpec" -}}
{{- $root := .root -}}
{{- $side := .side -}}
shareProcessNamespace: {{ $root.Values.worker.shareProcessNamespace }}
{{- if $root.Values.worker.hostIPC }}
hostIPC: true
{{- end }}
{{- with include "wsync.imagePullSecrets" $root }}
{{ . }}
{{- end }}
initContainers:
  - {{ include "wsync.worker.container" . | nindent 4 | trim }}
{{- with $side.ownerContainer }}
containers:
  - name: {{ . }}
    env:
      - {name: WSYNC_LOCAL_SOCKET, value: {{ include "wsync.worker.socket" $root }}}
    volumeMounts:
      - {name: wsync-run, mountPath: /run/wsync}
      - {name: wsync-dshm, mountPath: /dev/shm}
{{- end }}
volumes:
  {{- include "wsync.worker.volumes" . | nindent 2 }}
{{- end -}}

{{/* A strategic-merge patch of a workload's pod template (Deployment,
StatefulSet, Job; side.workload names it, kustomize's patch target may
override the name): the worker labels (the PodMonitor selects them) and the
pod spec above. */}}
{{- define "wsync.worker.templatePatch" -}}
{{- $workload := .side.workload | default dict -}}
{{- $kind := $workload.kind | default "Deployment" -}}
apiVersion: {{ ternary "batch/v1" "apps/v1" (eq $kind "Job") }}
kind: {{ $kind }}
metadata:
  name: {{ $workload.name | default .side.name }}
spec:
  template:
    metadata:
      labels:
        {{- include "wsync.workerSelector" .root | nindent 8 }}
        wsync.io/group: {{ .side.group | quote }}
    spec:
      {{- include "wsync.worker.podSpec" . | nindent 6 }}
{{- end -}}
