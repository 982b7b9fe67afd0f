{{/* wsync-controller's arguments (docs/flags-and-metrics.md "Flags"). */}}
{{- define "wsync.controller.args" -}}
- --listen=$(POD_IP):{{ .Values.controller.grpcPort }}
{{- if .Values.tls.enabled }}
- --tls_cert=/etc/wsync/tls/tls.crt
- --tls_key=/etc/wsync/tls/tls.key
- --tls_client_ca=/etc/wsync/tls/ca.crt
- --tls_reload_interval={{ .Values.tls.reloadInterval }}
{{- if .Values.tls.crlSecret }}
- --tls_crl_file=/etc/wsync/crl/crl.pem
{{- end }}
{{- else }}
- --insecure
{{- end }}
{{- if .Values.tls.tokensSecret }}
- --tokens_file=/etc/wsync/tokens/tokens
{{- end }}
- --metrics_port={{ .Values.controller.metricsPort }}
- --lease_ttl={{ .Values.controller.leaseTtl }}
- --sync_deadline={{ .Values.controller.syncDeadline }}
- --failure_grace={{ .Values.controller.failureGrace }}
- --max_message_bytes={{ .Values.controller.maxMessageBytes | int64 }}
- --plan_cache_bytes={{ .Values.controller.planCacheBytes | int64 }}
- --state_file={{ .Values.controller.state.dir }}/controller.state
{{- with .Values.controller.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Liveness / readiness: grpc.health.v1 answers NOT_SERVING until the
controller is ready. The kubelet's gRPC probe speaks no TLS, so with TLS the
probe runs `wsyncctl health` with the CA, naming the Service the certificate
carries. */}}
{{- define "wsync.controller.probe" -}}
{{- if .Values.tls.enabled -}}
exec:
  # The kubelet expands no $(VAR) in exec probes: the shell reads POD_IP.
  command:
    - /bin/sh
    - -c
    - >-
      exec /usr/local/bin/wsyncctl health --controller="${POD_IP}:{{ .Values.controller.grpcPort }}"
      --controller_ca=/etc/wsync/tls/ca.crt --tls_server_name={{ include "wsync.controllerName" . }}
      --timeout_ms=3000
timeoutSeconds: 5
{{- else -}}
grpc: {port: {{ .Values.controller.grpcPort }}}
timeoutSeconds: 3
{{- end }}
periodSeconds: {{ .Values.controller.probes.periodSeconds }}
failureThreshold: {{ .Values.controller.probes.failureThreshold }}
{{- end -}}
