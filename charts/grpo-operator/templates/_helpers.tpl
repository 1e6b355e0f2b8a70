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

{{/* "true" when an image reference names its registry host: its first path component
holds a "." or a ":" or is "localhost" (the rule of Docker's and containerd's reference
parsers). Without one, a runtime pulls from docker.io, where nobody publishes our images. */}}
{{- define "grpo-operator.hasRegistryHost" -}}
{{- $parts := splitList "/" . -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}true{{- end -}}
{{- end -}}

{{/* An image reference with global.imageRegistry in front when it names no registry host
of its own; a tag or digest it carries is kept as written. */}}
{{- define "grpo-operator.withRegistry" -}}
{{- $registry := trimSuffix "/" (((.root.Values.global | default dict).imageRegistry) | default "") -}}
{{- if and $registry (not (include "grpo-operator.hasRegistryHost" .ref)) -}}
{{- printf "%s/%s" $registry .ref -}}
{{- else -}}
{{- .ref -}}
{{- end -}}
{{- end -}}

{{/* The operator's image: image.repository (behind global.imageRegistry), then the
digest when set, else the tag (the chart's appVersion when empty). */}}
{{- define "grpo-operator.image" -}}
{{- $repository := include "grpo-operator.withRegistry" (dict "root" . "ref" .Values.image.repository) -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The default trainer image the operator writes into RayClusters (--trainer-image). */}}
{{- define "grpo-operator.trainerImage" -}}
{{- include "grpo-operator.withRegistry" (dict "root" . "ref" .Values.trainerImage) -}}
{{- end -}}

{{/* Refuse to render while either image would be pulled from no registry: the defaults
name repositories only (nobody publishes them on docker.io), so an install without
global.imageRegistry or full references would end in ImagePullBackOff. */}}
{{- define "grpo-operator.checkImages" -}}
{{- $unresolved := list -}}
{{- $operator := include "grpo-operator.image" . -}}
{{- if not (include "grpo-operator.hasRegistryHost" $operator) -}}
{{- $unresolved = append $unresolved (printf "image.repository (%s)" $operator) -}}
{{- end -}}
{{- $trainer := include "grpo-operator.trainerImage" . -}}
{{- if not (include "grpo-operator.hasRegistryHost" $trainer) -}}
{{- $unresolved = append $unresolved (printf "trainerImage (%s)" $trainer) -}}
{{- end -}}
{{- if $unresolved -}}
{{- fail (printf "%s %s no registry host: the nodes would pull from docker.io, where nobody publishes the project's images (ImagePullBackOff). Push the images with `make images` + podman push (docs/deployment.md, Images) and set global.imageRegistry=<your registry>, or set image.repository and trainerImage to full references (e.g. registry.example.com/grpo/operator and registry.example.com/grpo/trainer:%s)" (join " and " $unresolved) (ternary "names" "name" (eq (len $unresolved) 1)) .Chart.AppVersion) -}}
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
