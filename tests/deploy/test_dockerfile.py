#!/usr/bin/python3
"""The Dockerfile, checked without building the image (issue 14, item 8): no container registry
is reachable here, so what a build and a run would show is checked against the built binaries
(PRISM_BUILD_DIR), this Debian 12's package database, the Helm chart's renders and the kustomize
base:

- every binary a container of the prism image runs (chart, default and ci/full-values.yaml, and
  the kustomize base) is one the Dockerfile installs at that path;
- every shared library `ldd` lists for the built prismd, prismctl and prism-agent belongs
  (`dpkg -S`) to a package the runtime stage installs, to one apt brings with them (their
  Depends, read from dpkg's database), or to debian:12-slim's own (BASE_PACKAGES); and the
  packages of the libraries the binaries link directly are named in the Dockerfile;
- the image's user is the chart's runAsUser/runAsGroup/fsGroup; EXPOSE is prismd's container
  ports; WORKDIR and VOLUME are prismd's data volume's mountPath;
- the build stage runs scripts/install-deps.sh after copying what it reads (scripts/, web's
  package.json and lockfile), configures as scripts/test.sh's Release build does (only
  PRISM_CUDA and PRISM_BENCH added), builds exactly the targets whose binaries it installs, and
  those targets exist in the build;
- ENTRYPOINT is the chart's prismd command, CMD's arguments are among the chart's, and the
  image's default command, run here as the pods test runs containers (tests/deploy/podrun.py),
  answers the chart's probes with 200;
- no comment says "to come".

Environment: as tests/deploy/test_pods_run.py (PRISM_BUILD_DIR, PRISM_SOURCE_DIR,
PRISM_HELM_CHART, PRISM_HELM_RENDER, PRISM_K8S_DIR, PRISM_KUBECTL)."""

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import podrun  # noqa: E402
import test_pods_run as pods  # noqa: E402

BUILD, SOURCE, CHART = pods.BUILD, pods.SOURCE, pods.CHART
DOCKERFILE = os.path.join(SOURCE, "Dockerfile")
# Packages of debian:12-slim itself that the binaries' libraries belong to: the C library, and
# zlib1g, libgcc-s1 and libstdc++6, which dpkg, libc6 and apt (all in the slim image) depend on.
BASE_PACKAGES = {"libc6", "zlib1g", "libgcc-s1", "libstdc++6"}
# The -D options the image's build adds to scripts/test.sh's Release build, and why: no CUDA
# toolkit in the image (the service needs no GPU; prism-agent then profiles the CPU), and the
# benchmarks are not installed.
IMAGE_BUILD_OPTIONS = {"-DPRISM_CUDA=OFF", "-DPRISM_BENCH=OFF"}
# The library check needs binaries linked as the image's are: a Release build without sanitizers
# (a Debug or sanitized build links other libraries, and more of them directly), as CI's build/ is.
# CUDA's libraries, which CI's build/ links where nvcc is found and the image's build does not, are
# left out of it, with what only they bring.
IMAGE_CACHE = {"CMAKE_BUILD_TYPE": "Release", "PRISM_SANITIZE": "OFF", "PRISM_TSAN": "OFF", "PRISM_CUDAEMU": "OFF"}
NOT_THE_IMAGES = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvidia-ml)\.so")


def instructions(path):
    """[(stage index, INSTRUCTION, text)] of a Dockerfile, continuation lines joined, comments
    dropped; and the comments."""
    out, comments, stage, buf = [], [], -1, ""
    with open(path) as f:
        for line in f:
            s = line.rstrip("\n")
            if s.lstrip().startswith("#"):
                comments.append(s.strip())
                continue
            buf += s.rstrip("\\").rstrip() + " " if s.endswith("\\") else s
            if s.endswith("\\"):
                continue
            if buf.strip():
                word, _, rest = buf.strip().partition(" ")
                if word.upper() == "FROM":
                    stage += 1
                out.append((stage, word.upper(), rest.strip()))
            buf = ""
    return out, comments


class Dockerfile:
    def __init__(self, path=DOCKERFILE):
        self.all, self.comments = instructions(path)
        self.last = max(s for s, _, _ in self.all)

    def of(self, word, stage=None):
        return [t for s, w, t in self.all if w == word and (stage is None or s == stage)]

    def runtime(self, word):
        return self.of(word, self.last)

    def exec_form(self, word):
        texts = self.runtime(word)
        return json.loads(texts[-1]) if texts else None

    def installed(self):
        """{path in the image: source in the build stage} of the runtime stage's COPY --from."""
        out = {}
        for text in self.runtime("COPY"):
            words = shlex.split(text)
            if not words[0].startswith("--from="):
                continue
            srcs, dest = words[1:-1], words[-1]
            for src in srcs:
                out[os.path.join(dest, os.path.basename(src)) if dest.endswith("/") else dest] = src
        return out

    def apt_packages(self):
        """The packages the runtime stage's apt-get install names."""
        pkgs = []
        for text in self.runtime("RUN"):
            for part in re.split(r"&&|;", text):
                words = shlex.split(part)
                if "apt-get" in words and "install" in words:
                    pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        return pkgs


