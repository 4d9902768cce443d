#!/usr/bin/python3
"""What the trainer sees, exported (issue 14, item 1): a real libprism trainer (C, the client,
block transfers on the CPU backend and MPI collectives on 2 ranks: trainer_metrics_trainer.c),
real prism-agents and a real prismd. The trainer drops a report for each reason it has (no
agent; the agent stopped with SIGSTOP and its socket full; the agent killed with a frame in
flight), comes back through a second agent, takes a map late, transfers blocks in every precision,
and the second agent's /metrics must show every prism_agent_trainer_* family with exactly the
values the trainer did, every label value present; then a line as an older libprism writes it
shows its drops as reason "unknown", and a line with drops for every reason shows each under its
name (those the C trainer cannot provoke here: a GPU behind or failing, a frame too big, no
memory). Loopback only; every wait is bounded; every
process is stopped on every path."""

import json
import mmap
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prismtest import free_port, http_get, wait_for  # noqa: E402

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
AGENT = os.path.join(BUILD, "agent", "prism-agent")
PRISMD = os.path.join(BUILD, "service", "prismd")
TRAINER = os.environ.get("PRISM_TRAINER_METRICS_TRAINER", os.path.join(BUILD, "tests", "trainer_metrics_trainer"))
MPIEXEC = os.environ.get("PRISM_MPIEXEC", "mpirun")
NP_FLAG = os.environ.get("PRISM_MPIEXEC_NUMPROC_FLAG", "-np")
CONFIG = {"warmup_steps": 2, "update_interval_steps": 2, "history_window": 2, "apply_lag_steps": 2,
          "min_steps_between_switches": 0}
PRECISIONS = ["bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int4"]
FORMATS = PRECISIONS[1:]
# libprism's reasons in hints.h's order (prism_hints_drop), then the agent's "unknown".
REASONS = ["no_agent", "agent_busy", "connection_lost", "stats_pending", "stats_failed", "too_big", "no_memory",
           "unknown"]
EXT_BYTES = 456  # prism_hints_trainer_ext at offset 376: reports_sent, then dropped[7], ...
LE = ["0.001", "0.01", "0.1", "0.5", "1", "2", "5", "10", "30", "60", "300", "+Inf"]
QUIET = [10, 10, 0.1, 0.1]  # blocks 2 and 3 much quieter: the first decision puts them low


def image_bytes(precision, numel):
    """A block's image on the bus (include/prism/transfer.h): BF16 as is; otherwise its codes
    padded to 16 bytes, then one FP32 scale per 128 elements (the engine's default)."""
    if precision == "bf16":
        return numel * 2
    codes = numel // 2 if precision == "int4" else numel
    return (codes + 15) // 16 * 16 + 4 * ((numel + 127) // 128)


