"""Runs the containers of rendered Kubernetes manifests here, as processes of the built binaries,
and reports what a cluster would find wrong with them (tests/deploy/test_pods_run.py,
tests/deploy/test_dockerfile.py).

What a container runs is taken from the manifest as the kubelet takes it: `command` and `args`
with `$(VAR)` expanded from its `env` (values, `valueFrom` secretKeyRef/configMapKeyRef resolved
from the rendered Secrets and ConfigMaps, fieldRef from a made-up pod), its `volumeMounts` (the
ConfigMap and Secret volumes written out as files, emptyDir and PVC volumes as empty directories)
and its `ports` and probes; a pod's containers are its containers and its native sidecars
(initContainers with restartPolicy Always, as the chart's prism-agent is). Then only these are
changed, so that it runs here on loopback:

- /usr/local/bin/NAME, or NAME alone (found there on the image's PATH), for the image's binaries
  prismd, prismctl and prism-agent -> PRISM_BUILD_DIR's binary of that name;
- a path under a mountPath -> the same path under the volume's directory here;
- a listen address 0.0.0.0:PORT or [::]:PORT -> 127.0.0.1:FREE, one free port per container port
  of the pod (the probes and Services reach the pod through the same map, so a listener on
  another port than the one declared is found: its probe reaches nothing);
- a Service's DNS name (NAME, NAME.NS, NAME.NS.svc[.cluster.local]) with a Service port -> the
  port's targetPort -> the container port -> its loopback address; a StatefulSet pod's name under
  its headless Service (POD.NAME.NS...) with a port -> that pod's port itself (no Service port).

HOME (the image user's home) and TMPDIR are their volume's directory where one is mounted, else a
path where nothing can be created: the root filesystem is read-only in the pods.

The same mapping applies to the string values of JSON files in ConfigMap volumes (prismd's
--service-config names listen addresses and paths). ":PORT" is left alone: the binaries do not
accept it, and the test must see them refuse it as they would in the pod.

Checks return lists of failures (strings naming the container, the flag, port or probe) instead
of raising, so that a test can assert both that the real manifests give none and that broken
ones give the expected one."""

import base64
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

IMAGE_BIN = "/usr/local/bin/"
# Where each binary the image installs lies in a build directory.
BUILD_BINARIES = {"prismd": "service/prismd", "prismctl": "service/prismctl", "prism-agent": "agent/prism-agent"}
# Longest wait for one probe, port or connection: readiness follows the policy thread's start and an
# agent's stream to prismd its reconnect backoff (up to ~10 s), on a loaded box and under sanitizers.
# A wait whose outcome is settled ends before: an answer (a 404 is final), the process's exit, every
# listener its flags name being up (a port none of them is never listened on), a refusal.
WAIT_S = 120
POLL_S = 0.05        # between two attempts of a bounded wait
NODE_NAME = "node-1"  # spec.nodeName of the made-up pods
# The home directory of the image's user prism (the Dockerfile's useradd --home-dir): HOME in its
# containers, writable only where a volume is mounted there (prismd's data volume).
IMAGE_HOME = "/var/lib/prism"
# What a wait's predicate returns when the port waited for will never be listened on.
NEVER = object()


_handed_out = set()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process has not handed out
    before (two container ports never share one). Another process may still take it before the
    container binds it: the tests run again on "address in use" (ADDRESS_IN_USE)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise AssertionError("no free loopback port left that was not handed out already")


# What prismd and prism-agent log when a port they were given was taken in the meantime.
ADDRESS_IN_USE = re.compile(r"address in use|Address already in use", re.I)


def bounded_wait(predicate, timeout_s=WAIT_S):
    """Polls predicate until it returns something true (returned) or timeout_s passes (None);
    bounded in time and in count."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / POLL_S) + 1):
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return None


def http_get(port, path, headers=None, timeout_s=5, answer=None):
    """(status, body) of GET http://127.0.0.1:port/path; (None, error text) when nothing answers.
    answer: a dict given the answer's headers ("headers": {name: value})."""
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path))
    for h in headers or []:
        req.add_header(h["name"], h["value"])
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            if answer is not None:
                answer["headers"] = dict(r.headers.items())
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        if answer is not None:
            answer["headers"] = dict(e.headers.items())
        return e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return None, str(e)