@functools.lru_cache(maxsize=None)
def owner(path):
    """The Debian package that ships the library at path (as ldd resolved it), by dpkg -S; Debian 12
    lists /lib files under /lib even where /lib is a link to /usr/lib."""
    real = os.path.realpath(path)
    candidates = [real, path]
    for p in list(candidates):
        if p.startswith("/usr/lib/"):
            candidates.append(p[len("/usr"):])
    for p in candidates:
        r = subprocess.run(["dpkg", "-S", p], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode == 0:
            return r.stdout.split(":", 1)[0].strip()
    return None


@functools.lru_cache(maxsize=None)
def installed_here(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return r.stdout.strip() == "install ok installed"


def depends_closure(pkgs):
    """The packages apt installs for pkgs: them and their Depends and Pre-Depends, recursively, as
    dpkg's database here (Debian 12) records them; of alternatives, those installed here."""
    seen, pending = set(), list(pkgs)
    while pending:
        p = pending.pop()
        if p in seen:
            continue
        seen.add(p)
        r = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", p], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        for clause in r.stdout.split(","):
            alts = [re.sub(r"\(.*?\)|:any|\[.*?\]", "", a).strip() for a in clause.split("|")]
            alts = [a for a in alts if a]
            pending += [a for a in alts if installed_here(a)] or alts[:1]
    return seen


@functools.lru_cache(maxsize=None)
def ldd(binary):
    """{soname: resolved path} of every library ldd lists; missing ones as None."""
    r = subprocess.run(["ldd", binary], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (\S+|not found)", line)
        if m:
            out[m.group(1)] = None if m.group(2) == "not found" else m.group(2)
        elif re.match(r"\s*/\S+ \(0x", line):
            p = line.split()[0]
            out[os.path.basename(p)] = p
    return out


@functools.lru_cache(maxsize=None)
def needed(binary):
    r = subprocess.run(["readelf", "-d", binary], stdout=subprocess.PIPE, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.*?)\]", r.stdout)


def library_failures(listed):
    """What a runtime stage installing the packages listed would lack for the built binaries: a
    library ldd lists whose package neither it, apt for it, nor debian:12-slim installs, or a
    directly linked library whose package it does not name."""
    failures = []
    closure = depends_closure(set(listed)) | BASE_PACKAGES
    for name, rel in podrun.BUILD_BINARIES.items():
        binary = os.path.join(BUILD, rel)
        libs = ldd(binary)
        for soname, path in libs.items():
            if soname.startswith("linux-vdso") or soname not in image_libs(binary):
                continue
            pkg = owner(path) if path else None
            if path is None:
                failures.append("%s: ldd: %s not found" % (name, soname))
            elif pkg is None:
                failures.append("%s: %s (%s) belongs to no Debian package" % (name, soname, path))
            elif pkg not in closure:
                failures.append("%s: %s is in package %s, which the runtime stage does not install (apt-get "
                                "install %s)" % (name, soname, pkg, " ".join(listed)))
        for soname in needed(binary):
            if NOT_THE_IMAGES.match(soname):
                continue
            pkg = owner(libs[soname]) if libs.get(soname) else None
            if pkg and pkg in closure and pkg not in set(listed) | BASE_PACKAGES:
                failures.append("%s links %s directly: name its package %s in the runtime stage's apt-get "
                                "install" % (name, soname, pkg))
    return failures


@functools.lru_cache(maxsize=None)
def image_libs(binary):
    """The sonames the binary loads as the image's build makes it: what it needs (readelf NEEDED),
    and what those need, recursively (paths as ldd resolves them), leaving out NOT_THE_IMAGES and
    what only they bring (libasan's libatomic, ...). The dynamic loader itself is always in."""
    libs = ldd(binary)
    seen = {s for s in libs if s.startswith("ld-linux")}
    pending = list(needed(binary))
    while pending:
        soname = pending.pop()
        if soname in seen or NOT_THE_IMAGES.match(soname):
            continue
        seen.add(soname)
        if libs.get(soname):
            pending += needed(libs[soname])
    return frozenset(seen)


def prism_image_containers(docs):
    """(where, container) of every container that runs the prism image (repository "prism")."""
    out = []
    for obj, tmpl in podrun.Manifests(docs).workloads():
        for c in podrun.pod_containers(tmpl["spec"]) + list(tmpl["spec"].get("initContainers", [])):
            repo = c.get("image", "").rsplit(":", 1)[0]
            if repo.rsplit("/", 1)[-1] == "prism":
                out.append(("%s %s/%s" % (obj["kind"], obj["metadata"]["name"], c["name"]), tmpl, c))
    return out


class DockerfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.df = Dockerfile()
        cls.renders = {"chart (default values)": pods.render_chart(),
                       "chart (ci/full-values.yaml)": pods.render_chart(os.path.join(CHART, "ci", "full-values.yaml")),
                       "kustomize base": pods.kustomize()}

    def test_no_comment_says_to_come(self):
        self.assertEqual([c for c in self.df.comments if "to come" in c.lower()], [])

    def test_every_binary_the_containers_run_is_installed_there(self):
        installed = self.df.installed()
        self.assertEqual(sorted(installed), sorted(podrun.IMAGE_BIN + b for b in podrun.BUILD_BINARIES))
        for name, docs in self.renders.items():
            containers = prism_image_containers(docs)
            self.assertTrue(containers, name)
            for where, _, c in containers:
                path = podrun.image_path((c.get("command") or [""])[0])
                self.assertIn(path, installed, "%s: %s runs %r, which the image does not install" % (
                    name, where, c.get("command")))

    def test_every_library_of_the_binaries_is_in_the_runtime_stage(self):
        self.assertEqual(self.df.runtime("FROM"), ["debian:12-slim"])
        cache = {}
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(r"(\w+):\w+=(.*)$", line.strip())
                if m:
                    cache[m.group(1)] = m.group(2)
        differs = {k: cache.get(k, "OFF") for k, v in IMAGE_CACHE.items() if cache.get(k, "OFF").upper() != v.upper()}
        if differs:
            self.skipTest("%s is not configured as the image's build (%s): its binaries link other libraries" % (
                BUILD, ", ".join("%s=%s" % kv for kv in sorted(differs.items()))))
        other = sorted({s for rel in podrun.BUILD_BINARIES.values() for s in ldd(os.path.join(BUILD, rel))
                        if NOT_THE_IMAGES.match(s)})
        if other:
            print("test_dockerfile: %s links CUDA, which the image's build does not: %s left out of the library "
                  "check" % (BUILD, ", ".join(other)), file=sys.stderr)
        listed = self.df.apt_packages()
        for p in listed:
            self.assertTrue(installed_here(p), "%s: not a package of this Debian 12 (dpkg-query)" % p)
        self.assertEqual(library_failures(listed), [])
        # The check itself: without libcurl4, prismctl's libcurl and what only it brings are missing.
        failures = library_failures([p for p in listed if p != "libcurl4"])
        self.assertIn("prismctl: libcurl.so.4 is in package libcurl4, which the runtime stage does not install",
                      "\n".join(failures))
        self.assertTrue(all(f.startswith("prismctl: ") for f in failures), failures)

    def test_the_user_is_the_charts(self):
        user = self.df.runtime("USER")
        self.assertEqual(len(user), 1)
        uid, _, gid = user[0].partition(":")
        self.assertTrue(uid.isdigit() and gid.isdigit(), "USER %s: numeric uid:gid (runAsNonRoot checks it)" % user[0])
        run = " ".join(self.df.runtime("RUN"))
        self.assertRegex(run, r"useradd [^&]*--uid %s\b" % uid)
        self.assertRegex(run, r"groupadd [^&]*--gid %s\b" % gid)
        for name, docs in self.renders.items():
            for where, tmpl, c in prism_image_containers(docs):
                ctx = dict(tmpl["spec"].get("securityContext") or {}, **(c.get("securityContext") or {}))
                self.assertEqual((ctx.get("runAsUser"), ctx.get("runAsGroup"), ctx.get("runAsNonRoot")),
                                 (int(uid), int(gid), True), "%s: %s" % (name, where))
                self.assertEqual(tmpl["spec"]["securityContext"].get("fsGroup"), int(gid), "%s: %s" % (name, where))

    def test_expose_workdir_and_volume_are_prismds(self):
        exposed = sorted(int(p.split("/")[0]) for t in self.df.runtime("EXPOSE") for p in t.split())
        (workdir,) = self.df.runtime("WORKDIR")
        volume = self.df.exec_form("VOLUME")
        for name, docs in self.renders.items():
            _, _, c = podrun.Manifests(docs).find_container("prismd", "StatefulSet")
            self.assertEqual(exposed, sorted(p["containerPort"] for p in c["ports"]), name)
            data = pods.flag_value(c["args"], "--data-dir")
            self.assertIn(data, [m["mountPath"] for m in c["volumeMounts"]], name)
            self.assertEqual((workdir, volume), (data, [data]), name)

    def test_the_build_stage_runs_cis_commands_for_the_installed_targets(self):
        build_runs = self.df.of("RUN", 0)
        copies = self.df.of("COPY", 0)
        install_deps = next(i for i, r in enumerate(build_runs) if "scripts/install-deps.sh" in r)
        self.assertIn("bash /src/scripts/install-deps.sh", build_runs[install_deps])
        # What install-deps reads (itself, web's package.json and lockfile for npm ci) is copied first.
        self.assertIn("scripts/ /src/scripts/", copies[0])
        self.assertIn("web/package.json web/package-lock.json /src/web/", copies[1])
        cmake = [p.strip() for r in build_runs for p in r.split("&&") if p.strip().startswith("cmake")]
        configure = next(shlex.split(c) for c in cmake if " -S " in c)
        build = next(shlex.split(c) for c in cmake if "--build" in c)
        # scripts/test.sh's Release build: run_build build build "" OPTIONS...
        with open(os.path.join(SOURCE, "scripts", "test.sh")) as f:
            m = re.search(r'^run_build build build "" (.*?) \|\|', f.read(), re.M)
        ci = set(shlex.split(m.group(1)))
        self.assertEqual(set(w for w in configure if w.startswith("-D")), ci | IMAGE_BUILD_OPTIONS)
        targets = build[build.index("--target") + 1:]
        self.assertEqual(sorted(targets), sorted(podrun.BUILD_BINARIES))
        install = next(shlex.split(p.strip()) for r in build_runs for p in r.split("&&")
                       if p.strip().startswith("install"))
        build_dir = configure[configure.index("-B") + 1]
        self.assertEqual(sorted(w for w in install if w.startswith(build_dir + "/")),
                         sorted(os.path.join(build_dir, rel) for rel in podrun.BUILD_BINARIES.values()))
        sources = self.df.installed().values()
        self.assertEqual(sorted(os.path.basename(s) for s in sources), sorted(podrun.BUILD_BINARIES))
        # The targets exist in a build configured from this tree.
        r = subprocess.run(["cmake", "--build", BUILD, "--target", "help"], stdout=subprocess.PIPE, text=True,
                           check=True)
        for t in targets:
            self.assertRegex(r.stdout, r"\.\.\. %s\b" % re.escape(t))

    def test_the_default_command_is_the_charts_and_answers_its_probes(self):
        entrypoint, cmd = self.df.exec_form("ENTRYPOINT"), self.df.exec_form("CMD")
        for name, docs in self.renders.items():
            _, _, c = podrun.Manifests(docs).find_container("prismd", "StatefulSet")
            self.assertEqual([podrun.image_path(entrypoint[0])] + entrypoint[1:],
                             [podrun.image_path(c["command"][0])] + c["command"][1:], name)
            self.assertEqual([a for a in cmd if a not in c["args"]], [], name)
        # The image's own command, as a pod without the chart's files would run it: prismd's
        # container of the chart with command and args from the Dockerfile, its data volume only.
        docs = self.renders["chart (default values)"]
        obj, tmpl, c = podrun.Manifests(docs).find_container("prismd", "StatefulSet")
        data = pods.flag_value(c["args"], "--data-dir")
        tmpl = {"metadata": tmpl.get("metadata"), "spec": {"volumes": [{"name": "image-volume", "emptyDir": {}}]}}
        spec = {"name": "image-default", "command": entrypoint, "args": cmd, "ports": c["ports"],
                "volumeMounts": [{"name": "image-volume", "mountPath": data}],
                **{k: c[k] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in c}}
        tmpl["spec"]["containers"] = [spec]
        for attempt in range(3):  # again on other ports when one was taken meanwhile (as test_pods_run)
            with podrun.Cluster([obj], BUILD, pods.NAMESPACE) as cluster:
                container = podrun.Container(cluster.pod(obj, tmpl), spec, self.df.runtime("WORKDIR")[0])
                failures = list(container.pod.failures)
                if container.start():
                    failures += container.check_probes(pods.check_openapi({podrun.port_number(spec, "http")}))
                    failures += container.check_ports()
                failures = pods.unique(failures + container.pod.failures)
                if any(podrun.ADDRESS_IN_USE.search(f) for f in failures):
                    continue
                self.assertEqual(failures, [])
                self.assertEqual(container.stop(), 0, container.log_tail())
                break
        else:
            self.fail("three runs found a loopback port taken: %s" % failures)


if __name__ == "__main__":
    unittest.main(verbosity=2)
