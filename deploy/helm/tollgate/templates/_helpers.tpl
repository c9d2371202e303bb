{{/* The chart's name, or nameOverride. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects' name: fullnameOverride, else release-chart (once if equal). */}}
{{- define "tollgate.fullname" -}}
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

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ConfigMap of rules to mount. */}}
{{- define "tollgate.rulesConfigMap" -}}
{{- .Values.rules.existingConfigMap | default (printf "%s-rules" (include "tollgate.fullname" .)) }}
{{- end }}

{{/* The Secret holding REDIS_URL and its key, or nothing. */}}
{{- define "tollgate.redisSecret" -}}
{{- if .Values.redis.existingSecret.name }}
{{- .Values.redis.existingSecret.name }}
{{- else if .Values.redis.url }}
{{- printf "%s-redis" (include "tollgate.fullname" .) }}
{{- end }}
{{- end }}

{{- define "tollgate.redisSecretKey" -}}
{{- if .Values.redis.existingSecret.name }}
{{- required "redis.existingSecret.key names the Secret's key holding the URL" .Values.redis.existingSecret.key }}
{{- else }}
{{- print "url" }}
{{- end }}
{{- end }}

{{/*
Settings the chart owns: a value in .Values.env would contradict the ports, where the
rules are mounted, or the Redis Secret, so rendering stops naming the value to use instead.
*/}}
{{- define "tollgate.checkEnv" -}}
{{- $rules := "rules.files or rules.existingConfigMap (mounted where the image reads rules)" }}
{{- $owned := dict "PORT" "ports.http" "HOST" "ports.http" "HTTP_ADDR" "ports.http" "GRPC_PORT" "ports.grpc" "GRPC_HOST" "ports.grpc" "GRPC_ADDR" "ports.grpc" "REDIS_URL" "redis.url or redis.existingSecret" "TOLLGATE_CONFIG" $rules "RUNTIME_ROOT" $rules "RUNTIME_SUBDIRECTORY" $rules "RUNTIME_APPDIRECTORY" $rules }}
{{- range $name, $use := $owned }}
{{- if hasKey $.Values.env $name }}
{{- fail (printf "env.%s: the chart decides %s through %s; set that instead" $name $name $use) }}
{{- end }}
{{- end }}
{{- if and .Values.redis.url .Values.redis.existingSecret.name }}
{{- fail "redis.url and redis.existingSecret.name are both set; keep one" }}
{{- end }}
{{- if and .Values.rules.files .Values.rules.existingConfigMap }}
{{- fail "rules.files and rules.existingConfigMap are both set; keep one" }}
{{- end }}
{{- end }}