def tcp_open(port):
    """True when something accepts a TCP connection on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def pod_containers(pod_spec):
    """The containers that run beside each other in a pod: its containers and its native sidecars
    (initContainers with restartPolicy Always, as the prism-agent sidecar is)."""
    return [c for c in pod_spec.get("initContainers", []) if c.get("restartPolicy") == "Always"] + \
        list(pod_spec.get("containers", []))


def image_path(word):
    """The file a container's command word names in the image: itself when absolute, else the
    first directory of the image's PATH (Debian's default; the Dockerfile sets none) that holds it,
    where the image's own binaries are in /usr/local/bin."""
    if word.startswith("/"):
        return word
    if word in BUILD_BINARIES:
        return IMAGE_BIN + word
    return None


def port_number(container, port):
    """A probe's or Service's port (number or name) as a port number of the container spec; None
    when it names no port of the container."""
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


class Manifests:
    """The objects of a rendered stream (Helm's output or `kubectl kustomize`'s), by kind and name."""

    def __init__(self, docs, namespace=None):
        self.docs = [d for d in docs if isinstance(d, dict) and d.get("kind")]
        self.namespace = namespace

    def of_kind(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind, name):
        for d in self.of_kind(kind):
            if d["metadata"]["name"] == name:
                return d
        return None

    def ns(self, obj):
        return obj["metadata"].get("namespace") or self.namespace or "default"

    def workloads(self):
        """(object, pod template) of every object that makes pods."""
        out = []
        for d in self.docs:
            spec = d.get("spec") or {}
            if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job", "ReplicaSet"):
                out.append((d, spec["template"]))
            elif d["kind"] == "CronJob":
                out.append((d, spec["jobTemplate"]["spec"]["template"]))
            elif d["kind"] == "Pod":
                out.append((d, d))
        return out

    def find_container(self, binary, kind=None):
        """(object, pod template, container) of the first container whose command runs
        /usr/local/bin/BINARY (the chart's containers always give command), in a workload of kind
        when given; None when there is none."""
        for obj, tmpl in self.workloads():
            if kind and obj["kind"] != kind:
                continue
            for c in pod_containers(tmpl["spec"]):
                cmd = c.get("command") or []
                if cmd and os.path.basename(cmd[0]) == binary:
                    return obj, tmpl, c
        return None

    def key_of(self, kind, name, key):
        """The text of key in ConfigMap/Secret name; None when either is missing."""
        obj = self.get(kind, name)
        if obj is None:
            return None
        if kind == "Secret":
            if key in (obj.get("stringData") or {}):
                return obj["stringData"][key]
            if key in (obj.get("data") or {}):
                return base64.b64decode(obj["data"][key]).decode("utf-8")
            return None
        if key in (obj.get("data") or {}):
            return obj["data"][key]
        if key in (obj.get("binaryData") or {}):
            return base64.b64decode(obj["binaryData"][key]).decode("utf-8")
        return None

    def files_of(self, kind, name):
        """{key: bytes} of every key of ConfigMap/Secret name; None when it is missing."""
        obj = self.get(kind, name)
        if obj is None:
            return None
        out = {}
        if kind == "Secret":
            for k, v in (obj.get("data") or {}).items():
                out[k] = base64.b64decode(v)
            for k, v in (obj.get("stringData") or {}).items():
                out[k] = v.encode()
        else:
            for k, v in (obj.get("data") or {}).items():
                out[k] = v.encode()
            for k, v in (obj.get("binaryData") or {}).items():
                out[k] = base64.b64decode(v)
        return out

    def services_for(self, labels):
        """The Services whose selector selects a pod with these labels."""
        out = []
        for s in self.of_kind("Service"):
            sel = (s.get("spec") or {}).get("selector") or {}
            if sel and all(labels.get(k) == v for k, v in sel.items()):
                out.append(s)
        return out