# The trainer's transfers: one block of 1024 elements, fetched this many times in each precision.
TRANSFERS = {"bf16": 1, "int8": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int4": 3}


def collective(wire, numel, reduce_scatter, world=2, row=256):
    """(wire bytes, BF16 ring bytes) one rank sends (include/prism/collectives.h's layout)."""
    rows = (numel + row - 1) // row
    per_rank = (rows + world - 1) // world
    row_bytes = (row // 2 if wire == "int4" else row) + 4
    wire_bytes = 2 * (world - 1) * per_rank * row_bytes
    bf16 = 4 * numel * (world - 1) // world
    return (wire_bytes // 2, bf16 // 2) if reduce_scatter else (wire_bytes, bf16)


# The trainer's collectives on 2 ranks (trainer_metrics_trainer.c's list).
COLLECTIVES = [("int8", 1000, False), ("int8", 1000, False), ("fp8_e4m3", 3000, False), ("int4", 600, True)]


def seconds(ns):
    return "%d.%09d" % (ns // 10**9, ns % 10**9)


class Proc:
    def __init__(self, argv, log, **kw):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.p = subprocess.Popen(argv, stdout=fd, stderr=fd, **kw)
        finally:
            os.close(fd)
        self.log = log

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            if sig != signal.SIGKILL:
                self.p.send_signal(signal.SIGCONT)
            try:
                return self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=20)
        return self.p.returncode

    def text(self):
        with open(self.log) as f:
            return f.read()


class TrainerMetricsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-trainer-metrics-")
        self.shared = os.path.join(self.dir, "shared")
        self.procs = []
        self.conn = None

    def tearDown(self):
        if self.conn:
            self.conn.close()
        for p in reversed(self.procs):
            p.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- the pieces ----

    def prismd(self):
        config = os.path.join(self.dir, "config.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        grpc, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        p = Proc([PRISMD, "--grpc-listen", grpc, "--http-listen", http, "--data-dir", os.path.join(self.dir, "data"),
                  "--config", config], os.path.join(self.dir, "prismd.log"))
        self.procs.append(p)
        wait_for("prismd listening", lambda: 'msg="listening"' in p.text())
        return grpc

    def agent(self, prismd, name, node):
        metrics = f"127.0.0.1:{free_port()}"
        p = Proc([AGENT, "--prismd", prismd, "--dir", self.shared, "--metrics-listen", metrics, "--device", "cpu",
                  "--profile-budget-ms", "100", "--node", node, "--device-class", "cpu-test",
                  "--backoff-initial-ms", "50", "--backoff-max-ms", "200"],
                 os.path.join(self.dir, f"{name}.log"))
        p.metrics = metrics
        self.procs.append(p)
        wait_for(f"{name}'s /readyz", lambda: http_get(metrics, "/readyz", openapi=False)[0] == 200)
        return p

    def trainer(self):
        """mpirun -np 2 of the trainer; rank 0 connects back to a loopback socket of the test's."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(120)  # mpirun's start on a loaded machine
        port = listener.getsockname()[1]
        p = Proc([MPIEXEC, NP_FLAG, "2", TRAINER, self.shared, str(port)], os.path.join(self.dir, "trainer.log"),
                 stdin=subprocess.DEVNULL)
        self.procs.append(p)
        self.trainer_proc = p
        try:
            self.conn, _ = listener.accept()
        except socket.timeout:
            self.fail("the trainer never connected:\n" + p.text())
        finally:
            listener.close()
        self.conn.settimeout(120)
        self.reader = self.conn.makefile("r")
        self.assertEqual(self.reader.readline(), "ready\n", self.trainer_proc.text())

    def ask(self, command):
        """One command to the trainer, its one-line answer."""
        self.conn.sendall((command + "\n").encode())
        answer = self.reader.readline()
        self.assertTrue(answer.endswith("\n") and not answer.startswith("error"),
                        f"{command}: {answer!r}\n{self.trainer_proc.text()}")
        return answer.strip()

    def report(self, step, norms=(1, 1, 1, 1)):
        return self.ask("report %d %s" % (step, " ".join(str(n) for n in norms)))

    def line(self):
        return {k: int(v) for k, v in (kv.split("=") for kv in self.ask("line").split())}

    def scrape(self, agent):
        status, text = http_get(agent.metrics, "/metrics", openapi=False)
        self.assertEqual(status, 200)
        return text

    def sample(self, text, name):
        m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
        return m.group(1) if m else None

    # ---- the test ----

    def test_every_trainer_family_shows_exactly_what_the_trainer_did(self):
        os.makedirs(self.shared)
        grpc = self.prismd()
        self.trainer()
        self.assertEqual(self.ask("open jm"), "ok")
        # 1. No agent: the report is dropped (no_agent).
        self.assertEqual(self.report(0), "dropped")

        # 2. A first agent, with no prismd to reach. Until the trainer publishes, its families are
        # not there and prism_agent_info does not know the trainer.
        nowhere = f"127.0.0.1:{free_port()}"
        a1 = self.agent(nowhere, "agent1", "node-a")
        text = self.scrape(a1)
        self.assertNotIn("prism_agent_trainer_reports_sent_total", text)
        self.assertRegex(text, r'(?m)^prism_agent_info\{.*,prismd="%s",job="",rank="",node=""\} 1$' % nowhere)
        self.assertEqual(self.ask("begin 0"), "version 0")  # maps the table, publishes the line
        self.assertEqual(self.report(1), "ok")               # connects: Hello, then the report
        wait_for("agent1 knows the trainer", lambda: re.search(
            r'(?m)^prism_agent_info\{.*,job="jm",rank="0",node="node-a"\} 1$', self.scrape(a1)))
        self.assertEqual(self.sample(self.scrape(a1), 'prism_agent_trainer_reports_dropped_total{reason="no_agent"}'),
                         "1")

        # 3. The agent stops reading (SIGSTOP): reports fill the socket; the one that finds its
        # predecessor unfinished is dropped (agent_busy), and so are the three after it.
        a1.p.send_signal(signal.SIGSTOP)
        returned_ok = int(self.ask("fill 3").split()[1])
        self.assertGreater(returned_ok, 0)
        # 4. The agent dies with the unfinished frame: lost with the connection (connection_lost);
        # the report that found it gone had no agent (no_agent).
        a1.p.send_signal(signal.SIGKILL)
        a1.p.wait(timeout=20)
        self.assertEqual(self.report(2), "dropped")

        # 5. A second agent, with prismd: the trainer comes back (Hello first), and its step 100
        # begins before prismd has decided anything.
        a2 = self.agent(grpc, "agent2", "node-b")
        self.assertEqual(self.ask("begin 100"), "version 0")
        self.assertEqual(self.report(0, QUIET), "ok")
        wait_for("agent2 welcomed", lambda: self.sample(self.scrape(a2), "prism_agent_upstream_connected") == "1")
        for step in range(1, 5):
            self.assertEqual(self.report(step, QUIET), "ok")
        wait_for("map version 1 in the hint table", lambda: self.sample(self.scrape(a2),
                                                                          "prism_agent_map_version") == "1")
        effective = int(self.sample(self.scrape(a2), "prism_agent_map_effective_step"))
        self.assertLess(effective, 100)
        # Step 101 is the first to use map 1, whose effective step had passed by step 100: late.
        self.assertEqual(self.ask("begin 101"), "version 1")
        self.assertEqual(self.ask("transfer"), "ok")
        self.assertEqual(self.ask("begin 102"), "version 1")  # publishes the transfers

        line = self.line()
        self.assertEqual(line["published"], 2)
        sent = 1 + (returned_ok - 1) + 5  # step 1; the fill's whole frames; agent2's five
        self.assertEqual(line["reports_sent"], sent)
        self.assertEqual([line["dropped.%d" % i] for i in range(len(REASONS) - 1)], [2, 4, 1, 0, 0, 0, 0])
        self.assertEqual(line["reports_dropped"], 7)
        self.assertEqual(line["lag_count"], 1)

        text = wait_for("agent2 shows the trainer's last line", lambda: (
            lambda t: t if self.sample(t, "prism_agent_trainer_map_step") == "101" and
            self.sample(t, 'prism_agent_trainer_transfers_total{precision="int4"}') == "3" else None)(
                self.scrape(a2)))
        want = {
            "prism_agent_trainer_reports_sent_total": str(sent),
            "prism_agent_trainer_late_switches_total": "1",
            "prism_agent_trainer_map_version": "1",
            "prism_agent_trainer_map_step": "101",
            "prism_agent_trainer_map_apply_lag_seconds_count": "1",
            "prism_agent_trainer_map_apply_lag_seconds_sum": seconds(line["lag_sum_ns"]),
        }
        for reason, n in zip(REASONS, [2, 4, 1, 0, 0, 0, 0, 0]):
            want['prism_agent_trainer_reports_dropped_total{reason="%s"}' % reason] = str(n)
        cumulative = 0
        for i, le in enumerate(LE):
            cumulative += line["lag_buckets.%d" % i]
            want['prism_agent_trainer_map_apply_lag_seconds_bucket{le="%s"}' % le] = str(cumulative)
        self.assertEqual(cumulative, 1)
        self.assertEqual(line["lag_buckets.11"], 0, "a lag past 300 s in a bounded test")
        for i, p in enumerate(PRECISIONS):
            n = TRANSFERS[p]
            want['prism_agent_trainer_transfers_total{precision="%s"}' % p] = str(n)
            want['prism_agent_trainer_transfer_bytes_total{precision="%s"}' % p] = str(n * image_bytes(p, 1024))
            want['prism_agent_trainer_transfer_bf16_bytes_total{precision="%s"}' % p] = str(n * 2048)
        for f in FORMATS:
            calls = [c for c in COLLECTIVES if c[0] == f]
            want['prism_agent_trainer_allreduce_calls_total{format="%s"}' % f] = str(len(calls))
            want['prism_agent_trainer_allreduce_wire_bytes_total{format="%s"}' % f] = str(
                sum(collective(*c)[0] for c in calls))
            want['prism_agent_trainer_allreduce_bf16_bytes_total{format="%s"}' % f] = str(
                sum(collective(*c)[1] for c in calls))
            ns = line["allreduce_ns.%d" % PRECISIONS.index(f)]
            self.assertEqual(ns > 0, bool(calls), f)
            want['prism_agent_trainer_allreduce_seconds_total{format="%s"}' % f] = seconds(ns)
        got = {name: self.sample(text, name) for name in want}
        self.assertEqual(got, want)
        # The wire bytes by formula are the engine's own figures too (what the trainer published).
        for f in FORMATS:
            self.assertEqual(str(line["allreduce_wire_bytes.%d" % PRECISIONS.index(f)]),
                             want['prism_agent_trainer_allreduce_wire_bytes_total{format="%s"}' % f])
        self.assertEqual(line["transfer_bytes.4"], 3 * image_bytes("int4", 1024))

        # Every family of the plan, typed, with exactly its label values and nothing else.
        families = {
            "prism_agent_trainer_reports_sent_total": ("counter", None, None),
            "prism_agent_trainer_reports_dropped_total": ("counter", "reason", REASONS),
            "prism_agent_trainer_late_switches_total": ("counter", None, None),
            "prism_agent_trainer_transfers_total": ("counter", "precision", PRECISIONS),
            "prism_agent_trainer_transfer_bytes_total": ("counter", "precision", PRECISIONS),
            "prism_agent_trainer_transfer_bf16_bytes_total": ("counter", "precision", PRECISIONS),
            "prism_agent_trainer_allreduce_calls_total": ("counter", "format", FORMATS),
            "prism_agent_trainer_allreduce_wire_bytes_total": ("counter", "format", FORMATS),
            "prism_agent_trainer_allreduce_bf16_bytes_total": ("counter", "format", FORMATS),
            "prism_agent_trainer_allreduce_seconds_total": ("counter", "format", FORMATS),
            "prism_agent_trainer_map_version": ("gauge", None, None),
            "prism_agent_trainer_map_step": ("gauge", None, None),
        }
        for name, (kind, label, values) in families.items():
            self.assertIn("# TYPE %s %s\n" % (name, kind), text)
            samples = re.findall(r"(?m)^%s(\{[^}]*\})? \S+$" % re.escape(name), text)
            self.assertEqual(samples, [""] if label is None else ['{%s="%s"}' % (label, v) for v in values], name)
        self.assertIn("# TYPE prism_agent_trainer_map_apply_lag_seconds histogram\n", text)
        self.assertEqual(re.findall(r'(?m)^prism_agent_trainer_map_apply_lag_seconds_bucket\{le="([^"]+)"\}', text), LE)
        self.assertRegex(text, r'(?m)^prism_agent_info\{version="[^"]+",device_class="cpu-test",prismd="%s",'
                               r'job="jm",rank="0",node="node-b"\} 1$' % re.escape(grpc))

        self.assertEqual(self.ask("quit"), "bye")
        self.assertEqual(self.trainer_proc.p.wait(timeout=60), 0, self.trainer_proc.text())

        # A trainer of an older libprism takes over the table and publishes the first line only
        # (counters_published 1, its dropped total and late switches, nothing past them): its
        # drops show as reason "unknown", and the newer families as 0.
        with open(os.path.join(self.shared, "prism-hints"), "r+b") as f:
            m = mmap.mmap(f.fileno(), 1024)
            seq = struct.unpack_from("<Q", m, 320)[0]
            struct.pack_into("<Q", m, 320, seq + 1)  # applied_seq odd: writing
            struct.pack_into("<QQQQQQ", m, 328, 1, 7, os.getpid(), 1, 5, 2)
            m[376:376 + EXT_BYTES] = bytes(EXT_BYTES)
            struct.pack_into("<Q", m, 320, seq + 2)
            m.close()
        text = wait_for("agent2 shows the older trainer's line", lambda: (
            lambda t: t if self.sample(t, "prism_agent_trainer_map_step") == "7" else None)(self.scrape(a2)))
        for reason, n in zip(REASONS, [0, 0, 0, 0, 0, 0, 0, 5]):
            self.assertEqual(self.sample(text, 'prism_agent_trainer_reports_dropped_total{reason="%s"}' % reason),
                             str(n))
        self.assertEqual(self.sample(text, "prism_agent_trainer_late_switches_total"), "2")
        self.assertEqual(self.sample(text, "prism_agent_trainer_reports_sent_total"), "0")
        self.assertEqual(self.sample(text, "prism_agent_trainer_map_apply_lag_seconds_count"), "0")
        self.assertEqual(self.sample(text, 'prism_agent_trainer_transfers_total{precision="int4"}'), "0")
        self.assertEqual(self.sample(text, 'prism_agent_trainer_allreduce_seconds_total{format="int8"}'),
                         "0.000000000")

        # A line of this build with a drop count of its own for every reason (those the trainer
        # above cannot provoke: a GPU behind or failing, a frame too big, no memory): each is
        # exported under its name, and "unknown" is 0 since every drop has a reason.
        by_reason = list(range(11, 11 + len(REASONS) - 1))
        with open(os.path.join(self.shared, "prism-hints"), "r+b") as f:
            m = mmap.mmap(f.fileno(), 1024)
            seq = struct.unpack_from("<Q", m, 320)[0]
            struct.pack_into("<Q", m, 320, seq + 1)
            struct.pack_into("<QQQQQQ", m, 328, 1, 8, os.getpid(), 2, sum(by_reason), 2)
            struct.pack_into("<Q%dQ" % len(by_reason), m, 376, 3, *by_reason)
            struct.pack_into("<Q", m, 320, seq + 2)
            m.close()
        text = wait_for("agent2 shows the line with every reason", lambda: (
            lambda t: t if self.sample(t, "prism_agent_trainer_map_step") == "8" else None)(self.scrape(a2)))
        for reason, n in zip(REASONS, by_reason + [0]):
            self.assertEqual(self.sample(text, 'prism_agent_trainer_reports_dropped_total{reason="%s"}' % reason),
                             str(n), reason)
        self.assertEqual(self.sample(text, "prism_agent_trainer_reports_sent_total"), "3")


if __name__ == "__main__":
    unittest.main(verbosity=2)
