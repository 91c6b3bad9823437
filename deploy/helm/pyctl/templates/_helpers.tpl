{{/* The name of every object (default pyctl). */}}
{{- define "pyctl.fullname" -}}
{{- .Values.fullnameOverride | default "pyctl" | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "pyctl.labels" -}}
app.kubernetes.io/name: pyctl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: pyctl
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Values.managedBy | default .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (controller or redis). */}}
{{- define "pyctl.selector" -}}
app.kubernetes.io/name: pyctl
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* repository@digest when a digest is given, else repository:tag. */}}
{{- define "pyctl.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (.tag | default .default) -}}
{{- end -}}
{{- end -}}

{{- define "pyctl.serviceAccount" -}}
{{ include "pyctl.fullname" . }}
{{- end -}}

{{/* The ServiceAccount's user name, as the API server sees it (admission policies match it). */}}
{{- define "pyctl.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "pyctl.fullname" . }}
{{- end -}}

{{/* Whether pyctl has a Redis password: the bundled Redis always, an external one when a Secret
is named. */}}
{{- define "pyctl.redisAuth" -}}
{{- if or .Values.redis.bundled .Values.redis.auth.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "pyctl.redisSecret" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis" (include "pyctl.fullname" .)) -}}
{{- end -}}

{{/* Namespaces never evicted from: the configured ones and the release's own. */}}
{{- define "pyctl.excludedNamespaces" -}}
{{- $ns := concat .Values.evictor.excludedNamespaces (list .Release.Namespace) | uniq -}}
{{- join "," $ns -}}
{{- end -}}

{{- define "pyctl.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
{{- if .fsGroup }}
fsGroup: {{ .uid }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "pyctl.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