def expand_vars(text, env):
    """Kubernetes' $(VAR) expansion: $(NAME) of a defined variable becomes its value, $$ becomes $,
    anything else stays as written."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


class Pod:
    """One made-up pod of a workload: its volumes as directories here and its container ports as
    free loopback ports. ordinal: a StatefulSet replica's index (its pod name NAME-ORDINAL)."""

    def __init__(self, cluster, obj, template, ordinal=0):
        self.cluster = cluster
        self.obj = obj
        self.template = template
        self.spec = template["spec"]
        name = obj["metadata"]["name"]
        self.name = "%s-%d" % (name, ordinal) if obj["kind"] == "StatefulSet" else name + "-x1y2z"
        self.namespace = cluster.manifests.ns(obj)
        self.labels = (template.get("metadata") or {}).get("labels") or {}
        self.root = tempfile.mkdtemp(prefix="p", dir=cluster.root)
        self.ports = {}      # container port number -> free loopback port
        self.port_names = {}  # port name -> container port number
        for c in pod_containers(self.spec):
            for p in c.get("ports", []):
                n = p["containerPort"]
                self.ports.setdefault(n, free_port())
                if p.get("name"):
                    self.port_names[p["name"]] = n
        self.volume_dirs = {}  # volume name -> directory here
        self.silent = set()    # container ports nothing answered on for a whole wait
        self.mapped_volumes = set()  # ConfigMap volumes whose JSON files were mapped
        self.failures = []

    def loopback(self, container_port):
        """The loopback port of a container port; one is made up for a port no container declares
        (a listener there is then found by nothing, as in the pod)."""
        if container_port not in self.ports:
            self.ports[container_port] = free_port()
        return self.ports[container_port]

    def volume_dir(self, vol_name):
        """The directory of a volume of this pod, made (and filled, for a ConfigMap or Secret) on
        first use; None (and a failure) when the pod has no such volume or its source is missing."""
        if vol_name in self.volume_dirs:
            return self.volume_dirs[vol_name]
        vol = next((v for v in self.spec.get("volumes", []) if v["name"] == vol_name), None)
        claims = [t["metadata"]["name"] for t in (self.obj.get("spec") or {}).get("volumeClaimTemplates", [])]
        path = os.path.join(self.root, "v%d" % len(self.volume_dirs))
        os.makedirs(path)
        if vol is None and vol_name not in claims:
            self.failures.append("%s: volume %r is mounted but the pod has no such volume" % (self.name, vol_name))
            return None
        sources = []
        if vol is not None:
            if "configMap" in vol:
                sources.append(("ConfigMap", vol["configMap"]["name"], vol["configMap"]))
            elif "secret" in vol:
                sources.append(("Secret", vol["secret"]["secretName"], vol["secret"]))
            elif "projected" in vol:
                for s in vol["projected"].get("sources", []):
                    if "configMap" in s:
                        sources.append(("ConfigMap", s["configMap"]["name"], s["configMap"]))
                    elif "secret" in s:
                        sources.append(("Secret", s["secret"]["name"], s["secret"]))
            # emptyDir, persistentVolumeClaim, ...: an empty directory
        self.volume_dirs[vol_name] = path
        for kind, name, src in sources:
            files = self.cluster.manifests.files_of(kind, name)
            if files is None:
                if not src.get("optional"):
                    self.failures.append("%s: volume %r: %s %r is not in the manifests" % (
                        self.name, vol_name, kind, name))
                continue
            items = src.get("items")
            pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in files]
            for key, rel in pairs:
                if key not in files:
                    self.failures.append("%s: volume %r: %s %r has no key %r" % (self.name, vol_name, kind, name, key))
                    continue
                dest = os.path.join(path, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "wb") as f:
                    f.write(files[key])
        return path

    def field(self, path):
        """A fieldRef's value in the made-up pod."""
        values = {"metadata.name": self.name, "metadata.namespace": self.namespace, "spec.nodeName": NODE_NAME,
                  "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1",
                  "spec.serviceAccountName": self.spec.get("serviceAccountName", "default")}
        m = re.match(r"metadata\.(labels|annotations)\['(.*)'\]$", path)
        if m:
            return ((self.template.get("metadata") or {}).get(m.group(1)) or {}).get(m.group(2), "")
        return values.get(path)


