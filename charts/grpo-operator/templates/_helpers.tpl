{{/* Name of the chart, overridable. */}}
{{- define "grpo-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: release + chart, or the release alone when it already holds the chart name. */}}
{{- define "grpo-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "grpo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "grpo-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "grpo-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: grpo-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "grpo-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "grpo-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.peeringName" -}}
{{- default (include "grpo-operator.fullname" .) .Values.leaderElection.peeringName -}}
{{- end -}}

{{/* Certificate names under webhook.certificate.source certManager. */}}
{{- define "grpo-operator.certManagerCertificate" -}}
{{- printf "%s-webhook" (include "grpo-operator.fullname" .) -}}
{{- end -}}

{{- define "grpo-operator.webhookAnnotations" -}}
{{- if eq .Values.webhook.certificate.source "certManager" -}}
annotations:
  # cert-manager's CA injector writes the Certificate's CA into every caBundle here.
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "grpo-operator.certManagerCertificate" .) }}
{{- end -}}
{{- end -}}

{{- define "grpo-operator.webhookSecretName" -}}
{{- if eq .Values.webhook.certificate.source "secret" -}}
{{- .Values.webhook.certificate.secretName -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "grpo-operator.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the operator watches every namespace (no watchNamespaces). */}}
{{- define "grpo-operator.clusterWide" -}}
{{- if .Values.watchNamespaces -}}false{{- else -}}true{{- end -}}
{{- end -}}
