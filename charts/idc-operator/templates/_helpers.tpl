{{/* Names and labels. */}}
{{- define "idc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idc.fullname" -}}
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

{{- define "idc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "idc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "idc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: idc-operator
{{- end }}

{{- define "idc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "idc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "idc.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "idc.runtimeImage" -}}
{{- if .Values.runtimeImage.repository }}
{{- printf "%s:%s" .Values.runtimeImage.repository (default (default .Chart.AppVersion .Values.image.tag) .Values.runtimeImage.tag) }}
{{- else }}
{{- include "idc.image" . }}
{{- end }}
{{- end }}

{{/*
idc.rules: the rules of the Role or ClusterRole named .name in the copy of
config/rbac/<.file> under files/rbac/ (written by `make manifests`), so the
chart never keeps a second, hand-written list of permissions.
*/}}
{{- define "idc.rules" -}}
{{- $rules := list }}
{{- range $doc := regexSplit "(?m)^---\\s*$" (.root.Files.Get (printf "files/rbac/%s" .file)) -1 }}
{{- $obj := fromYaml $doc }}
{{- if and $obj.metadata (eq $obj.metadata.name $.name) }}
{{- $rules = $obj.rules }}
{{- end }}
{{- end }}
{{- if not $rules }}
{{- fail (printf "files/rbac/%s has no role %q: run make manifests" .file .name) }}
{{- end }}
{{- toYaml $rules }}
{{- end }}
