{{/* The chart's name, or nameOverride. */}}
{{- define "prism.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' base name: fullnameOverride, or the release name prefixed with the chart's
name unless it already contains it. 52 characters at most, so that "-headless" and a
StatefulSet pod's "-N" suffix keep a name under 63. */}}
{{- define "prism.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "prism.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The labels that select prismd's pods (never change them on upgrade). */}}
{{- define "prism.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prism.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: prismd
{{- end -}}

{{/* The labels every object of the chart carries. */}}
{{- define "prism.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "prism.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prism
{{- end -}}

{{- define "prism.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the admin token, and its key. */}}
{{- define "prism.adminSecretName" -}}
{{- default (printf "%s-admin" (include "prism.fullname" .)) .Values.auth.admin.existingSecret -}}
{{- end -}}
{{- define "prism.adminSecretKey" -}}
{{- if .Values.auth.admin.existingSecret -}}{{ .Values.auth.admin.existingSecretKey }}{{- else -}}admin-token{{- end -}}
{{- end -}}

{{/* The Secret holding the provisioned job tokens (one key per job id), "" when there is none
(the chart's own Secret exists only with prismd.enabled). */}}
{{- define "prism.jobTokensSecretName" -}}
{{- if .Values.auth.jobTokens.existingSecret -}}
{{- .Values.auth.jobTokens.existingSecret -}}
{{- else if and .Values.prismd.enabled .Values.auth.jobTokens.tokens -}}
{{- printf "%s-job-tokens" (include "prism.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* What the pods' checksum/secret annotation hashes: the admin Secret's name and key (or
"-" without an admin token), the job tokens Secret's name, and auth.revision; never a token. */}}
{{- define "prism.secretChecksum" -}}
{{- $admin := "-" -}}
{{- if .Values.auth.admin.enabled -}}
{{- $admin = printf "%s/%s" (include "prism.adminSecretName" .) (include "prism.adminSecretKey" .) -}}
{{- end -}}
{{- printf "admin=%s jobTokens=%s revision=%v" $admin (include "prism.jobTokensSecretName" .) (int .Values.auth.revision) | sha256sum -}}
{{- end -}}

{{/* The container securityContext of every container of the chart: no privilege, no
capabilities, a read-only root filesystem. */}}
{{- define "prism.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
{{- end -}}

{{/* The pod securityContext: the image's user prism (uid and gid 10001). */}}
{{- define "prism.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* prismd's container ports (fixed: the image's and the probes'). A pod's DNS name resolves
to the pod's IP, where no Service port mapping applies: whoever dials a replica directly uses
these, never service.httpPort or service.grpcPort (the client Service's ports). */}}
{{- define "prism.grpcContainerPort" -}}50051{{- end -}}
{{- define "prism.httpContainerPort" -}}8080{{- end -}}

{{/* The gRPC target of the prismd replica that serves a job, by its stable DNS name under the
headless Service and prismd's container gRPC port. The replica is chosen by rendezvous hashing (DESIGN 7: a consistent hash of the
job id): each replica i scores sha256("JOB/i"), and the highest score wins (hex digests of equal
length compare as numbers). Growing prismd.replicas from n to n+1 moves only the jobs the new
replica wins, about 1/(n+1) of them; a moved job starts afresh on its new replica.
Argument: (dict "root" $ "job" JOB_ID). */}}
{{- define "prism.prismdTarget" -}}
{{- $root := .root -}}
{{- $replica := 0 -}}
{{- $best := "" -}}
{{- range $i := until (int $root.Values.prismd.replicas) -}}
{{- $score := sha256sum (printf "%s/%d" $.job $i) -}}
{{- if gt $score $best -}}
{{- $replica = $i -}}
{{- $best = $score -}}
{{- end -}}
{{- end -}}
{{- printf "dns:///%s-%d.%s-headless.%s.svc:%s" (include "prism.fullname" $root) $replica (include "prism.fullname" $root) $root.Release.Namespace (include "prism.grpcContainerPort" $root) -}}
{{- end -}}

{{/* The prism-agent sidecar for a trainer's pod, as one item of the pod's initContainers
(a native sidecar: restartPolicy Always, so it starts before the trainer, which its
startupProbe holds back until the agent's socket and hint table are open, and does not keep a
Job's pod from completing). Arguments (a dict):
  root     the chart's context ($)
  job      the job id, which picks the prismd replica
  tokenSecret, tokenKey  optional: a Secret key holding the job's token (--token-file)
  prismd   optional: a gRPC target overriding the replica chosen from the job id
The target: the prismd argument, else .Values.agent.prismd (e.g. an existing prismd release's,
for a trainer chart that sets prismd.enabled false), else the job's replica of this release
(prism.prismdTarget).
The trainer container mounts the volume "prism-run" (prism.agentSidecarVolumes) at
.Values.agent.runDir and gets PRISM_AGENT_DIR (prism.trainerEnv). */}}
{{- define "prism.agentSidecar" -}}
{{- $root := required "prism.agentSidecar: root is required" .root -}}
{{- $job := required "prism.agentSidecar: job is required" .job -}}
{{- $v := $root.Values.agent -}}
- name: prism-agent
  image: {{ include "prism.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  restartPolicy: Always
  command:
    - prism-agent
  args:
    {{- $target := .prismd | default $v.prismd }}
    {{- if not $target }}
    {{- $target = include "prism.prismdTarget" (dict "root" $root "job" $job) }}
    {{- end }}
    - --prismd={{ $target }}
    - --dir={{ $v.runDir }}
    - --metrics-listen=0.0.0.0:{{ $v.metricsPort }}
    - --node=$(NODE_NAME)
    - --device={{ $v.device }}
    {{- with $v.deviceClass }}
    - --device-class={{ . }}
    {{- end }}
    {{- if .tokenSecret }}
    - --token-file=/etc/prism/job-token/{{ required "prism.agentSidecar: tokenKey is required with tokenSecret" .tokenKey }}
    {{- end }}
    {{- range $v.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
  ports:
    - name: agent-metrics
      containerPort: {{ $v.metricsPort }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /readyz
      port: agent-metrics
    periodSeconds: 1
    failureThreshold: 60
  livenessProbe:
    httpGet:
      path: /healthz
      port: agent-metrics
    periodSeconds: 10
    timeoutSeconds: 2
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: agent-metrics
    periodSeconds: 5
    timeoutSeconds: 2
  {{- /* The pod's resource claims the agent shares with the trainer (DRA): its GPU, to
  measure. Built as one map so that empty resources and claims still render valid YAML. */}}
  {{- $resources := deepCopy (default (dict) $v.resources) }}
  {{- with $v.resourceClaims }}
  {{- $claims := list }}
  {{- range . }}
  {{- $claims = append $claims (dict "name" .) }}
  {{- end }}
  {{- $_ := set $resources "claims" $claims }}
  {{- end }}
  resources:
    {{- toYaml $resources | nindent 4 }}
  securityContext:
    {{- include "prism.containerSecurityContext" $root | nindent 4 }}
    # The image's user prism, numerically: the trainer's pod may set no runAsUser, and the
    # kubelet refuses runAsNonRoot with a non-numeric image user.
    runAsUser: 10001
    runAsGroup: 10001
  volumeMounts:
    - name: prism-run
      mountPath: {{ $v.runDir }}
    {{- if .tokenSecret }}
    - name: prism-job-token
      mountPath: /etc/prism/job-token
      readOnly: true
    {{- end }}
{{- end -}}

{{/* The volumes the sidecar needs, as items of the pod's volumes: the emptyDir it shares with
the trainer (memory-backed: a Unix socket and the shared-memory hint table) and, with
tokenSecret, the job's token. Arguments: as prism.agentSidecar. */}}
{{- define "prism.agentSidecarVolumes" -}}
{{- $root := required "prism.agentSidecarVolumes: root is required" .root -}}
- name: prism-run
  emptyDir:
    medium: Memory
    sizeLimit: {{ $root.Values.agent.runDirSizeLimit }}
{{- if .tokenSecret }}
- name: prism-job-token
  secret:
    secretName: {{ .tokenSecret }}
    items:
      - key: {{ .tokenKey }}
        path: {{ .tokenKey }}
{{- end }}
{{- end -}}

{{/* What the trainer container adds to find its agent: the env var and the volume mount.
Argument: the chart's context ($). Use: env: (include "prism.trainerEnv" $) and
volumeMounts: (include "prism.trainerVolumeMounts" $). */}}
{{/* The label a trainer's pod carries so that the chart's PodMonitor scrapes its agent.
Argument: the chart's context ($). */}}
{{- define "prism.agentPodLabels" -}}
prism-agent: sidecar
{{- end -}}

{{- define "prism.trainerEnv" -}}
- name: PRISM_AGENT_DIR
  value: {{ .Values.agent.runDir }}
{{- end -}}
{{- define "prism.trainerVolumeMounts" -}}
- name: prism-run
  mountPath: {{ .Values.agent.runDir }}
{{- end -}}
