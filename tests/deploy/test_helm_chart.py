#!/usr/bin/env python3
"""The Helm chart helm/prism and the kustomize base deploy/k8s, checked without a cluster
(issue 14 item 7; tests/helm.cmake registers each class as one test).

The chart is rendered by tests/deploy/helm_render (Helm's rendering for what the chart uses)
with its default values and with helm/prism/ci/full-values.yaml, and the objects are checked
for the facts the deployment rests on, with exact values: which objects exist, prismd's command
line, ports, probes, security context, resources, the Services' ports, the agent sidecar that the
"prism.agentSidecar" template renders, the rules and dashboards the chart carries. Every object
is validated against the Kubernetes schemas by tests/deploy/validate_k8s.mjs.

Environment: PRISM_SOURCE_DIR, PRISM_HELM_RENDER (the renderer), PRISM_NODE (node, for
Validate and Kustomize), PRISM_KUBECTL (for Kustomize), PRISM_PRISMD and PRISM_AGENT (the
binaries, for FlagsExist).
"""
import atexit
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import yaml

SOURCE = os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(SOURCE, "helm", "prism")
FULL = os.path.join(CHART, "ci", "full-values.yaml")
BAD = os.path.join(SOURCE, "tests", "deploy", "helm-bad-values.yaml")
VALIDATE = os.path.join(SOURCE, "tests", "deploy", "validate_k8s.mjs")
RELEASE, NAMESPACE = "prism", "ml"
SCRATCH = tempfile.TemporaryDirectory(prefix="prism-helm-")
atexit.register(SCRATCH.cleanup)


