{{/* Chart name. */}}
{{- define "tokenbus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: <release>-tokenbus unless the release name holds it. */}}
{{- define "tokenbus.fullname" -}}
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

{{- define "tokenbus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "tokenbus.labels" -}}
helm.sh/chart: {{ include "tokenbus.chart" . }}
{{ include "tokenbus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tokenbus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokenbus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tokenbus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "tokenbus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tokenbus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tokenbus.natsSecretName" -}}
{{- default (printf "%s-nats" (include "tokenbus.fullname" .)) .Values.nats.auth.existingSecret }}
{{- end }}

{{- define "tokenbus.redisSecretName" -}}
{{- default (printf "%s-redis" (include "tokenbus.fullname" .)) .Values.redis.existingSecret }}
{{- end }}

{{- define "tokenbus.adminSecretName" -}}
{{- default (printf "%s-admin" (include "tokenbus.fullname" .)) .Values.admin.existingSecret }}
{{- end }}

{{/*
Environment of a tokenbus container for one NATS role (gateway, dispatcher,
worker): NATS credentials and the Redis URL (in the variable of its
topology; the gateway also gets --redis-min-replicas). Call with (dict "root" $ "role" "gateway").
*/}}
{{- define "tokenbus.roleEnv" -}}
{{- $root := .root }}
{{- $auth := $root.Values.nats.auth }}
{{- if eq $auth.mode "password" }}
- name: TOKENBUS_NATS_USER
  value: {{ (index $auth .role).user | quote }}
- name: TOKENBUS_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tokenbus.natsSecretName" $root }}
      key: {{ .role }}-password
{{- else if eq $auth.mode "creds" }}
- name: TOKENBUS_NATS_CREDS
  value: /etc/tokenbus/nats-creds/{{ .role }}.creds
{{- end }}
- name: {{ include "tokenbus.redisEnv" $root }}
  valueFrom:
    secretKeyRef:
      name: {{ include "tokenbus.redisSecretName" $root }}
      key: redis-url
{{- if eq .role "gateway" }}
- name: TOKENBUS_REDIS_MIN_REPLICAS
  {{- /* Not sprig's default, which takes 0 (no replicas) for unset. */}}
  {{- $min := $root.Values.redis.minReplicas }}
  value: {{ if or (kindIs "invalid" $min) (eq (toString $min) "") }}"auto"{{ else }}{{ $min | toString | quote }}{{ end }}
{{- end }}
{{- end }}

{{/* The variable that names Redis, by redis.topology: one flag per topology (docs/redis.md). */}}
{{- define "tokenbus.redisEnv" -}}
{{- $t := .Values.redis.topology | default "single" }}
{{- if eq $t "single" }}TOKENBUS_REDIS_URL
{{- else if eq $t "sentinel" }}TOKENBUS_REDIS_SENTINEL
{{- else if eq $t "cluster" }}TOKENBUS_REDIS_CLUSTER
{{- else }}{{ fail (printf "redis.topology must be single, sentinel or cluster, not %q" $t) }}
{{- end }}
{{- end }}

{{/* Volume mounts for NATS credentials files and TLS. Call with (dict "root" $ "role" "gateway"). */}}
{{- define "tokenbus.natsVolumeMounts" -}}
{{- if eq .root.Values.nats.auth.mode "creds" }}
- name: nats-creds
  mountPath: /etc/tokenbus/nats-creds
  readOnly: true
{{- end }}
{{- if .root.Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: /etc/tokenbus/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "tokenbus.natsVolumes" -}}
{{- if eq .root.Values.nats.auth.mode "creds" }}
- name: nats-creds
  secret:
    secretName: {{ required "nats.auth.existingSecret (with <role>.creds keys) is required when nats.auth.mode is creds" .root.Values.nats.auth.existingSecret }}
    items:
      - key: {{ .role }}.creds
        path: {{ .role }}.creds
{{- end }}
{{- if .root.Values.nats.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ required "nats.tls.secretName is required when nats.tls.enabled" .root.Values.nats.tls.secretName }}
{{- end }}
{{- end }}

{{/* Pod-level checksum of the configuration, so pods roll when it changes. */}}
{{- define "tokenbus.configChecksum" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end }}

{{/*
Deep merge: sets every key of .src into .dst (a dict, changed in place),
recursing where both sides are maps. Unlike sprig's merge/mergeOverwrite it
lets a pool override a default with false, 0 or "". Use:
  {{- $p := deepCopy $.Values.workers.defaults }}
  {{- $_ := include "tokenbus.deepSet" (dict "dst" $p "src" $pool) }}
*/}}
{{- define "tokenbus.deepSet" -}}
{{- $dst := .dst }}
{{- range $k, $v := .src }}
{{- if and (kindIs "map" $v) (kindIs "map" (index $dst $k)) }}
{{- $_ := include "tokenbus.deepSet" (dict "dst" (index $dst $k) "src" $v) }}
{{- else }}
{{- $_ := set $dst $k $v }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tokenbus.poolName" -}}
{{- printf "%s-worker-%s" (include "tokenbus.fullname" .root) .pool.name | trunc 63 | trimSuffix "-" }}
{{- end }}
