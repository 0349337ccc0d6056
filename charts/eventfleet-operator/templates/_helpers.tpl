{{/*
Names. Kubernetes names are limited to 63 characters (DNS label), hence the trunc.
*/}}
{{- define "eventfleet-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eventfleet-operator.fullname" -}}
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

{{- define "eventfleet-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: must never change between releases (Deployment selectors are
immutable), so they hold only the name and the instance.
*/}}
{{- define "eventfleet-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eventfleet-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "eventfleet-operator.labels" -}}
helm.sh/chart: {{ include "eventfleet-operator.chart" . }}
{{ include "eventfleet-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: eventfleet
app.kubernetes.io/component: operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "eventfleet-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "eventfleet-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "eventfleet-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator's command-line arguments after `eventfleet`. Kept in one place because
the e2e suite starts the real operator with exactly what the Deployment renders.
*/}}
{{/*
The namespaces the operator watches, as a JSON list; empty means every namespace.
Namespaced by default: the release namespace, unless watchNamespaces lists others or
allNamespaces asks for cluster-wide rights.
*/}}
{{- define "eventfleet-operator.watchNamespaces" -}}
{{- if and .Values.operator.allNamespaces .Values.operator.watchNamespaces }}
{{- fail "operator.allNamespaces and operator.watchNamespaces exclude each other" }}
{{- end }}
{{- if .Values.operator.allNamespaces }}
{{- list | toJson }}
{{- else if .Values.operator.watchNamespaces }}
{{- .Values.operator.watchNamespaces | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{- define "eventfleet-operator.args" -}}
- operator
{{- $watch := include "eventfleet-operator.watchNamespaces" . | fromJsonArray }}
{{- if $watch }}
{{- range $watch }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
- --resync-seconds={{ .Values.operator.resyncSeconds }}
- --log-format={{ .Values.operator.logFormat }}
{{- if eq .Values.operator.logLevel "debug" }}
- --verbose
{{- end }}
{{- range .Values.operator.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
