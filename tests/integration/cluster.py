"""What the end-to-end tests of many processes share (test_agents.py, test_hybrid_cluster.py): a
scratch directory with prismd, `world` prism-agents and `world` demo trainers
(examples/train_demo.py) in it, every socket on loopback, every child's stderr in a log file
there. Each test brings its own config, agent and trainer options and scenario."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from prismtest import free_port, http_get, wait_for

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))


def get_json(addr, path):
    """The JSON body of GET http://addr/path; AssertionError unless it answers 200."""
    status, body = http_get(addr, path)
    if status != 200:
        raise AssertionError(f"GET {path}: {status} {body}")
    return json.loads(body)


def read_log(path):
    """The rows of a trainer's JSONL log written so far (a last line without its newline is not
    yet written); [] before the file exists."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    rows.append(json.loads(line))
    return rows


def metric(text, name):
    """The value of the unlabelled sample `name` in Prometheus text, or None when it is not there."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class Cluster:
    """The processes of one test and their scratch directory (self.dir). run() runs the test's
    scenario and cleans up after it."""

    def __init__(self, prefix, world, config):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.world = world
        self.config = self.write_json("config.json", config)
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.prismd = None
        self.agents = [None] * world
        self.metrics = [f"127.0.0.1:{free_port()}" for _ in range(world)]
        self.trainers = [None] * world
        self.logs = [os.path.join(self.dir, f"trainer{r}.jsonl") for r in range(world)]

    def write_json(self, name, value):
        """Writes value as JSON to the file `name` of the scratch directory and returns its path."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(value, f)
        return path

    def spawn(self, argv, log, **kw):
        """Starts argv with its stderr appended to the file `log` of the scratch directory; the child
        keeps its own descriptor, ours is closed."""
        fd = os.open(os.path.join(self.dir, log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            return subprocess.Popen(argv, stderr=fd, **kw)
        finally:
            os.close(fd)

    def start_prismd(self):
        """Starts prismd on the cluster's ports and data dir (the same on a restart) and waits until
        it is ready."""
        self.prismd = self.spawn(
            [os.path.join(BUILD, "service", "prismd"), "--grpc-listen", self.grpc, "--http-listen", self.http,
             "--data-dir", os.path.join(self.dir, "data"), "--config", self.config],
            "prismd.log", stdout=subprocess.DEVNULL)
        wait_for("prismd ready", lambda: http_get(self.http, "/readyz")[0] == 200)

    def start_agent(self, r, options):
        """Starts the prism-agent of rank r (its directory agentR, its /metrics at self.metrics[r],
        a short backoff) with the test's options (how it gets its DeviceProfile)."""
        self.agents[r] = self.spawn(
            [os.path.join(BUILD, "agent", "prism-agent"), "--prismd", self.grpc, "--dir",
             os.path.join(self.dir, f"agent{r}"), "--metrics-listen", self.metrics[r], *options,
             "--backoff-initial-ms", "50", "--backoff-max-ms", "400"],
            f"agent{r}.log", stdout=subprocess.DEVNULL)

    def start_trainers(self, job, steps, step_ms, options=()):
        """Starts one demo trainer a rank, each logging its steps to self.logs[r] and printing its
        summary on stdout (a pipe, text), with the test's options."""
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"))
        # gloo meets through a file: a port picked free here could be taken by another test before
        # torch has started.
        rendezvous = os.path.join(self.dir, "gloo-rendezvous")
        for r in range(self.world):
            self.trainers[r] = self.spawn(
                [sys.executable, os.path.join(SOURCE, "examples", "train_demo.py"), "--job", job, "--rank", str(r),
                 "--world", str(self.world), "--dir", os.path.join(self.dir, f"agent{r}"), "--steps", str(steps),
                 "--step-ms", str(step_ms), "--dist-file", rendezvous, "--log", self.logs[r], *options],
                f"trainer{r}.log", stdout=subprocess.PIPE, env=env, text=True)

    def agent_metrics(self, r):
        """The Prometheus text of rank r's agent."""
        return http_get(self.metrics[r], "/metrics", openapi=False)[1]

    def run(self, scenario):
        """Runs scenario(self): on any failure the children's logs go to stderr first; on every
        path every child still running is killed and the scratch directory removed."""
        try:
            scenario(self)
        except BaseException:
            self.dump_logs()
            raise
        finally:
            self.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop(self):
        for p in [self.prismd, *self.agents, *self.trainers]:
            if p and p.poll() is None:
                p.kill()
                p.wait(timeout=10)

    def dump_logs(self):
        """The tail of every child's log on stderr, for a failed test."""
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.dir, name)) as f:
                    tail = f.read()[-3000:]
                sys.stderr.write(f"---- {name} ----\n{tail}\n")
