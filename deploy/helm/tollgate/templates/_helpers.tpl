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

{{/* Where the TLS Secrets are mounted. */}}
{{- define "tollgate.tlsDir" -}}
/etc/tollgate/tls
{{- end }}

{{/*
The TLS Secrets to mount, by directory under tollgate.tlsDir: the secret volume source,
with `items` where only some keys are read (a missing key then stops the pod starting,
naming it, rather than Tollgate failing on a missing file).
*/}}
{{- define "tollgate.tlsSecrets" -}}
{{- $secrets := dict }}
{{- with .Values.tls.server.secretName }}
{{- $_ := set $secrets "server" (dict "secretName" . "items" (list (dict "key" "tls.crt" "path" "tls.crt") (dict "key" "tls.key" "path" "tls.key"))) }}
{{- end }}
{{- with .Values.tls.server.clientCASecretName }}
{{- $_ := set $secrets "client-ca" (dict "secretName" . "items" (list (dict "key" "ca.crt" "path" "ca.crt"))) }}
{{- end }}
{{- with .Values.tls.redis }}
{{- if .secretName }}
{{- $items := list }}
{{- if .ca }}
{{- $items = append $items (dict "key" "ca.crt" "path" "ca.crt") }}
{{- end }}
{{- if .clientCert }}
{{- $items = concat $items (list (dict "key" "tls.crt" "path" "tls.crt") (dict "key" "tls.key" "path" "tls.key")) }}
{{- end }}
{{- if $items }}
{{- $_ := set $secrets "redis" (dict "secretName" .secretName "items" $items) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.tls.postgres.secretName }}
{{- $_ := set $secrets "postgres" (dict "secretName" .) }}
{{- end }}
{{- toYaml $secrets }}
{{- end }}

{{/*
The environment the chart sets from `tls`, `debug` and the store, as name: value, before
`env`: the names here may not be set in `env` too.
*/}}
{{- define "tollgate.ownedEnv" -}}
{{- $dir := include "tollgate.tlsDir" . }}
{{- $env := dict "DEBUG_PORT" (ternary (toString .Values.debug.port) "off" .Values.debug.enabled) }}
{{- with .Values.tls.server }}
{{- if .secretName }}
{{- $_ := set $env "GRPC_SERVER_USE_TLS" "true" }}
{{- $_ := set $env "GRPC_SERVER_TLS_CERT" (printf "%s/server/tls.crt" $dir) }}
{{- $_ := set $env "GRPC_SERVER_TLS_KEY" (printf "%s/server/tls.key" $dir) }}
{{- end }}
{{- if .http }}
{{- $_ := set $env "HTTP_SERVER_USE_TLS" "true" }}
{{- end }}
{{- if .clientCASecretName }}
{{- $_ := set $env "GRPC_CLIENT_TLS_CACERT" (printf "%s/client-ca/ca.crt" $dir) }}
{{- end }}
{{- end }}
{{- with .Values.tls.redis }}
{{- if .secretName }}
{{- $_ := set $env "REDIS_TLS" "true" }}
{{- if .ca }}
{{- $_ := set $env "REDIS_TLS_CACERT" (printf "%s/redis/ca.crt" $dir) }}
{{- end }}
{{- if .clientCert }}
{{- $_ := set $env "REDIS_TLS_CLIENT_CERT" (printf "%s/redis/tls.crt" $dir) }}
{{- $_ := set $env "REDIS_TLS_CLIENT_KEY" (printf "%s/redis/tls.key" $dir) }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $env }}
{{- end }}

{{/*
Whether counters are shared between replicas, as far as the values say: Redis through
`redis`, PostgreSQL through env.POSTGRES_URL, unless env.BACKEND_TYPE is memory. A
BACKEND_TYPE taken from a Secret cannot be read here and counts as shared.
*/}}
{{- define "tollgate.sharedStore" -}}
{{- if hasKey .Values.env "BACKEND_TYPE" }}
{{- $backend := index .Values.env "BACKEND_TYPE" }}
{{- if not (and (kindIs "string" $backend) (eq (lower $backend) "memory")) }}true{{ end }}
{{- else if or (include "tollgate.redisSecret" .) (hasKey .Values.env "POSTGRES_URL") }}true
{{- end }}
{{- end }}

{{/*
Values that would contradict what the chart sets, or that Kubernetes or Tollgate would
refuse later with less to go on: rendering stops naming the value to use instead.
*/}}
{{- define "tollgate.checkEnv" -}}
{{- $rules := "rules.files or rules.existingConfigMap (mounted where the image reads rules)" }}
{{- $owned := dict "PORT" "ports.http" "HOST" "ports.http" "HTTP_ADDR" "ports.http" "GRPC_PORT" "ports.grpc" "GRPC_HOST" "ports.grpc" "GRPC_ADDR" "ports.grpc" "REDIS_URL" "redis.url or redis.existingSecret" "TOLLGATE_CONFIG" $rules "RUNTIME_ROOT" $rules "RUNTIME_SUBDIRECTORY" $rules "RUNTIME_APPDIRECTORY" $rules }}
{{- range $name, $_ := include "tollgate.ownedEnv" . | fromYaml }}
{{- $_ := set $owned $name (ternary "debug.enabled and debug.port" "tls" (eq $name "DEBUG_PORT")) }}
{{- end }}
{{- range $name, $use := $owned }}
{{- if hasKey $.Values.env $name }}
{{- fail (printf "env.%s: the chart decides %s through %s; set that instead" $name $name $use) }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.env }}
{{- if and (kindIs "map" $value) (not (and (hasKey $value "valueFrom") (eq (len $value) 1))) }}
{{- fail (printf "env.%s: a value, or {valueFrom: {secretKeyRef: {name: …, key: …}}} as Kubernetes writes it" $name) }}
{{- end }}
{{- end }}
{{- if and .Values.redis.url .Values.redis.existingSecret.name }}
{{- fail "redis.url and redis.existingSecret.name are both set; keep one" }}
{{- end }}
{{- if and .Values.rules.files .Values.rules.existingConfigMap }}
{{- fail "rules.files and rules.existingConfigMap are both set; keep one" }}
{{- end }}
{{- if and (or .Values.tls.server.http .Values.tls.server.clientCASecretName) (not .Values.tls.server.secretName) }}
{{- fail "tls.server.http and tls.server.clientCASecretName need tls.server.secretName: the server's certificate and key" }}
{{- end }}
{{- if and .Values.tls.redis.secretName (hasPrefix "redis://" .Values.redis.url) }}
{{- fail "tls.redis: redis.url is redis://, which is never TLS; write rediss:// or host:port" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "tollgate.sharedStore" .)) (not .Values.allowMemoryStoreReplicas) }}
{{- fail (printf "replicaCount %d on the memory store: each replica would count alone, so every limit would admit %d times its number. Share the counters (redis.url, redis.existingSecret, or env.POSTGRES_URL), or set allowMemoryStoreReplicas: true if that is what you mean" (int .Values.replicaCount) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
