{{/* Names, labels and shared snippets. Everything namespaced lands in .Release.Namespace. */}}

{{/* The base of every object name: fullnameOverride, else the release name (with
nameOverride appended when set). Components append their own suffix. */}}
{{- define "rlslice.name" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if .Values.nameOverride -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rlslice.fullname" -}}
{{- $name := printf "%s-%s" (include "rlslice.name" .root) .component -}}
{{- $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlslice.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Values.nameOverride | default .root.Chart.Name }}
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

{{/* registry/repository:tag, or registry/repository@digest when a digest is set;
global.imageRegistry (an umbrella chart's) wins over image.registry. */}}
{{- define "rlslice.image" -}}
{{- $registry := (.Values.global | default dict).imageRegistry | default .Values.image.registry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets: global's and the chart's, as a pod spec field (or nothing). */}}
{{- define "rlslice.imagePullSecrets" -}}
{{- $secrets := concat ((.Values.global | default dict).imagePullSecrets | default list) .Values.imagePullSecrets -}}
{{- with $secrets -}}
imagePullSecrets:
  {{- range . }}
  - {{ if kindIs "string" . }}name: {{ . }}{{ else }}{{ toYaml . }}{{ end }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* The values of one component (scheduler, operator, webhook, agent). */}}
{{- define "rlslice.values" -}}
{{- toYaml (index .root.Values .component) -}}
{{- end -}}

{{/* The component's ServiceAccount name: its own when created, else the name given (or
"default"). */}}
{{- define "rlslice.serviceAccountName" -}}
{{- $sa := (index .root.Values .component).serviceAccount -}}
{{- if $sa.create -}}
{{- $sa.name | default (include "rlslice.fullname" .) -}}
{{- else -}}
{{- $sa.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The component's ServiceAccount object followed by a document separator, when created.
`automount` says whether pods get an API token by default. */}}
{{- define "rlslice.serviceAccount" -}}
{{- $sa := (index .root.Values .component).serviceAccount -}}
{{- if $sa.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "rlslice.serviceAccountName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "rlslice.labels" . | nindent 4 }}
  {{- with $sa.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: {{ .automount | default false }}
---
{{- end }}
{{- end -}}

{{/* A pod template's metadata: the standard labels plus podLabels, podAnnotations. */}}
{{- define "rlslice.podMetadata" -}}
{{- $values := index .root.Values .component -}}
labels:
  {{- include "rlslice.labels" . | nindent 2 }}
  {{- with $values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pod's securityContext: the chart's default (template `base`) with the
component's podSecurityContext merged over it. */}}
{{- define "rlslice.podSecurityContext" -}}
{{- $values := index .root.Values .component -}}
{{- $base := fromYaml (include .base .root) -}}
{{- toYaml (mergeOverwrite $base ($values.podSecurityContext | default dict)) -}}
{{- end -}}

{{/* The main container's securityContext: the default (template `base`) with the
component's securityContext merged over it. */}}
{{- define "rlslice.containerSecurityContext" -}}
{{- $values := index .root.Values .component -}}
{{- $base := fromYaml (include .base .root) -}}
{{- toYaml (mergeOverwrite $base ($values.securityContext | default dict)) -}}
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
{{- .Values.webhook.tls.existingSecret | default (printf "%s-tls" (include "rlslice.webhookService" .)) -}}
{{- end -}}

{{/* The DNS names of the webhook Service, as a YAML list. */}}
{{- define "rlslice.webhookNames" -}}
{{- $service := include "rlslice.webhookService" . -}}
{{- toYaml (list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace)) -}}
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

{{/* The agent's pod and container security (it acts on other pods' processes). */}}
{{- define "rlslice.agentPod" -}}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "rlslice.agentContainer" -}}
{{- if .Values.agent.privileged }}
privileged: true
{{- else }}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
# Root inside the container, but only these capabilities:
runAsUser: 0
capabilities:
  drop: [ALL]
  add:
    # The CUDA checkpoint API and cuda-checkpoint act on processes of other
    # users (the jobs' pods), which needs ptrace access to them.
    - SYS_PTRACE
    # Freezing and thawing a job's processes (SIGSTOP/SIGCONT) of other users.
    - KILL
    {{- if eq .Values.agent.backend "sim" }}
    # sim: the jobs' emulated device buffers are 0600 files of the jobs' own users, which
    # the agent copies out and back.
    - DAC_OVERRIDE
    {{- end }}
{{- end }}
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
