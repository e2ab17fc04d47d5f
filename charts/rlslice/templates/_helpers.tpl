{{/* Names, labels and shared snippets. Everything namespaced lands in .Release.Namespace. */}}

{{- define "rlslice.name" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlslice.fullname" -}}
{{- $name := printf "%s-%s" (include "rlslice.name" .root) .component -}}
{{- $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlslice.selectorLabels" -}}
app.kubernetes.io/name: rlslice
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rlslice.labels" -}}
{{ include "rlslice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rlslice
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "rlslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "rlslice.tokenSecret" -}}
{{- .Values.tokens.existingSecret | default (printf "%s-tokens" (include "rlslice.name" .)) -}}
{{- end -}}

{{- define "rlslice.schedulerHost" -}}
{{- printf "%s.%s.svc" (include "rlslice.fullname" (dict "root" . "component" "scheduler")) .Release.Namespace -}}
{{- end -}}

{{- define "rlslice.schedulerAddress" -}}
{{- printf "%s:%d" (include "rlslice.schedulerHost" .) (int .Values.scheduler.grpcPort) -}}
{{- end -}}

{{/* The sim backend's root: in the agent socket directory, which labelled pods mount. */}}
{{- define "rlslice.simRoot" -}}
{{- printf "%s/sim" (.Values.agent.socketDir | trimSuffix "/") -}}
{{- end -}}

{{- define "rlslice.webhookService" -}}
{{- include "rlslice.fullname" (dict "root" . "component" "webhook") -}}
{{- end -}}

{{- define "rlslice.webhookSecret" -}}
{{- printf "%s-tls" (include "rlslice.webhookService" .) -}}
{{- end -}}

{{/* Pod-level security shared by the scheduler and the operator: non-root, no privileges. */}}
{{- define "rlslice.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "rlslice.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* A token from the tokens Secret as an environment variable. */}}
{{- define "rlslice.tokenEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "rlslice.tokenSecret" .root }}
      key: {{ .key }}
{{- end -}}