def write(name, text):
    """Writes text to a file of this run's scratch directory and returns its path."""
    path = os.path.join(SCRATCH.name, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def render(*extra, release=RELEASE, check=True):
    """Runs the renderer; returns (objects as a list, raw stdout, stderr, exit status)."""
    cmd = [os.environ["PRISM_HELM_RENDER"], "--chart", CHART, "--release", release,
           "--namespace", NAMESPACE, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError("helm_render failed (%d): %s" % (p.returncode, p.stderr))
    objs = [d for d in yaml.safe_load_all(p.stdout) if d] if p.returncode == 0 else []
    return objs, p.stdout, p.stderr, p.returncode


def rendezvous_replica(job, replicas):
    """The replica the chart's prism.prismdTarget picks: the highest sha256("JOB/i") hex digest,
    the lowest i on a tie (an independent implementation of the template's rule)."""
    scores = [hashlib.sha256(("%s/%d" % (job, i)).encode()).hexdigest() for i in range(replicas)]
    return scores.index(max(scores))


def by_kind_name(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def container(pod_spec, name, key="containers"):
    matches = [c for c in pod_spec.get(key, []) if c["name"] == name]
    assert len(matches) == 1, "%s: no single container %s" % (key, name)
    return matches[0]


SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
# The sidecar's: a trainer's pod may set no runAsUser, and the kubelet refuses runAsNonRoot with
# the image's non-numeric user (review finding 4).
SIDECAR_SECURITY_CONTEXT = dict(SECURITY_CONTEXT, runAsUser=10001, runAsGroup=10001)
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
    "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"},
}
SERVICE_PORTS = [
    {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"},
    {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
]
PRISMD_PORTS = [
    {"name": "http", "containerPort": 8080, "protocol": "TCP"},
    {"name": "grpc", "containerPort": 50051, "protocol": "TCP"},
    {"name": "health", "containerPort": 8081, "protocol": "TCP"},
]
BASE_ARGS = [
    "--data-dir=/var/lib/prism", "--http-listen=0.0.0.0:8080", "--grpc-listen=0.0.0.0:50051",
    "--health-listen=0.0.0.0:8081", "--config=/etc/prism/config/policy.json",
    "--service-config=/etc/prism/config/service.json",
    "--admin-token-file=/etc/prism/admin/admin-token",
]


def check_prismd_pod(tc, sts):
    """What both values files must give prismd's pod."""
    pod = sts["spec"]["template"]["spec"]
    tc.assertEqual(pod["securityContext"], POD_SECURITY_CONTEXT)
    tc.assertIs(pod["automountServiceAccountToken"], False)
    c = container(pod, "prismd")
    tc.assertEqual(c["command"], ["prismd"])
    tc.assertEqual(c["ports"], PRISMD_PORTS)
    tc.assertEqual(c["securityContext"], SECURITY_CONTEXT)
    tc.assertEqual(c["startupProbe"]["httpGet"], {"path": "/healthz", "port": "health"})
    tc.assertEqual(c["livenessProbe"], {"httpGet": {"path": "/healthz", "port": "health"},
                                        "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3})
    tc.assertEqual(c["readinessProbe"], {"httpGet": {"path": "/readyz", "port": "health"},
                                         "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3})
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    tc.assertEqual(mounts["data"], "/var/lib/prism")
    tc.assertEqual(mounts["config"], "/etc/prism/config")
    tc.assertEqual(mounts["tmp"], "/tmp")
    tc.assertEqual(mounts["admin-token"], "/etc/prism/admin")
    tc.assertEqual(sts["spec"]["serviceName"], "prism-headless")
    tc.assertEqual(sts["spec"]["selector"]["matchLabels"], pod_labels())
    tc.assertEqual({k: v for k, v in sts["spec"]["template"]["metadata"]["labels"].items()
                    if k in pod_labels()}, pod_labels())
    return c


def pod_labels():
    return {"app.kubernetes.io/name": "prism", "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": "prismd"}


def check_services(tc, objs):
    client, headless = objs[("Service", "prism")], objs[("Service", "prism-headless")]
    tc.assertEqual(client["spec"]["ports"], SERVICE_PORTS)
    tc.assertEqual(headless["spec"]["ports"], SERVICE_PORTS)
    tc.assertEqual(client["spec"]["type"], "ClusterIP")
    tc.assertEqual(headless["spec"]["clusterIP"], "None")
    for svc in (client, headless):
        tc.assertEqual(svc["spec"]["selector"], pod_labels())
        tc.assertNotIn(8081, [p["port"] for p in svc["spec"]["ports"]])


class RenderDefault(unittest.TestCase):
    """The chart with its default values: prismd alone, a generated admin token."""

    def test_default_values(self):
        objs, out, _, _ = render("--notes", os.path.join(SCRATCH.name, "NOTES.txt"))
        # Helm's output: documents in kind order, each led by its template's name.
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in objs], [
            ("Secret", "prism-admin"), ("ConfigMap", "prism-config"), ("Service", "prism"),
            ("Service", "prism-headless"), ("StatefulSet", "prism")])
        sources = re.findall(r"^---\n# Source: (\S+)\n", out, re.M)
        self.assertEqual(sources, ["prism/templates/secret.yaml", "prism/templates/configmap.yaml",
                                   "prism/templates/service.yaml", "prism/templates/service.yaml",
                                   "prism/templates/statefulset.yaml"])
        o = by_kind_name(objs)
        sts = o[("StatefulSet", "prism")]
        self.assertEqual(sts["spec"]["replicas"], 1)
        c = check_prismd_pod(self, sts)
        self.assertEqual(c["args"], BASE_ARGS)
        self.assertEqual(c["image"], "prism:0.1.0")
        self.assertEqual(c["resources"], {"requests": {"cpu": "250m", "memory": "256Mi"},
                                          "limits": {"cpu": "2", "memory": "2Gi"}})
        self.assertEqual(c["startupProbe"]["periodSeconds"], 2)
        self.assertEqual(c["startupProbe"]["failureThreshold"], 60)
        claim = sts["spec"]["volumeClaimTemplates"][0]
        self.assertEqual(claim["metadata"]["name"], "data")
        self.assertEqual(claim["spec"], {"accessModes": ["ReadWriteOnce"],
                                         "resources": {"requests": {"storage": "10Gi"}}})
        check_services(self, o)
        cm = o[("ConfigMap", "prism-config")]["data"]
        self.assertEqual(json.loads(cm["policy.json"]), {})
        self.assertEqual(json.loads(cm["service.json"]),
                         {"log-level": "info", "max-jobs": 1000, "job-idle-expiry": "7d"})
        token = base64.b64decode(o[("Secret", "prism-admin")]["data"]["admin-token"]).decode()
        self.assertRegex(token, r"^[A-Za-z0-9]{32}$")

    def test_notes(self):
        path = os.path.join(SCRATCH.name, "NOTES.txt")
        render("--notes", path)
        with open(path) as f:
            notes = f.read()
        self.assertIn("kubectl -n ml port-forward pod/prism-0 8080:8080", notes)
        self.assertIn("kubectl -n ml get secret prism-admin -o jsonpath='{.data.admin-token}' | base64 -d", notes)
        self.assertIn('include "prism.agentSidecar"', notes)
        self.assertIn("  prism.ml.svc:50051  gRPC (agents)\n", notes)
        self.assertIn("  (The client Service suits one replica: with more, agents and REST address each job's replica.)\n", notes)
        self.assertNotIn("replica 1", notes)

    def test_notes_replicas(self):
        """With more than one replica NOTES advertises each replica's gRPC and REST addresses
        (the container ports, whatever the Service's are) and says the client Service suits one
        replica only (review finding 6)."""
        path = os.path.join(SCRATCH.name, "NOTES-3.txt")
        render("--set", "prismd.replicas=3,service.grpcPort=443", "--notes", path)
        with open(path) as f:
            notes = f.read()
        self.assertTrue(notes.startswith("Prism 0.1.0: prismd (3 replicas) in namespace ml.\n"), notes)
        for i in range(3):
            self.assertIn("  replica %d: gRPC (agents) dns:///prism-%d.prism-headless.ml.svc:50051\n"
                          "             HTTP (REST)  http://prism-%d.prism-headless.ml.svc:8080\n" % (i, i, i), notes)
        self.assertNotIn("replica 3", notes)
        self.assertIn("  The client Service prism.ml.svc (HTTP 8080, gRPC 443)\n"
                      "  spreads connections over the replicas: it suits one replica only, not a job's agents or REST.\n", notes)
        self.assertNotIn("gRPC (agents)\n", notes.replace("gRPC (agents) dns", ""))

    def test_secret_checksum_has_no_token(self):
        """checksum/secret hashes only the Secrets' names and keys and auth.revision: the same
        on every render although each generates a new admin token, unchanged by token values,
        changed by a bumped auth.revision (review finding 9)."""
        def checksum(*args):
            objs = render(*args)[0]
            o = by_kind_name(objs)
            annotations = o[("StatefulSet", "prism")]["spec"]["template"]["metadata"]["annotations"]
            return annotations["checksum/secret"], o
        first, o1 = checksum()
        second, o2 = checksum()
        self.assertNotEqual(o1[("Secret", "prism-admin")]["data"], o2[("Secret", "prism-admin")]["data"])
        want = hashlib.sha256(b"admin=prism-admin/admin-token jobTokens= revision=0").hexdigest()
        self.assertEqual((first, second), (want, want))
        full, _ = checksum("--values", FULL)
        self.assertEqual(full, hashlib.sha256(b"admin=prism-admin/admin-token jobTokens=prism-job-tokens revision=0").hexdigest())
        changed, o = checksum("--values", FULL, "--set", "auth.admin.token=other,auth.jobTokens.tokens.example=other2")
        self.assertEqual(changed, full)
        self.assertEqual(base64.b64decode(o[("Secret", "prism-job-tokens")]["data"]["example"]), b"other2")
        bumped, _ = checksum("--values", FULL, "--set", "auth.revision=3")
        self.assertEqual(bumped, hashlib.sha256(b"admin=prism-admin/admin-token jobTokens=prism-job-tokens revision=3").hexdigest())
        existing, _ = checksum("--set", "auth.admin.existingSecret=ops-admin,auth.admin.existingSecretKey=token")
        self.assertEqual(existing, hashlib.sha256(b"admin=ops-admin/token jobTokens= revision=0").hexdigest())
        off, _ = checksum("--set", "auth.admin.enabled=false")
        self.assertEqual(off, hashlib.sha256(b"admin=- jobTokens= revision=0").hexdigest())

    def test_notes_gitops(self):
        """A generated admin token: NOTES says to use existingSecret with helm template/GitOps."""
        path = os.path.join(SCRATCH.name, "NOTES-gitops.txt")
        render("--notes", path)
        with open(path) as f:
            self.assertIn("every render generates a new one: set auth.admin.existingSecret there.", f.read())
        render("--set", "auth.admin.existingSecret=ops-admin", "--notes", path)
        with open(path) as f:
            self.assertNotIn("auth.admin.existingSecret", f.read())

    def test_release_name_prefixes(self):
        objs, _, _, _ = render(release="team-a")
        self.assertEqual(sorted(o["metadata"]["name"] for o in objs),
                         ["team-a-prism", "team-a-prism", "team-a-prism-admin", "team-a-prism-config",
                          "team-a-prism-headless"])


class PrismdDisabled(unittest.TestCase):
    """prismd.enabled false: none of prismd's objects, the named templates still usable, the
    sidecar pointed at an existing prismd by agent.prismd (review finding 6)."""

    EXISTING = "dns:///prism-1.prism-headless.ml.svc:50051"

    def test_no_prismd_objects(self):
        objs, _, _, _ = render("--set", "prismd.enabled=false")
        self.assertEqual(objs, [])
        objs, _, _, _ = render("--values", FULL, "--set", "prismd.enabled=false,agent.prismd=" + self.EXISTING)
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in objs], [
            ("ConfigMap", "prism-dashboards"), ("Job", "prism-example-trainer"), ("PodMonitor", "prism-agents"),
            ("PrometheusRule", "prism")])
        pod = objs[1]["spec"]["template"]["spec"]
        agent = container(pod, "prism-agent", "initContainers")
        # No token Secret of this release exists: the sidecar has none.
        self.assertEqual(agent["args"], sidecar_args(self.EXISTING))
        self.assertEqual([v["name"] for v in pod["volumes"]], ["prism-run", "tmp"])

    def test_existing_release_token(self):
        """The existing release's job tokens Secret, named by auth.jobTokens.existingSecret."""
        objs, _, _, _ = render("--set", "prismd.enabled=false,exampleJob.enabled=true,agent.prismd=" + self.EXISTING,
                               "--set", "auth.jobTokens.existingSecret=prism-job-tokens")
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in objs], [("Job", "prism-example-trainer")])
        pod = objs[0]["spec"]["template"]["spec"]
        self.assertEqual(container(pod, "prism-agent", "initContainers")["args"],
                         sidecar_args(self.EXISTING, token="example"))
        self.assertEqual(pod["volumes"][1], {"name": "prism-job-token", "secret": {
            "secretName": "prism-job-tokens", "items": [{"key": "example", "path": "example"}]}})

    def test_agent_prismd_overrides_replica(self):
        """agent.prismd wins over the replica chosen from the job id, prismd enabled or not."""
        objs, _, _, _ = render("--values", FULL, "--set", "agent.prismd=other-prismd.example:50051")
        pod = by_kind_name(objs)[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
        self.assertEqual(container(pod, "prism-agent", "initContainers")["args"][0], "--prismd=other-prismd.example:50051")
        self.assertIn(("StatefulSet", "prism"), by_kind_name(objs))

    def test_parent_chart(self):
        """The named templates from a parent (trainer) chart, as helm/README.md shows: the
        parent passes a context holding the subchart's values (Helm coalesces the dependency's
        defaults under .Values.prism; here written out), prismd disabled, agent.prismd set.
        The renderer renders one chart, so the parent carries prism's _helpers.tpl itself."""
        chart = os.path.join(SCRATCH.name, "trainer")
        os.makedirs(os.path.join(chart, "templates"))
        with open(os.path.join(CHART, "values.yaml")) as f:
            prism = yaml.safe_load(f)
        prism["prismd"]["enabled"] = False
        prism["agent"]["prismd"] = self.EXISTING
        with open(os.path.join(chart, "Chart.yaml"), "w") as f:
            f.write("apiVersion: v2\nname: trainer\nversion: 1.0.0\nappVersion: \"7\"\n")
        with open(os.path.join(chart, "values.yaml"), "w") as f:
            yaml.safe_dump({"prism": prism}, f)
        with open(os.path.join(CHART, "templates", "_helpers.tpl")) as src, \
                open(os.path.join(chart, "templates", "_prism_helpers.tpl"), "w") as dst:
            dst.write(src.read())
        with open(os.path.join(chart, "templates", "job.yaml"), "w") as f:
            f.write('''{{- $prism := dict "Values" .Values.prism "Release" .Release "Chart" (dict "Name" "prism" "AppVersion" "0.1.0") }}
apiVersion: batch/v1
kind: Job
metadata:
  name: my-trainer
spec:
  template:
    spec:
      restartPolicy: Never
      initContainers:
        {{- include "prism.agentSidecar" (dict "root" $prism "job" "my-job") | nindent 8 }}
      containers:
        - name: trainer
          image: my-trainer:1
          env: {{- include "prism.trainerEnv" $prism | nindent 12 }}
          volumeMounts: {{- include "prism.trainerVolumeMounts" $prism | nindent 12 }}
      volumes:
        {{- include "prism.agentSidecarVolumes" (dict "root" $prism "job" "my-job") | nindent 8 }}
''')
        p = subprocess.run([os.environ["PRISM_HELM_RENDER"], "--chart", chart, "--release", "train",
                            "--namespace", NAMESPACE], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        objs = [d for d in yaml.safe_load_all(p.stdout) if d]
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in objs], [("Job", "my-trainer")])
        pod = objs[0]["spec"]["template"]["spec"]
        agent = container(pod, "prism-agent", "initContainers")
        self.assertEqual(agent["image"], "prism:0.1.0")
        self.assertEqual(agent["args"], sidecar_args(self.EXISTING))
        self.assertEqual(agent["securityContext"], SIDECAR_SECURITY_CONTEXT)
        self.assertEqual(container(pod, "trainer")["env"], [{"name": "PRISM_AGENT_DIR", "value": "/run/prism"}])
        self.assertEqual(pod["volumes"], [{"name": "prism-run", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}])

    def test_notes(self):
        path = os.path.join(SCRATCH.name, "NOTES-off.txt")
        render("--set", "prismd.enabled=false,agent.prismd=" + self.EXISTING, "--notes", path)
        with open(path) as f:
            notes = f.read()
        self.assertTrue(notes.startswith("Prism 0.1.0: prismd.enabled is false, no prismd in this release.\n"
                                         "Agent sidecars dial %s (agent.prismd).\n" % self.EXISTING), notes)
        self.assertNotIn("port-forward", notes)
        self.assertNotIn("get secret", notes)


def sidecar_args(target, token=None):
    args = ["--prismd=" + target, "--dir=/run/prism", "--metrics-listen=0.0.0.0:9470",
            "--node=$(NODE_NAME)", "--device=cpu"]
    if token:
        args.append("--token-file=/etc/prism/job-token/" + token)
    return args


class RenderFull(unittest.TestCase):
    """The chart with helm/prism/ci/full-values.yaml: every optional object."""

    @classmethod
    def setUpClass(cls):
        cls.objs, _, _, _ = render("--values", FULL)
        cls.o = by_kind_name(cls.objs)

    def test_objects(self):
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in self.objs], [
            ("Secret", "prism-admin"), ("Secret", "prism-job-tokens"), ("ConfigMap", "prism-config"),
            ("ConfigMap", "prism-dashboards"), ("Service", "prism"), ("Service", "prism-headless"),
            ("StatefulSet", "prism"), ("Job", "prism-example-trainer"), ("PodMonitor", "prism-agents"),
            ("PrometheusRule", "prism"), ("ServiceMonitor", "prism")])

    def test_prismd(self):
        sts = self.o[("StatefulSet", "prism")]
        self.assertEqual(sts["spec"]["replicas"], 2)
        c = check_prismd_pod(self, sts)
        self.assertEqual(c["args"], BASE_ARGS + ["--job-tokens-dir=/etc/prism/job-tokens",
                                                 "--job-tokens-reload=60s", "--require-provisioned-tokens"])
        self.assertEqual(c["resources"], {"requests": {"cpu": "500m", "memory": "512Mi"},
                                          "limits": {"cpu": "4", "memory": "4Gi"}})
        self.assertEqual(sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"], "fast-ssd")
        self.assertEqual(sts["spec"]["template"]["metadata"]["annotations"]["example.com/team"], "ml-platform")
        check_services(self, self.o)
        cm = self.o[("ConfigMap", "prism-config")]["data"]
        self.assertEqual(json.loads(cm["policy.json"]),
                         {"low_precision": "fp8_e4m3", "warmup_steps": 20, "force_bf16_blocks": [0, 1]})
        self.assertEqual(json.loads(cm["service.json"]),
                         {"log-level": "info", "max-jobs": 200, "job-idle-expiry": "3d",
                          "require-read-token": True, "max-auto-jobs-per-peer": 0})

    def test_secrets(self):
        admin = self.o[("Secret", "prism-admin")]["data"]
        self.assertEqual(base64.b64decode(admin["admin-token"]), b"ci-admin-token-not-secret")
        jobs = self.o[("Secret", "prism-job-tokens")]["data"]
        self.assertEqual({k: base64.b64decode(v) for k, v in jobs.items()}, {"example": b"ci-example-job-token"})

    def test_replica_choice_is_rendezvous(self):
        """Each (job, replica count) goes to the replica the rendezvous rule names, and growing
        the count moves a job only to the new replica."""
        for job in ("example", "llama-7b", "j"):
            previous = None
            for replicas in (1, 2, 3, 4, 5):
                objs, _, _, _ = render("--values", FULL, "--set", "prismd.replicas=%d" % replicas,
                                       "--set", "exampleJob.jobId=%s" % job)
                pod = by_kind_name(objs)[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
                agent = container(pod, "prism-agent", "initContainers")
                target = [a for a in agent["args"] if a.startswith("--prismd=")]
                want = rendezvous_replica(job, replicas)
                self.assertEqual(target, ["--prismd=dns:///prism-%d.prism-headless.ml.svc:50051" % want],
                                 "job %s, %d replicas" % (job, replicas))
                if previous is not None:
                    self.assertIn(want, (previous, replicas - 1), "job %s moved between old replicas" % job)
                previous = want

    def test_sidecar_in_example_job(self):
        """The "prism.agentSidecar" template's output, as the example Job uses it."""
        job = self.o[("Job", "prism-example-trainer")]
        pod = job["spec"]["template"]["spec"]
        self.assertEqual(pod["securityContext"], POD_SECURITY_CONTEXT)
        self.assertEqual(job["spec"]["template"]["metadata"]["labels"]["prism-agent"], "sidecar")
        self.assertEqual(len(pod["initContainers"]), 1)
        agent = container(pod, "prism-agent", "initContainers")
        replica = rendezvous_replica("example", 2)
        self.assertEqual(replica, 1)
        self.assertEqual(agent["restartPolicy"], "Always")
        self.assertEqual(agent["command"], ["prism-agent"])
        self.assertEqual(agent["args"], sidecar_args(
            "dns:///prism-%d.prism-headless.ml.svc:50051" % replica, token="example"))
        self.assertEqual(agent["env"], [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}])
        self.assertEqual(agent["ports"], [{"name": "agent-metrics", "containerPort": 9470, "protocol": "TCP"}])
        self.assertEqual(agent["startupProbe"], {"httpGet": {"path": "/readyz", "port": "agent-metrics"},
                                                 "periodSeconds": 1, "failureThreshold": 60})
        self.assertEqual(agent["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "agent-metrics"})
        self.assertEqual(agent["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "agent-metrics"})
        self.assertEqual(agent["securityContext"], SIDECAR_SECURITY_CONTEXT)
        self.assertEqual(agent["resources"], {"requests": {"cpu": "50m", "memory": "64Mi"},
                                              "limits": {"cpu": "500m", "memory": "256Mi"}})
        self.assertEqual(agent["volumeMounts"], [
            {"name": "prism-run", "mountPath": "/run/prism"},
            {"name": "prism-job-token", "mountPath": "/etc/prism/job-token", "readOnly": True}])
        trainer = container(pod, "trainer")
        self.assertEqual(trainer["env"], [{"name": "PRISM_AGENT_DIR", "value": "/run/prism"}])
        self.assertIn({"name": "prism-run", "mountPath": "/run/prism"}, trainer["volumeMounts"])
        self.assertEqual(trainer["securityContext"], SECURITY_CONTEXT)
        self.assertEqual(pod["volumes"][:2], [
            {"name": "prism-run", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "prism-job-token", "secret": {"secretName": "prism-job-tokens",
                                                   "items": [{"key": "example", "path": "example"}]}}])

    def test_sidecar_without_token_one_replica(self):
        objs, _, _, _ = render("--set", "exampleJob.enabled=true,exampleJob.jobId=j1")
        pod = by_kind_name(objs)[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
        agent = container(pod, "prism-agent", "initContainers")
        self.assertEqual(agent["args"], sidecar_args("dns:///prism-0.prism-headless.ml.svc:50051"))
        self.assertEqual(agent["volumeMounts"], [{"name": "prism-run", "mountPath": "/run/prism"}])
        self.assertEqual([v["name"] for v in pod["volumes"]], ["prism-run", "tmp"])

    def test_sidecar_dials_container_port(self):
        """A replica's pod DNS name resolves to the pod's IP, where no Service port mapping
        applies: the agent dials prismd's container gRPC port 50051 whatever service.grpcPort is
        (review finding 1)."""
        objs, _, _, _ = render("--values", FULL, "--set", "service.grpcPort=443,service.httpPort=80")
        o = by_kind_name(objs)
        pod = o[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
        agent = container(pod, "prism-agent", "initContainers")
        self.assertEqual(agent["args"][0], "--prismd=dns:///prism-1.prism-headless.ml.svc:50051")
        for name in ("prism", "prism-headless"):
            self.assertEqual(o[("Service", name)]["spec"]["ports"], [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"},
                {"name": "grpc", "port": 443, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}])
        c = container(o[("StatefulSet", "prism")]["spec"]["template"]["spec"], "prismd")
        self.assertEqual(c["ports"], PRISMD_PORTS)
        self.assertIn("--grpc-listen=0.0.0.0:50051", c["args"])

    def test_sidecar_device(self):
        """The sidecar sees no GPU by default (it requests none): it says cpu (review finding
        14). The trainer's class can be named (deviceClass), or a pod's resource claim shared
        (resourceClaims) with device auto; the output is valid Kubernetes."""
        objs, out, _, _ = render("--values", FULL, "--set", "agent.device=auto,agent.deviceClass=gpu-nvidia-h100-80gb-hbm3",
                                 "--set", "agent.resourceClaims={gpu}")
        pod = by_kind_name(objs)[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
        agent = container(pod, "prism-agent", "initContainers")
        self.assertEqual(agent["args"][4:], ["--device=auto", "--device-class=gpu-nvidia-h100-80gb-hbm3",
                                             "--token-file=/etc/prism/job-token/example"])
        self.assertEqual(agent["resources"], {"requests": {"cpu": "50m", "memory": "64Mi"},
                                              "limits": {"cpu": "500m", "memory": "256Mi"},
                                              "claims": [{"name": "gpu"}]})
        if os.environ.get("PRISM_NODE"):
            p = run_node(write("device.yaml", out))
            self.assertEqual(p.returncode, 0)
        # No requests or limits (null deletes them, as in Helm), only the claim: still one valid
        # resources map.
        objs, out, _, _ = render("--values", FULL, "--values",
                                 write("claims-only.yaml", "agent:\n  resources: null\n  resourceClaims: [gpu]\n"))
        pod = by_kind_name(objs)[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
        self.assertEqual(container(pod, "prism-agent", "initContainers")["resources"], {"claims": [{"name": "gpu"}]})
        if os.environ.get("PRISM_NODE"):
            p = run_node(write("claims-only-out.yaml", out))
            self.assertEqual(p.returncode, 0)
        for bad, err in (("agent.device=gpu", '- agent.device: does not match pattern "^(auto|cpu|[0-9]+)$", given "gpu"'),
                         ("agent.deviceClass=a b", '- agent.deviceClass: does not match pattern "^[A-Za-z0-9._-]*$", given "a b"')):
            _, _, e, rc = render("--set", bad, check=False)
            self.assertEqual(rc, 1)
            self.assertIn(err, e)

    def test_monitoring(self):
        sm = self.o[("ServiceMonitor", "prism")]["spec"]
        self.assertEqual(sm["jobLabel"], "app.kubernetes.io/name")
        self.assertEqual(sm["selector"]["matchLabels"], dict(pod_labels(), **{"prism-service": "headless"}))
        self.assertEqual(sm["endpoints"], [{"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}])
        self.assertEqual(self.o[("Service", "prism-headless")]["metadata"]["labels"]["app.kubernetes.io/name"], "prism")
        pm = self.o[("PodMonitor", "prism-agents")]["spec"]
        self.assertEqual(pm["selector"], {"matchLabels": {"prism-agent": "sidecar"}})
        self.assertEqual(pm["namespaceSelector"], {"matchNames": ["ml-training"]})
        self.assertEqual(pm["podMetricsEndpoints"], [{"port": "agent-metrics", "path": "/metrics", "interval": "30s"}])
        with open(os.path.join(CHART, "files", "prometheus", "prism-rules.yml")) as f:
            rules = yaml.safe_load(f)
        self.assertEqual(self.o[("PrometheusRule", "prism")]["spec"]["groups"], rules["groups"])
        for obj in (self.o[("PrometheusRule", "prism")], self.o[("ServiceMonitor", "prism")]):
            self.assertEqual(obj["metadata"]["labels"]["release"], "kube-prometheus-stack")

    def test_dashboards(self):
        cm = self.o[("ConfigMap", "prism-dashboards")]
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertEqual(cm["metadata"]["annotations"], {"grafana_folder": "Prism"})
        folder = os.path.join(CHART, "files", "grafana")
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        self.assertEqual(sorted(cm["data"]), names)
        for n in names:
            with open(os.path.join(folder, n)) as f:
                self.assertEqual(json.loads(cm["data"][n]), json.load(f), n)


class ValuesRefused(unittest.TestCase):
    """values.schema.json refuses what the chart does not take, naming the key."""

    def refused(self, *args):
        _, out, err, rc = render(*args, check=False)
        self.assertEqual(rc, 1, err)
        self.assertEqual(out, "")
        return err

    def test_unknown_key_in_file(self):
        err = self.refused("--values", BAD)
        self.assertIn("values don't meet the specifications of the schema(s)", err)
        self.assertIn('- prismd.replica: additional property "replica" is not allowed', err)

    def test_invented_prismd_option(self):
        err = self.refused("--set", "prismd.options.max-job=5")
        self.assertIn('- prismd.options.max-job: additional property "max-job" is not allowed', err)

    def test_out_of_range_and_wrong_type(self):
        err = self.refused("--set", "prismd.replicas=0", "--set", "service.httpPort=http")
        self.assertIn("- prismd.replicas: must be at least 1, given 0", err)
        self.assertIn("- service.httpPort: invalid type: expected integer, given string", err)

    def test_policy_key_checked(self):
        err = self.refused("--set", "prismd.policy.low_precision=fp4")
        self.assertIn("- prismd.policy.low_precision: must be one of int8, fp8_e4m3, fp8_e5m2, int4, given fp4", err)

    def test_job_token_keys(self):
        """A job token's key is a job id as prismd takes it (1 to 128 letters, digits, '-', '_'
        or '.', starting with a letter or digit: also a valid Secret key and file name), and a
        token is printable ASCII without spaces (review finding 8)."""
        path = write("bad-tokens.yaml", yaml.safe_dump({"auth": {"jobTokens": {"tokens": {
            "team/a": "t1", "a:b": "t2", "#x": "t3", ".hidden": "t4", "x" * 129: "t5", "ok": "has space"}}},
            "exampleJob": {"jobId": "-j"}}))
        err = self.refused("--values", path)
        pattern = '"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"'
        for key in ("team/a", "a:b", "#x", ".hidden", "x" * 129):
            self.assertIn("- auth.jobTokens.tokens.%s: property name does not match pattern %s, given %s"
                          % (key, pattern, json.dumps(key)), err)
        self.assertIn('- auth.jobTokens.tokens.ok: does not match pattern "^[!-~]+$", given "has space"', err)
        self.assertIn('- exampleJob.jobId: does not match pattern %s, given "-j"' % pattern, err)

    def test_job_token_keys_quoted(self):
        """Keys YAML would read as a boolean or a number stay the job ids they are."""
        path = write("tokens.yaml", 'auth:\n  jobTokens:\n    tokens:\n      "true": t1\n'
                     '      "007": t2\n      "1e3": t3\n      a.b-c_d: t4\n')
        o = by_kind_name(render("--values", path)[0])
        data = o[("Secret", "prism-job-tokens")]["data"]
        self.assertEqual({k: base64.b64decode(v) for k, v in data.items()},
                         {"true": b"t1", "007": b"t2", "1e3": b"t3", "a.b-c_d": b"t4"})

    def test_agent_extra_args_chart_flags(self):
        """agent.extraArgs cannot repeat a flag the chart sets (review finding 8)."""
        path = write("extra.yaml", yaml.safe_dump({"agent": {"extraArgs": [
            "--heartbeat-ms=5000", "--dir=/x", "--prismd", "--metrics-listen=0.0.0.0:1", "--node=n",
            "--device=0", "--device-class=h100", "--directory=/ok"]}}))
        err = self.refused("--values", path)
        why = ("is refused (the chart sets --dir, --prismd, --metrics-listen, --node, --device and "
               "--device-class: use agent.runDir, agent.prismd, agent.metricsPort, agent.device and "
               "agent.deviceClass)")
        refused = [line for line in err.splitlines() if line.startswith("- agent.extraArgs")]
        self.assertEqual(refused, ['- agent.extraArgs[%d]: %s, given "%s"' % (i, why, a) for i, a in [
            (1, "--dir=/x"), (2, "--prismd"), (3, "--metrics-listen=0.0.0.0:1"), (4, "--node=n"),
            (5, "--device=0"), (6, "--device-class=h100")]])
        objs, _, _, _ = render("--set", "exampleJob.enabled=true", "--values", write("ok.yaml", yaml.safe_dump(
            {"agent": {"extraArgs": ["--heartbeat-ms=5000", "--log-level=debug"]}})))
        pod = by_kind_name(objs)[("Job", "prism-example-trainer")]["spec"]["template"]["spec"]
        args = container(pod, "prism-agent", "initContainers")["args"]
        self.assertEqual(args[-2:], ["--heartbeat-ms=5000", "--log-level=debug"])

    def test_kube_version_checked(self):
        """The native sidecar needs Kubernetes 1.29: Chart.yaml's kubeVersion says so."""
        err = self.refused("--kube-version", "1.28.3")
        self.assertIn("chart requires kubeVersion: >=1.29.0-0 which is incompatible with Kubernetes v1.28.3", err)


def help_flags(binary):
    text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"^\s+(?:-\w, )?--([a-z][-a-z0-9]*)", text, re.M))


class FlagsExist(unittest.TestCase):
    """Every flag the rendered containers pass, and every key of service.json, is one the built
    binaries list in --help."""

    def test_flags(self):
        prismd, agent = help_flags(os.environ["PRISM_PRISMD"]), help_flags(os.environ["PRISM_AGENT"])
        self.assertIn("health-listen", prismd)
        self.assertIn("metrics-listen", agent)
        for values in ([], ["--values", FULL]):
            o = by_kind_name(render(*values)[0])
            c = container(o[("StatefulSet", "prism")]["spec"]["template"]["spec"], "prismd")
            for a in c["args"]:
                self.assertIn(a[2:].split("=")[0], prismd, a)
            for key in json.loads(o[("ConfigMap", "prism-config")]["data"]["service.json"]):
                self.assertIn(key, prismd, "service.json: " + key)
            job = o.get(("Job", "prism-example-trainer"))
            if job:
                a = container(job["spec"]["template"]["spec"], "prism-agent", "initContainers")
                for arg in a["args"]:
                    self.assertIn(arg[2:].split("=")[0], agent, arg)
        # Every option the schema allows in prismd.options is a flag of prismd.
        with open(os.path.join(CHART, "values.schema.json")) as f:
            schema = json.load(f)
        options = schema["properties"]["prismd"]["properties"]["options"]["properties"]
        self.assertEqual(sorted(set(options) - prismd), [])


def run_node(*args):
    p = subprocess.run([os.environ["PRISM_NODE"], VALIDATE, *args], capture_output=True, text=True, timeout=300)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    return p


class Validate(unittest.TestCase):
    """Every rendered object against the Kubernetes schemas; the values files against
    values.schema.json with ajv (and the bad one refused there too)."""

    def test_validate(self):
        files = [write("default.yaml", render()[1]), write("full.yaml", render("--values", FULL)[1])]
        # ajv, a second draft-07 implementation, refuses what the renderer's schema check does
        # (propertyNames and not included).
        refuse = []
        for i, values in enumerate([
                {"auth": {"jobTokens": {"tokens": {"team/a": "t"}}}},
                {"auth": {"jobTokens": {"tokens": {"a": "has space"}}}},
                {"agent": {"extraArgs": ["--dir=/x"]}},
                {"agent": {"extraArgs": ["--prismd"]}},
                {"agent": {"device": "gpu"}}]):
            refuse += ["--refuse-values", write("refuse-%d.yaml" % i, yaml.safe_dump(values))]
        p = run_node("--schema", os.path.join(CHART, "values.schema.json"),
                     "--chart-values", os.path.join(CHART, "values.yaml"), "--values", FULL,
                     "--refuse-values", BAD, *refuse, *files)
        self.assertEqual(p.returncode, 0)
        self.assertIn("default.yaml: 5 objects checked", p.stdout)
        self.assertIn("full.yaml: 11 objects checked", p.stdout)

    def test_validator_refuses(self):
        """The validator fails an unknown field, a wrong type and an unknown kind."""
        _, out, _, _ = render()
        bad = out.replace("readinessProbe:", "readinesProbe:", 1).replace("containerPort: 8081", 'containerPort: "8081"', 1)
        bad += "---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n"
        p = run_node(write("bad.yaml", bad))
        self.assertEqual(p.returncode, 1)
        self.assertIn("StatefulSet/prism: schema: data/spec/template/spec/containers/0/ports/2/containerPort must be integer", p.stdout)
        self.assertIn('Widget/w: unknown kind: apiVersion "example.com/v1" kind "Widget"', p.stdout)
        p = run_node(write("typo.yaml", out.replace("readinessProbe:", "readinesProbe:", 1)))
        self.assertIn("StatefulSet/prism: unknown field spec.template.spec.containers[0].readinesProbe", p.stdout)


class Kustomize(unittest.TestCase):
    """deploy/k8s rendered by kubectl kustomize: valid objects, and the same deployment as the
    chart's default render (release prism)."""

    def test_kustomize(self):
        kubectl = os.environ["PRISM_KUBECTL"]
        p = subprocess.run([kubectl, "kustomize", os.path.join(SOURCE, "deploy", "k8s")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        objs = [o for o in yaml.safe_load_all(p.stdout) if o]
        k = by_kind_name(objs)
        self.assertEqual(sorted(k), [("ConfigMap", "prism-config"), ("Service", "prism"),
                                     ("Service", "prism-headless"), ("StatefulSet", "prism")])
        chart = by_kind_name(render()[0])
        sts, chart_sts = k[("StatefulSet", "prism")], chart[("StatefulSet", "prism")]
        chart_sts["spec"]["template"]["metadata"].pop("annotations")
        self.assertEqual(sts["spec"], chart_sts["spec"])
        for name in ("prism", "prism-headless"):
            self.assertEqual(k[("Service", name)]["spec"], chart[("Service", name)]["spec"])
        self.assertEqual(k[("ConfigMap", "prism-config")]["data"], chart[("ConfigMap", "prism-config")]["data"])
        v = run_node(write("kustomize.yaml", p.stdout), os.path.join(SOURCE, "deploy", "k8s", "secret.example.yaml"))
        self.assertEqual(v.returncode, 0)
        self.assertIn("kustomize.yaml: 4 objects checked (ConfigMap 1, Service 2, StatefulSet 1)", v.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
