#!/usr/bin/python3
"""The pods are run (issue 14, item 7): prismd's container of the Helm chart's StatefulSet and the
prism-agent sidecar of its example trainer Job, and prismd's container of the kustomize base, run
here as the built binaries with exactly the command, arguments, environment, volumes, ports and
probes the rendered manifests give them (tests/deploy/podrun.py says what is mapped to loopback
and how). Every httpGet probe must answer 200, every declared container port must be listened
on, every Service port must reach a container port, and the agent must reach prismd: a trainer
on libprism's Python binding, with the example trainer container's environment, says Hello
through the shared directory, and the agent's /metrics shows prism_agent_upstream_connected 1
while prismd's /v1/jobs lists the job with its agent connected.

Each container runs with HOME and TMPDIR where the pod would let it write (readOnlyRootFilesystem):
on a volume mounted there, else where nothing can be created (ReadOnlyRootTest).

The checker is shown to catch what it is for: the same manifests, broken in memory (an unknown
flag, a probe on a wrong path, a container port prismd does not listen on, a listen address on
another port), must each give the failure that names it.

Environment: PRISM_BUILD_DIR (the binaries, the renderer tests/deploy/helm_render,
lib/libprism.so), PRISM_SOURCE_DIR; PRISM_HELM_CHART (default SOURCE/helm/prism),
PRISM_HELM_RENDER (default BUILD/tests/deploy/helm_render), PRISM_K8S_DIR (default
SOURCE/deploy/k8s), PRISM_KUBECTL (default kubectl). Loopback only, bounded waits, every process
killed on every path."""

import atexit
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import yaml  # noqa: E402
import podrun  # noqa: E402
import openapi_check  # noqa: E402

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(HERE, "..", "..")))
CHART = os.path.abspath(os.environ.get("PRISM_HELM_CHART", os.path.join(SOURCE, "helm", "prism")))
RENDER = os.environ.get("PRISM_HELM_RENDER", os.path.join(BUILD, "tests", "deploy", "helm_render"))
K8S = os.path.abspath(os.environ.get("PRISM_K8S_DIR", os.path.join(SOURCE, "deploy", "k8s")))
KUBECTL = os.environ.get("PRISM_KUBECTL", "kubectl")
RELEASE, NAMESPACE = "pods", "prism-test"
LIBPRISM = os.environ.get("PRISM_LIBRARY", os.path.join(BUILD, "lib", "libprism.so"))
# prismd's answer to a stream whose token is neither the job's nor the admin token
# (service/prismd/jobs.c), as the agent logs it.
REFUSED = re.compile(r"wrong or missing token[^\"\n]*")


def render_chart(*values_files):
    """The chart's manifests as Helm renders them (the renderer of tests/deploy/helm_render)."""
    argv = [RENDER, "--chart", CHART, "--release", RELEASE, "--namespace", NAMESPACE]
    for v in values_files:
        argv += ["--values", v]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr))
    return list(yaml.safe_load_all(r.stdout))


