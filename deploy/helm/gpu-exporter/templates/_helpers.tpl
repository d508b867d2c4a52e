{{/* The chart's name, and the objects' base name (the release's name when it contains the chart's). */}}
{{- define "gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-exporter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What identifies the exporter's pods: in every selector, so never changed after install. */}}
{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end -}}

{{/* On every object: the selector's name and instance, what ships it, and Helm's own. */}}
{{- define "gpu-exporter.labels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: gpu-exporter
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpu-exporter.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The config file as the daemon reads it: `config`, with the listen address from `port`. */}}
{{- define "gpu-exporter.configFile" -}}
{{- $config := deepCopy .Values.config -}}
{{- $_ := set $config "web_listen_address" (printf ":%d" (int .Values.port)) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The ConfigMap's name carries a hash of the file, as kustomize's configMapGenerator does, so
that a changed configuration rolls the DaemonSet. */}}
{{- define "gpu-exporter.configMapName" -}}
{{- printf "%s-config-%s" (include "gpu-exporter.fullname" .) (include "gpu-exporter.configFile" . | sha256sum | trunc 10) -}}
{{- end -}}

{{/* Where `nodeSelection` puts the pods (a node affinity), unless `affinity` is given. */}}
{{- define "gpu-exporter.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if eq .Values.nodeSelection "gpu-labels" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    # Any one term places a pod (terms are ORed): whichever labels the cluster's GPU stack puts
    # on its GPU nodes.
    nodeSelectorTerms:
      # GPU feature discovery (the GPU operator, or the device plugin's chart with gfd).
      - matchExpressions:
          - key: nvidia.com/gpu.present
            operator: In
            values: ["true"]
      # Node feature discovery alone: a PCI device of vendor 0x10de (NVIDIA).
      - matchExpressions:
          - key: feature.node.kubernetes.io/pci-10de.present
            operator: In
            values: ["true"]
      # GKE's GPU node pools; the value is the accelerator type.
      - matchExpressions:
          - key: cloud.google.com/gke-accelerator
            operator: Exists
      # Your own choice: kubectl label node NODE gpu-exporter/monitor=true
      - matchExpressions:
          - key: gpu-exporter/monitor
            operator: In
            values: ["true"]
{{- else if eq .Values.nodeSelection "gpu-operator" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    # Where the GPU operator deploys its container stack (not the nodes it gives to VM
    # passthrough, where the host has no NVML), and no node excluded from its operands.
    nodeSelectorTerms:
      - matchExpressions:
          - key: nvidia.com/gpu.deploy.container-toolkit
            operator: In
            values: ["true"]
          - key: nvidia.com/gpu.deploy.operands
            operator: NotIn
            values: ["false"]
{{- end -}}
{{- end -}}

{{/* Secret volumes: readable by the exporter's user alone (uid 0), or by its group with nonRoot. */}}
{{- define "gpu-exporter.secretMode" -}}
{{- if .Values.nonRoot -}}288{{- else -}}256{{- end -}}
{{- end -}}