class Container:
    """One container of a Pod, mapped to run here."""

    def __init__(self, pod, spec, image_workdir=None):
        self.pod = pod
        self.spec = spec
        self.name = "%s/%s" % (pod.name, spec["name"])
        self.failures = pod.failures
        self.namespace = pod.namespace
        self.resolved = []  # the pods of the Service names its arguments and files named
        self.listens = set()  # the loopback ports of the listen addresses its arguments and files name
        self.mounts = []  # (mountPath, directory here), longest mountPath first
        for m in spec.get("volumeMounts", []):
            d = pod.volume_dir(m["name"])
            if d is None:
                continue
            if m.get("subPath"):
                d = os.path.join(d, m["subPath"])
                os.makedirs(d, exist_ok=True)
            self.mounts.append((m["mountPath"].rstrip("/") or "/", d))
        self.mounts.sort(key=lambda x: -len(x[0]))
        self.env = self._env()
        self.workdir = self._workdir(image_workdir)
        self.map_config_files()
        self.proc = None
        self.log_path = None

    def _env(self):
        env = {}
        m = self.pod.cluster.manifests
        for src in self.spec.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in src:
                    files = m.files_of(kind, src[key]["name"])
                    if files is None and not src[key].get("optional"):
                        self.failures.append("%s: envFrom %s %r is not in the manifests" % (
                            self.name, kind, src[key]["name"]))
                    for k, v in (files or {}).items():
                        env[src.get("prefix", "") + k] = v.decode()
        for e in self.spec.get("env", []):
            name = e["name"]
            if "valueFrom" not in e:
                env[name] = expand_vars(str(e.get("value", "")), env)
                continue
            vf = e["valueFrom"]
            value = None
            for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                if key in vf:
                    ref = vf[key]
                    value = m.key_of(kind, ref["name"], ref["key"])
                    if value is None and not ref.get("optional"):
                        self.failures.append("%s: env %s: %s %r has no key %r" % (
                            self.name, name, kind, ref["name"], ref["key"]))
            if "fieldRef" in vf:
                value = self.pod.field(vf["fieldRef"]["fieldPath"])
                if value is None:
                    self.failures.append("%s: env %s: fieldRef %s is not known here" % (
                        self.name, name, vf["fieldRef"]["fieldPath"]))
            if "resourceFieldRef" in vf:
                value = "1"
            if value is not None:
                env[name] = value
        return env

    def _workdir(self, image_workdir):
        """The directory the process starts in: workingDir or the image's WORKDIR, mapped; a
        directory nobody may write to when it is not on a volume (readOnlyRootFilesystem)."""
        wd = self.spec.get("workingDir") or image_workdir
        if wd:
            mapped = self.map_path(wd)
            if mapped != wd:
                os.makedirs(mapped, exist_ok=True)
                return mapped
        ro = os.path.join(self.pod.root, "rootfs-" + self.spec["name"])
        os.makedirs(ro, exist_ok=True)
        os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR)
        return ro

    def map_path(self, text):
        for mount, d in self.mounts:
            if text == mount:
                return d
            if text.startswith(mount + "/"):
                return d + text[len(mount):]
        return text

    def map_value(self, text):
        """One string of the container (an argument, an env value, a JSON string in a mounted
        ConfigMap file) as it must read here; see the module's comment."""
        if text.startswith("--") and "=" in text:
            flag, value = text.split("=", 1)
            return flag + "=" + self.map_value(value)
        m = re.fullmatch(r"(0\.0\.0\.0|\[::\]):(\d+)", text)
        if m:
            self.listens.add(self.pod.loopback(int(m.group(2))))
            return "127.0.0.1:%d" % self.pod.loopback(int(m.group(2)))
        m = re.fullmatch(r"(dns:///|dns:|https?://)?([A-Za-z0-9.-]+):(\d+)(/.*)?", text)
        if m:
            target = self.pod.cluster.resolve(m.group(2), int(m.group(3)), self)
            if target:
                return "%s%s%s" % (m.group(1) or "", target, m.group(4) or "")
        if text.startswith(IMAGE_BIN) and os.path.basename(text) in BUILD_BINARIES:
            return os.path.join(self.pod.cluster.build, BUILD_BINARIES[os.path.basename(text)])
        return self.map_path(text)

    def map_config_files(self):
        """Listen addresses, Service names and paths in the JSON files of ConfigMap volumes, mapped
        as arguments are."""
        def walk(v):
            if isinstance(v, str):
                return self.map_value(v)
            if isinstance(v, list):
                return [walk(x) for x in v]
            if isinstance(v, dict):
                return {k: walk(x) for k, x in v.items()}
            return v
        for m in self.spec.get("volumeMounts", []):
            vol = next((v for v in self.pod.spec.get("volumes", []) if v["name"] == m["name"]), None)
            if not vol or "configMap" not in vol:
                continue
            if m["name"] in self.pod.mapped_volumes:
                continue
            self.pod.mapped_volumes.add(m["name"])
            d = self.pod.volume_dirs.get(m["name"])
            for dirpath, _, names in os.walk(d or ""):
                for n in names:
                    p = os.path.join(dirpath, n)
                    try:
                        with open(p) as f:
                            doc = json.load(f)
                    except (ValueError, UnicodeDecodeError):
                        continue
                    with open(p, "w") as f:
                        json.dump(walk(doc), f)

    def argv(self):
        """command + args, expanded and mapped; None (and a failure) without a command."""
        cmd = self.spec.get("command")
        if not cmd:
            self.failures.append("%s: no command (the chart's containers give command and args explicitly)" % self.name)
            return None
        words = [expand_vars(str(w), self.env) for w in cmd + (self.spec.get("args") or [])]
        for w in words:
            if re.search(r"\$\([A-Za-z_][A-Za-z0-9_.-]*\)", w):
                self.failures.append("%s: %r names a variable the container does not define" % (self.name, w))
        exe = image_path(words[0])
        if not exe or not exe.startswith(IMAGE_BIN) or os.path.basename(exe) not in BUILD_BINARIES:
            self.failures.append("%s: command %r is not one of the image's binaries %s" % (
                self.name, words[0], ", ".join(IMAGE_BIN + b for b in BUILD_BINARIES)))
            return None
        mapped = [self.map_value(exe)] + [self.map_value(w) for w in words[1:]]
        # A host name left after mapping names nothing the manifests define: in the cluster it would
        # not resolve to prismd, and here it must not be looked up at all (loopback only).
        for w in mapped:
            value = w.split("=", 1)[1] if w.startswith("--") and "=" in w else w
            m = re.fullmatch(r"(?:dns:///|dns:|https?://)?([A-Za-z0-9.-]*[A-Za-z][A-Za-z0-9.-]*):(\d+)(/.*)?", value)
            if m and m.group(1) != "localhost":
                self.failures.append("%s: %r: %s names no Service of the manifests" % (self.name, w, m.group(1)))
                return None
        return mapped

    def unwritable(self):
        """A path where nothing can be created, root included (the tests may run as root, who
        ignores directory permissions): a name under a regular file (ENOTDIR)."""
        blocker = os.path.join(self.pod.root, "rootfs-file-" + self.spec["name"])
        if not os.path.exists(blocker):
            with open(blocker, "w") as f:
                f.write("the container's read-only root filesystem\n")
        return os.path.join(blocker, "ro")

    def environment(self, extra_env=None):
        """The process's environment: the container's env (mapped), and the image's HOME and
        /tmp as readOnlyRootFilesystem leaves them: HOME (IMAGE_HOME) and TMPDIR are their
        mounts' directories when a volume is mounted there, else a path where nothing can be
        created, so that a binary writing its home or a temporary file (through TMPDIR, as
        mkstemp users and SQLite do) fails here as in the pod. (A binary that writes a literal
        /tmp path, or glibc's tmpfile(), which ignores TMPDIR, is not caught: that would take a
        mount namespace.)"""
        home, tmp = self.map_path(IMAGE_HOME), self.map_path("/tmp")
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "HOME": home if home != IMAGE_HOME else self.unwritable(),
               "TMPDIR": tmp if tmp != "/tmp" else self.unwritable()}
        for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"):
            if k in os.environ:
                env[k] = os.environ[k]
        env.update({k: self.map_value(v) for k, v in self.env.items()})
        env.update(extra_env or {})
        return env

    def start(self, extra_env=None):
        """Starts the container's process (stderr and stdout to a log file); False (and a failure)
        when it cannot be started."""
        argv = self.argv()
        if argv is None:
            return False
        env = self.environment(extra_env)
        self.argv_run = argv
        print("podrun: %s runs %s" % (self.name, " ".join(argv)), file=sys.stderr, flush=True)
        self.log_path = os.path.join(self.pod.root, self.spec["name"] + ".log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.pod.cluster.processes.append(self.proc)
        self.pod.cluster.containers.append(self)
        return True

    def log_tail(self, lines=8):
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()

    def exited(self):
        """A failure naming the exit status and the log's end when the process has ended, else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return "%s: %s exited with status %d: %s" % (self.name, os.path.basename(self.argv_run[0]),
                                                    self.proc.returncode, self.log_tail())

    def port_number(self, port):
        return port_number(self.spec, port)

    def never_listened(self, loopback_port):
        """True once it is settled that nothing of this container will listen on loopback_port: no
        listen address of its arguments or files names it and every one that does accepts
        connections (the binaries bind all their listeners at start). False while undecided."""
        return bool(self.listens) and loopback_port not in self.listens and \
            all(tcp_open(p) for p in self.listens)

    def check_probes(self, on_ok=None):
        """Every probe of the container answers as the kubelet wants it (httpGet: 200 within a
        bounded wait; a 404 is final: the path does not exist); failures named. on_ok(path,
        container port, path, status, body, headers) is called for each answer that passed."""
        failures = []
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = self.spec.get(kind)
            if not probe:
                continue
            if self.exited():
                return failures + [self.exited()]  # said once: no probe of an ended process answers
            if "httpGet" in probe:
                g = probe["httpGet"]
                if g.get("scheme", "HTTP") != "HTTP":
                    failures.append("%s: %s uses scheme %s (the probes are served over HTTP)" % (
                        self.name, kind, g["scheme"]))
                    continue
                number = self.port_number(g["port"])
                if number is None:
                    failures.append("%s: %s's port %r is not a port of the container" % (self.name, kind, g["port"]))
                    continue
                last = [None, "", {}]

                def answered():
                    gone = self.exited()
                    if gone:
                        return gone
                    answer = {}
                    status, body = http_get(self.pod.loopback(number), g.get("path", "/"), g.get("httpHeaders"),
                                            answer=answer)
                    last[:] = [status, body, answer.get("headers", {})]
                    if status is None and self.never_listened(self.pod.loopback(number)):
                        return NEVER
                    return status in (200, 404)
                # A port found silent for a whole wait is not waited for again.
                got = None if number in self.pod.silent else bounded_wait(answered)
                if last[0] is None:
                    self.pod.silent.add(number)
                if isinstance(got, str):
                    failures.append(got)
                elif last[0] == 200:
                    if on_ok:
                        on_ok(number, g.get("path", "/"), last[0], last[1], last[2])
                else:
                    failures.append("%s: %s GET %s on port %r (container port %d) answered %s, not 200%s" % (
                        self.name, kind, g.get("path", "/"), g["port"], number,
                        last[0] if last[0] is not None else "nothing (%s)" % last[1],
                        ": " + last[1].strip()[:200] if last[0] else ""))
            elif "tcpSocket" in probe:
                number = self.port_number(probe["tcpSocket"]["port"])

                def accepts():
                    port = self.pod.loopback(number)
                    return tcp_open(port) or (NEVER if self.never_listened(port) else False)
                if number is None or bounded_wait(accepts) in (None, NEVER):
                    failures.append("%s: %s tcpSocket port %r: nothing listens" % (
                        self.name, kind, probe["tcpSocket"]["port"]))
            else:
                failures.append("%s: %s is neither httpGet nor tcpSocket: %s" % (self.name, kind, json.dumps(probe)))
        return failures

    def check_ports(self):
        """Every declared container port accepts connections (a listener on another port than
        the one declared leaves it closed)."""
        failures = []
        for p in self.spec.get("ports", []):
            n = p["containerPort"]
            if self.exited():
                return failures + [self.exited()]

            def listening():
                port = self.pod.loopback(n)
                return self.exited() or tcp_open(port) or (NEVER if self.never_listened(port) else False)
            got = None if n in self.pod.silent else bounded_wait(listening)
            if isinstance(got, str):
                failures.append(got)
            elif got in (None, NEVER):
                self.pod.silent.add(n)
                failures.append("%s: containerPort %d%s: nothing listens on it" % (
                    self.name, n, " (%s)" % p["name"] if p.get("name") else ""))
        return failures

    def stop(self):
        """SIGTERM, a bounded wait, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        return self.proc.returncode


class Cluster:
    """The pods made of one rendered stream, their Services resolved to loopback. Use as a context
    manager: every process it started is killed and its directory removed on exit."""

    def __init__(self, docs, build, namespace=None):
        self.manifests = Manifests(docs, namespace)
        self.build = build
        self.root = tempfile.mkdtemp(prefix="prism-pods-")
        self.pods = []
        self.containers = []  # those started
        self.processes = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Every process started ends (SIGTERM, a bounded wait, SIGKILL to its process group);
        the directories go."""
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=15)
        shutil.rmtree(self.root, ignore_errors=True)

    def pod(self, obj, template, ordinal=0):
        p = Pod(self, obj, template, ordinal)
        self.pods.append(p)
        return p

    def resolve(self, host, port, client):
        """127.0.0.1:LOOPBACK for a Service's DNS name and port, through the Service's targetPort to
        the serving pod's container port; None when host names no Service of the manifests. A
        Service port that leads nowhere is a failure of client (the Container asking) and resolves
        to a loopback port nothing serves.

        A pod's own name, POD.SERVICE.NS.svc..., is its DNS record under a headless Service: it
        resolves to the pod's IP, so PORT is the pod's port itself, with no Service port between
        (resolve_pod)."""
        parts = host.split(".")
        for svc in self.manifests.of_kind("Service"):
            name, ns = svc["metadata"]["name"], self.manifests.ns(svc)
            names = ["%s.%s" % (name, ns), "%s.%s.svc" % (name, ns), "%s.%s.svc.cluster.local" % (name, ns)]
            if ns == client.namespace:
                names.append(name)
            pod_name = None
            if host in names:
                pass
            elif len(parts) > 1 and ".".join(parts[1:]) in names:
                pod_name = parts[0]
            else:
                continue
            if pod_name:
                return self.resolve_pod(svc, pod_name, host, port, client)
            what = "%s:%d (Service %s)" % (host, port, name)
            sport = next((p for p in svc["spec"].get("ports", []) if p["port"] == port), None)
            if sport is None:
                client.failures.append("%s: %s: the Service has no port %d" % (client.name, what, port))
                return "127.0.0.1:%d" % free_port()
            sel = svc["spec"].get("selector") or {}
            for pod in self.pods:
                if not sel or not all(pod.labels.get(k) == v for k, v in sel.items()):
                    continue
                target = sport.get("targetPort", sport["port"])
                number = next((n for n in (port_number(c, target) for c in pod_containers(pod.spec))
                               if n is not None), None)
                if number is None:
                    client.failures.append("%s: %s: targetPort %r is no container port of %s" % (
                        client.name, what, target, pod.name))
                    return "127.0.0.1:%d" % free_port()
                client.resolved.append(pod)
                return "127.0.0.1:%d" % pod.loopback(number)
            client.failures.append("%s: %s selects no pod that runs here" % (client.name, what))
            return "127.0.0.1:%d" % free_port()
        return None

    def resolve_pod(self, svc, pod_name, host, port, client):
        """127.0.0.1:LOOPBACK of pod_name's port `port` (the pod's IP: no Service port lookup).
        Kubernetes gives a pod such a record only under a headless Service (clusterIP None) that
        is its StatefulSet's spec.serviceName and selects it: anything else is a failure of client
        and resolves to a port nothing serves. A port no container of the pod declares is one too
        (the manifests declare every port their binaries listen on; nothing would answer there)."""
        name = svc["metadata"]["name"]
        what = "%s:%d (pod %s under Service %s)" % (host, port, pod_name, name)
        nowhere = "127.0.0.1:%d" % free_port()
        if (svc["spec"].get("clusterIP") or "") != "None":
            client.failures.append("%s: %s: Service %s is not headless (clusterIP None): pods have no DNS "
                                   "records under it" % (client.name, what, name))
            return nowhere
        sel = svc["spec"].get("selector") or {}
        for pod in self.pods:
            if pod.name != pod_name or pod.namespace != self.manifests.ns(svc):
                continue
            if pod.obj["kind"] != "StatefulSet" or pod.obj["spec"].get("serviceName") != name:
                client.failures.append("%s: %s: %s's serviceName is %r, not %r: the pod has no DNS record "
                                       "under it" % (client.name, what, pod.obj["metadata"]["name"],
                                                     pod.obj["spec"].get("serviceName"), name))
                return nowhere
            if not sel or not all(pod.labels.get(k) == v for k, v in sel.items()):
                client.failures.append("%s: %s: the Service does not select pod %s" % (client.name, what, pod_name))
                return nowhere
            declared = [p["containerPort"] for c in pod_containers(pod.spec) for p in c.get("ports", [])]
            if port not in declared:
                client.failures.append("%s: %s: port %d is no container port of pod %s (it has %s); a pod's "
                                       "DNS name takes the pod's port, not a Service port" % (
                                           client.name, what, port, pod_name, sorted(declared)))
                return nowhere
            client.resolved.append(pod)
            return "127.0.0.1:%d" % pod.loopback(port)
        client.failures.append("%s: %s: no pod %s runs here" % (client.name, what, pod_name))
        return nowhere

    def check_services(self, pod):
        """Every port of every Service selecting the pod reaches a declared container port."""
        failures = []
        for svc in self.manifests.services_for(pod.labels):
            for sp in svc["spec"].get("ports", []):
                target = sp.get("targetPort", sp["port"])
                declared = [p for c in pod_containers(pod.spec) for p in c.get("ports", [])]
                ok = any(p.get("name") == target or str(p["containerPort"]) == str(target) for p in declared)
                if not ok:
                    failures.append("Service %s port %s (%d): targetPort %r is no container port of %s" % (
                        svc["metadata"]["name"], sp.get("name", ""), sp["port"], target, pod.name))
        return failures


def trainer_script():
    """A trainer on libprism's Python binding: PRISM_AGENT_DIR and PRISM_JOB_ID from its
    environment (libprism reads them), rank and world size from PRISM_RANK and PRISM_WORLD_SIZE
    (the test's, from the example trainer's --rank and --world); one step report per step until
    its stdin closes or 120 s pass. Prints "connected" once a report went to the agent."""
    return r"""
import os, select, sys
import prism
c = prism.Client(rank=int(os.environ.get("PRISM_RANK", "0")), world_size=int(os.environ.get("PRISM_WORLD_SIZE", "1")),
                 reconnect_interval_ms=50)
c.register("pods-run", [("b0", [(4, 4)]), ("b1", [(4, 4)])])
stats = [{"l2_norm": 1.0, "max_abs": 1.0, "mean": 0.0, "variance": 0.01, "numel": 16, "nonfinite": 0}] * 2
said = False
for step in range(1200):
    c.begin_step(step)
    if c.report_stats(step, stats) and not said:
        print("connected", flush=True)
        said = True
    # One step per 100 ms, and stop as soon as the test closes stdin.
    if select.select([sys.stdin], [], [], 0.1)[0] and not sys.stdin.read(1):
        break
c.close()
"""