def kustomize():
    """The kustomize base's objects, and the admin token Secret its secret.example.yaml shows (the
    base ships no token: an operator creates that Secret before applying it)."""
    r = subprocess.run([KUBECTL, "kustomize", K8S], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise AssertionError("kubectl kustomize %s failed (%d): %s" % (K8S, r.returncode, r.stderr))
    docs = list(yaml.safe_load_all(r.stdout))
    example = os.path.join(K8S, "secret.example.yaml")
    if os.path.exists(example):
        with open(example) as f:
            docs += list(yaml.safe_load_all(f))
    return docs


def image_workdir():
    """The runtime stage's WORKDIR in the Dockerfile: where a container without workingDir starts."""
    wd = None
    with open(os.path.join(SOURCE, "Dockerfile")) as f:
        for line in f:
            m = re.match(r"\s*WORKDIR\s+(\S+)", line)
            if m:
                wd = m.group(1)
    return wd


def flag_value(argv, flag):
    """The value of --flag VALUE or --flag=VALUE in argv; None when absent."""
    for i, w in enumerate(argv):
        if w == flag and i + 1 < len(argv):
            return argv[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


def metric(port, name):
    status, text = podrun.http_get(port, "/metrics")
    if status != 200:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def check_openapi(listener_ports):
    """on_ok for prismd's probes: the answer must conform to prismd's OpenAPI document, as every
    answer of prismd the tests receive does."""
    def on_ok(port, path, status, body, headers):
        openapi_check.check("GET", path, status, headers.get("Content-Type"), body, headers,
                            listener="http" if port in listener_ports else "health")
    return on_ok


def unique(failures):
    """The failures in order, each once (an ended process is reported by every check after)."""
    seen = []
    for f in failures:
        if f not in seen:
            seen.append(f)
    return seen


def run_pods(docs, with_agent=True):
    """Runs prismd's container in every replica of its StatefulSet and, when the manifests have
    one and with_agent, the prism-agent sidecar with a trainer beside it; returns every failure
    found, each naming its container and what is wrong. No failure: the pods would run. A loopback
    port taken by another process between its choice and its bind is no failure of the
    manifests: then all runs again on other ports (three times at most)."""
    for attempt in range(3):
        failures = run_pods_once(docs, with_agent)
        if not any(podrun.ADDRESS_IN_USE.search(f) for f in failures):
            break
        print("test_pods_run: a loopback port was taken meanwhile; running again on other ports", file=sys.stderr)
    return failures


def run_pods_once(docs, with_agent):
    failures = []
    with podrun.Cluster(docs, BUILD, NAMESPACE) as cluster:
        found = cluster.manifests.find_container("prismd", "StatefulSet")
        if not found:
            return ["no StatefulSet container runs prismd"]
        obj, tmpl, spec = found
        http_port = podrun.port_number(spec, "http") or 8080
        replicas = obj["spec"].get("replicas", 1)
        prismds = [podrun.Container(cluster.pod(obj, tmpl, i), spec, image_workdir()) for i in range(replicas)]
        started = [prismd.start() for prismd in prismds]
        for prismd, ok in zip(prismds, started):
            if ok:
                failures += prismd.check_probes(check_openapi({http_port}))
                failures += prismd.check_ports()
            failures += cluster.check_services(prismd.pod)
            if failures or prismd.pod.failures:
                break  # the replicas run the same container: one's failures are all's
        if failures or any(p.failures for p in cluster.pods):
            return unique([f for p in cluster.pods for f in p.failures] + failures)
        agent_found = cluster.manifests.find_container("prism-agent")
        if with_agent and agent_found:
            failures += run_agent(cluster, http_port, *agent_found)
        # The pods end as the kubelet ends them: SIGTERM, and prismd stops cleanly.
        for prismd in prismds:
            gone = prismd.exited()
            if gone:
                failures.append(gone)
            elif prismd.stop() != 0:
                failures.append("%s: prismd exited with status %s on SIGTERM: %s" % (
                    prismd.name, prismd.proc.returncode, prismd.log_tail()))
        return unique([f for p in cluster.pods for f in p.failures] + failures)


def run_agent(cluster, http_port, obj, tmpl, spec):
    """The agent sidecar and, beside it, a trainer on the Python binding with the trainer
    container's environment, job id and mounts: the agent's probes answer and it reaches the
    prismd replica its --prismd names (its metrics say connected; that replica lists the job)."""
    failures = []
    pod = cluster.pod(obj, tmpl)
    agent = podrun.Container(pod, spec, image_workdir())
    if not agent.start():
        return failures
    failures += agent.check_probes()
    failures += agent.check_ports()
    if failures or pod.failures:
        return failures
    prismd_pods = agent.resolved
    if len(prismd_pods) != 1:
        return ["%s: --prismd %s reaches %d prismd pods, not one" % (
            agent.name, flag_value(agent.argv_run, "--prismd"), len(prismd_pods))]
    prismd = next(c for c in cluster.containers if c.pod is prismd_pods[0])
    # The trainer: the other container of the pod that mounts the directory the agent serves in.
    agent_dir = flag_value(agent.argv_run, "--dir")
    trainer = None
    for c in tmpl["spec"]["containers"]:
        t = podrun.Container(pod, c)
        if agent_dir and any(agent_dir == d or agent_dir.startswith(d + "/") for _, d in t.mounts):
            trainer = t
            break
    if trainer is None:
        return ["%s: no trainer container of the pod mounts the agent's --dir %s" % (agent.name, agent_dir)]
    # What tells libprism in the trainer where its agent is (PRISM_AGENT_DIR, or the example's
    # --dir) and its job id (PRISM_JOB_ID, or the example's --job): each must be the agent's.
    targs = [podrun.expand_vars(str(w), trainer.env) for w in (trainer.spec.get("command") or []) +
             (trainer.spec.get("args") or [])]
    dirs = [("PRISM_AGENT_DIR", trainer.env.get("PRISM_AGENT_DIR")), ("--dir", flag_value(targs, "--dir"))]
    dirs = [(what, v) for what, v in dirs if v is not None]
    if not dirs:
        return ["%s: neither PRISM_AGENT_DIR nor --dir tells the trainer where its agent is" % trainer.name]
    for what, v in dirs:
        if trainer.map_value(v) != agent_dir:
            failures.append("%s: %s %s is not the agent's --dir (%s here, %s in the agent)" % (
                trainer.name, what, v, trainer.map_value(v), agent_dir))
    job = trainer.env.get("PRISM_JOB_ID") or flag_value(targs, "--job")
    if not job:
        failures.append("%s: neither PRISM_JOB_ID nor --job gives the trainer's job id" % trainer.name)
    if failures:
        return failures
    env = dict(os.environ)
    env.update({k: trainer.map_value(v) for k, v in trainer.env.items()})
    env.update({"PRISM_AGENT_DIR": agent_dir, "PRISM_JOB_ID": job, "PRISM_LIBRARY": LIBPRISM,
                "PYTHONPATH": os.path.join(SOURCE, "python"),
                # The example's rank and world size, so that its Hello is the one the trainer sends.
                "PRISM_RANK": flag_value(targs, "--rank") or "0",
                "PRISM_WORLD_SIZE": flag_value(targs, "--world") or "1"})
    log_path = os.path.join(pod.root, "trainer.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", podrun.trainer_script()], env=env, cwd=trainer.workdir,
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster.processes.append(proc)
    try:
        metrics_port = podrun.port_number(spec, "metrics") or podrun.port_number(
            spec, (spec.get("readinessProbe") or {}).get("httpGet", {}).get("port"))
        token = None
        token_file = flag_value(prismd.argv_run, "--admin-token-file")
        if token_file:
            with open(token_file) as f:
                token = f.read().strip()

        def job_listed():
            headers = [{"name": "Authorization", "value": "Bearer " + token}] if token else None
            answer = {}
            status, body = podrun.http_get(prismd.pod.loopback(http_port), "/v1/jobs", headers, answer=answer)
            if status != 200:
                return False
            openapi_check.check("GET", "/v1/jobs", status, answer["headers"].get("Content-Type"), body,
                                answer["headers"])
            return any(j["job_id"] == job and j["agents_connected"] >= 1 for j in json.loads(body)["jobs"])

        def gone():
            """Why the agent can no longer reach prismd, once that is settled: a process ended, or
            prismd refused the agent's token (it sends the same token file again on every try)."""
            for c in (agent, prismd):
                if c.exited():
                    return c.exited()
            if proc.poll() is not None:
                return "the trainer exited with status %d" % proc.returncode
            refused = REFUSED.search(agent.log_tail(40))
            if refused:
                return "prismd refused the agent's token: %s" % refused.group(0)
            return None

        connected = podrun.bounded_wait(lambda: gone() or (
            metric(pod.loopback(metrics_port), "prism_agent_upstream_connected") == 1 and job_listed()))
        if connected is not True:
            with open(log_path) as f:
                trainer_log = f.read()[-500:]
            failures.append("%s did not reach prismd %s: %s; agent: %s; trainer: %s" % (
                agent.name, prismd.pod.name, connected or
                "within %d s, prism_agent_upstream_connected is not 1 or /v1/jobs does not list job %r with "
                "its agent" % (podrun.WAIT_S, job), agent.log_tail(), trainer_log))
        elif agent.stop() != 0:
            failures.append("%s: prism-agent exited with status %s on SIGTERM: %s" % (
                agent.name, agent.proc.returncode, agent.log_tail()))
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
    return failures


def values_file(text):
    """A values file of text, removed when the test process ends."""
    f = tempfile.NamedTemporaryFile("w", prefix="prism-values-", suffix=".yaml", delete=False)
    with f:
        f.write(text)
    atexit.register(os.unlink, f.name)
    return f.name


# Client Service ports other than prismd's container ports: the agent sidecar dials a replica's pod
# name, which takes the pod's (container) port, never the Service's.
SERVICE_PORTS = "service:\n  httpPort: 80\n  grpcPort: 443\n"


def prismd_of(docs):
    return podrun.Manifests(docs).find_container("prismd", "StatefulSet")[2]


def agent_of(docs):
    return podrun.Manifests(docs).find_container("prism-agent")[2]


class ChartPodsRunTest(unittest.TestCase):
    """The chart's pods, rendered with the default values and with ci/full-values.yaml."""

    def test_default_values(self):
        docs = render_chart()
        self.assertEqual(run_pods(docs), [])

    def test_full_values_prismd_and_the_agent_sidecar(self):
        docs = render_chart(os.path.join(CHART, "ci", "full-values.yaml"))
        self.assertIsNotNone(podrun.Manifests(docs).find_container("prism-agent", "Job"),
                             "full-values.yaml renders the example trainer Job with the prism-agent sidecar")
        self.assertEqual(run_pods(docs), [])

    def test_service_ports_other_than_the_container_ports(self):
        docs = render_chart(os.path.join(CHART, "ci", "full-values.yaml"), values_file(SERVICE_PORTS))
        target = flag_value(agent_of(docs)["args"], "--prismd")
        self.assertRegex(target, r"^dns:///pods-prism-\d+\.pods-prism-headless\.%s\.svc:50051$" % NAMESPACE)
        self.assertEqual(run_pods(docs), [])


class ReadOnlyRootTest(unittest.TestCase):
    """readOnlyRootFilesystem: a container's HOME and TMPDIR are writable here only where the pod
    mounts a volume (prismd: its data volume and its /tmp emptyDir; the agent sidecar: neither)."""

    def environments(self, docs):
        """{binary: the environment its container's process gets} for prismd and prism-agent."""
        out = {}
        with podrun.Cluster(docs, BUILD, NAMESPACE) as cluster:
            for binary in ("prismd", "prism-agent"):
                obj, tmpl, spec = cluster.manifests.find_container(binary)
                out[binary] = podrun.Container(cluster.pod(obj, tmpl), spec, image_workdir()).environment()
                out[binary]["writable"] = {k: self.writable(out[binary][k]) for k in ("HOME", "TMPDIR")}
        return out

    @staticmethod
    def writable(directory):
        try:
            with tempfile.NamedTemporaryFile(dir=directory):
                return True
        except OSError:
            return False

    def test_the_image_home_is_the_dockerfile_s(self):
        with open(os.path.join(SOURCE, "Dockerfile")) as f:
            homes = re.findall(r"--home-dir\s+(\S+)", f.read())
        self.assertEqual(homes, [podrun.IMAGE_HOME])

    def test_home_and_tmpdir_are_writable_only_on_volumes(self):
        envs = self.environments(render_chart(os.path.join(CHART, "ci", "full-values.yaml")))
        self.assertEqual(envs["prismd"]["writable"], {"HOME": True, "TMPDIR": True})
        self.assertEqual(envs["prism-agent"]["writable"], {"HOME": False, "TMPDIR": False})

    def test_the_checker_catches_prismd_without_its_tmp_volume(self):
        docs = render_chart(os.path.join(CHART, "ci", "full-values.yaml"))
        spec = prismd_of(docs)
        spec["volumeMounts"] = [m for m in spec["volumeMounts"] if m["mountPath"] != "/tmp"]
        self.assertEqual(self.environments(docs)["prismd"]["writable"], {"HOME": True, "TMPDIR": False})


class KustomizePodsRunTest(unittest.TestCase):
    def test_kustomize_base(self):
        self.assertEqual(run_pods(kustomize()), [])

    def test_the_checker_catches_a_wrong_probe_path_in_the_base(self):
        docs = kustomize()
        prismd_of(docs)["livenessProbe"]["httpGet"]["path"] = "/health"
        failures = run_pods(docs)
        print("checker's failures:\n  " + "\n  ".join(failures), file=sys.stderr)
        self.assertIn("livenessProbe GET /health on port", "\n".join(failures))
        self.assertIn("answered 404, not 200", "\n".join(failures))


class CheckerCatchesTest(unittest.TestCase):
    """The checker itself: manifests broken in memory give the failure that names the break."""

    @classmethod
    def setUpClass(cls):
        cls.docs = render_chart(os.path.join(CHART, "ci", "full-values.yaml"))

    def broken(self, change, with_agent=False):
        docs = copy.deepcopy(self.docs)
        change(docs)
        return run_pods(docs, with_agent)

    def assertNamed(self, failures, *texts):
        print("checker's failures:\n  " + "\n  ".join(failures), file=sys.stderr)
        self.assertTrue(failures, "the checker found nothing wrong")
        joined = "\n".join(failures)
        for t in texts:
            self.assertIn(t, joined)

    def test_an_unknown_prismd_flag(self):
        failures = self.broken(lambda d: prismd_of(d).setdefault("args", []).append("--no-such-flag"))
        self.assertNamed(failures, "prismd exited with status 2", '"--no-such-flag"')

    def test_an_unknown_agent_flag(self):
        failures = self.broken(lambda d: agent_of(d).setdefault("args", []).append("--no-such-agent-flag"),
                               with_agent=True)
        self.assertNamed(failures, "prism-agent exited with status 2", "--no-such-agent-flag")

    def test_a_probe_on_a_wrong_path(self):
        def change(d):
            prismd_of(d)["readinessProbe"]["httpGet"]["path"] = "/ready"
        failures = self.broken(change)
        self.assertNamed(failures, "readinessProbe GET /ready on port", "answered 404, not 200")

    def test_a_container_port_prismd_does_not_listen_on(self):
        # The probes' port is declared one off: prismd still listens where its flags say.
        def change(d):
            spec = prismd_of(d)
            number = podrun.port_number(spec, spec["readinessProbe"]["httpGet"]["port"])
            for p in spec["ports"]:
                if p["containerPort"] == number:
                    p["containerPort"] = number + 1
            self.moved = number + 1
        failures = self.broken(change)
        self.assertNamed(failures, "(container port %d) answered nothing" % self.moved,
                         "containerPort %d" % self.moved)

    def test_a_listen_address_on_another_port(self):
        # prismd's gRPC listener moved off its declared container port: the port is found silent.
        def change(d):
            spec = prismd_of(d)
            words = (spec.get("command") or []) + (spec.get("args") or [])
            grpc = podrun.port_number(spec, "grpc")
            old = [w for w in words if re.search(r"(0\.0\.0\.0|\[::\]):%d$" % grpc, w)]
            self.assertTrue(old, "prismd's arguments give its gRPC listen address")
            spec["args"] = [w.replace(":%d" % grpc, ":%d" % (grpc + 1)) if w in old else w for w in spec["args"]]
            self.grpc = grpc
        failures = self.broken(change)
        self.assertNamed(failures, "containerPort %d (grpc): nothing listens on it" % self.grpc)

    def test_a_service_port_that_reaches_no_container_port(self):
        def change(d):
            for svc in d:
                if svc and svc.get("kind") == "Service":
                    for p in svc["spec"]["ports"]:
                        if p.get("targetPort") == "grpc":
                            p["targetPort"] = "grpcs"
        failures = self.broken(change)
        self.assertNamed(failures, "targetPort 'grpcs' is no container port of")

    def test_an_agent_that_dials_a_replica_on_the_service_port(self):
        # The old mistake: the sidecar dials a replica's pod name on the client Service's gRPC
        # port (443 here) instead of prismd's container port; a pod's DNS name has no Service port.
        docs = render_chart(os.path.join(CHART, "ci", "full-values.yaml"), values_file(SERVICE_PORTS))
        args = agent_of(docs)["args"]
        i = next(i for i, w in enumerate(args) if w.startswith("--prismd="))
        self.assertTrue(args[i].endswith(":50051"), args[i])
        args[i] = args[i][:-len("50051")] + "443"
        failures = run_pods(docs, with_agent=True)
        self.assertNamed(failures, ":443 (pod pods-prism-", "port 443 is no container port of pod pods-prism-")

    def test_an_agent_whose_job_token_prismd_refuses(self):
        # The sidecar's token file comes from another Secret: the agent runs, its probes answer,
        # but prismd refuses its stream, so it never reaches prismd.
        def change(d):
            d.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "not-the-job-token"},
                      "stringData": {"example": "not-the-token"}})
            _, tmpl, agent = podrun.Manifests(d).find_container("prism-agent")
            mount = [m for m in agent["volumeMounts"] if m["mountPath"] in
                     [os.path.dirname(w.split("=", 1)[1]) for w in agent["args"] if w.startswith("--token-file=")]]
            self.assertEqual(len(mount), 1, "full-values.yaml gives the agent its job's token file")
            for v in tmpl["spec"]["volumes"]:
                if v["name"] == mount[0]["name"]:
                    v["secret"] = {"secretName": "not-the-job-token"}
        failures = self.broken(change, with_agent=True)
        self.assertNamed(failures, "did not reach prismd", "wrong or missing token")


if __name__ == "__main__":
    unittest.main(verbosity=2)
