#!/usr/bin/python3
"""GET /v1/jobs/{job}/ranks and the two rank counts of GET /v1/jobs (issue 13, item 1): what
prismd knows of each rank of a job, from its Hello (node, DeviceProfile), its accepted reports
(last step), its Ack (map version, applied step) and its Heartbeat (the trainer-side counters).

Real prismd, real gRPC streams: Python grpcio agents (test_grpc's Prismd and Agent) for the exact
documents, and the real prism-agent with a real libprism client (the Python binding) for the
trainer counters' way from the trainer through the hint table and the Heartbeat into REST. Every
wait is bounded; every process is stopped on every path."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
import test_grpc as tg  # noqa: E402  (Prismd, Agent; its tests are not collected here)
from prism.v1 import prism_pb2 as pb  # noqa: E402
from prismtest import free_port, http_get, wait_for  # noqa: E402

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))

# Steps a rank misses complete on this timeout (rank 2 never reports); long enough that the
# reports of ranks 0 and 1 of one step always meet on a loaded machine.
CONFIG = {"step_timeout_ms": 1500}
NORMS = [10.0, 10.0, 0.1, 0.1]  # the first decision puts blocks 2 and 3 low: map version 1

H100 = {"device_class": "train-h100", "device_name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85899345920,
        "bf16_ops_per_second": 9.0e14, "fp16_ops_per_second": 9.0e14, "int8_ops_per_second": 1.8e15,
        "fp8_ops_per_second": 1.8e15, "h2d_bytes_per_second": 2.5e10}
A100 = {"device_class": "train-a100", "device_name": "NVIDIA A100-SXM4-40GB", "memory_bytes": 42949672960,
        "bf16_ops_per_second": 3.12e14, "fp16_ops_per_second": 3.12e14, "int8_ops_per_second": 6.24e14,
        "fp8_ops_per_second": 0.0, "h2d_bytes_per_second": 2.4e10}
L4 = {"device_class": "infer-l4", "device_name": "NVIDIA L4", "memory_bytes": 24152899584,
      "bf16_ops_per_second": 1.21e14, "fp16_ops_per_second": 1.21e14, "int8_ops_per_second": 2.42e14,
      "fp8_ops_per_second": 2.42e14, "h2d_bytes_per_second": 1.2e10}

NOTHING = {"connected": False, "node": None, "device": None, "last_step": None, "acked_map_version": None,
           "applied_step": None, "reports_dropped": None, "late_switches": None, "lagging": False,
           "acked_current_map": False}


def profile(d):
    return pb.DeviceProfile(**d, quantize_cost=pb.LinearCost(fixed_seconds=1e-5, seconds_per_byte=1e-11))


def hello(agent, job, rank, world_size, node, device):
    agent.send(hello=pb.Hello(job_id=job, rank=rank, world_size=world_size, node=node, device=profile(device)))
    assert agent.next().WhichOneof("kind") == "welcome"


def rank_doc(rank, **facts):
    return dict({"rank": rank}, **dict(NOTHING, **facts))


class RanksTest(unittest.TestCase):
    def setUp(self):
        self.prismd = tg.Prismd(config_extra=CONFIG)
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def agent(self, prismd=None, token=None):
        a = tg.Agent(prismd or self.prismd, token)
        self.agents.append(a)
        return a

    def ranks(self, job, ready):
        """The ranks document once ready(doc) holds (snapshots follow each change within 250 ms)."""
        return self.prismd.json_until("/v1/jobs/%s/ranks" % job, ready)

    def job_entry(self, job, ready=lambda e: True):
        doc = self.prismd.json_until("/v1/jobs", lambda d: any(e["job_id"] == job and ready(e) for e in d["jobs"]))
        return next(e for e in doc["jobs"] if e["job_id"] == job)

    def test_ranks_show_each_rank_as_its_agent_last_told_prismd(self):
        r0, r1 = self.agent(), self.agent()
        hello(r0, "jr", 0, 3, "node-a", H100)
        hello(r1, "jr", 1, 3, "node-b", A100)
        # Before any report or Ack: both connected, nothing reported, no map yet (version 0: every
        # rank has "acked" it), rank 2 unknown.
        doc = self.ranks("jr", lambda d: d["ranks"][1]["connected"])
        self.assertEqual(doc, {"job_id": "jr", "world_size": 3, "map_version": 0, "last_step": None, "ranks": [
            rank_doc(0, connected=True, node="node-a", device=H100, acked_current_map=True),
            rank_doc(1, connected=True, node="node-b", device=A100, acked_current_map=True),
            rank_doc(2, acked_current_map=True)]})

        # Steps 0..2 from both ranks: the first decision makes map version 1.
        for step in range(3):
            r0.step(step, NORMS)
            r1.step(step, NORMS)
        self.ranks("jr", lambda d: [r["last_step"] for r in d["ranks"]] == [2, 2, None] and d["map_version"] == 1)
        # An override makes the next decision version 2; rank 0 goes on alone to step 5.
        status, body = self.prismd.http("/v1/jobs/jr/overrides", "PUT", json.dumps({"force_bf16_blocks": [2]}))
        self.assertEqual(status, 200, body)
        for step in range(3, 6):
            r0.step(step, NORMS)
        self.ranks("jr", lambda d: d["ranks"][0]["last_step"] == 5 and d["map_version"] == 2)
        r0.send(ack=pb.Ack(map_version=2, applied_step=5))
        r1.send(ack=pb.Ack(map_version=1, applied_step=3))
        # Rank 0's agent knows its trainer's counters; rank 1's is an older agent that sends none.
        r0.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000000, last_step=5, trainer_reports_dropped=3,
                                       trainer_late_switches=1))
        r1.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000000, last_step=2))
        rank0 = rank_doc(0, connected=True, node="node-a", device=H100, last_step=5, acked_map_version=2,
                         applied_step=5, reports_dropped=3, late_switches=1, acked_current_map=True)
        # Rank 1 is 3 steps behind step 5: lagging (more than PRISMD_RANK_LAG_STEPS = 2).
        rank1 = rank_doc(1, connected=True, node="node-b", device=A100, last_step=2, acked_map_version=1,
                         applied_step=3, lagging=True)
        expected = {"job_id": "jr", "world_size": 3, "map_version": 2, "last_step": 5,
                    "ranks": [rank0, rank1, rank_doc(2)]}
        doc = self.ranks("jr", lambda d: d == expected)
        self.assertEqual(doc, expected)
        entry = self.job_entry("jr")
        self.assertEqual((entry["ranks_lagging"], entry["ranks_not_acked"], entry["agents_connected"]), (1, 1, 2))
        # then the map's and the last decision's (blocks_by_precision the last of them)
        self.assertEqual(list(entry)[-7:-5], ["ranks_lagging", "ranks_not_acked"])
        # The other answers keep their shape: the block map's job fields gain nothing.
        blocks = json.loads(self.prismd.http("/v1/jobs/jr/blocks")[1])
        self.assertNotIn("ranks_lagging", blocks)
        self.assertNotIn("ranks_not_acked", blocks)

        # Rank 1's agent goes away: not connected (so neither lagging nor counted), the rest kept.
        r1.replies.cancel()
        rank1_gone = dict(rank1, connected=False, lagging=False)
        doc = self.ranks("jr", lambda d: not d["ranks"][1]["connected"])
        self.assertEqual(doc["ranks"], [rank0, rank1_gone, rank_doc(2)])
        entry = self.job_entry("jr", lambda e: e["agents_connected"] == 1)
        self.assertEqual((entry["ranks_lagging"], entry["ranks_not_acked"]), (0, 0))

        # It comes back on another node and device: its new Hello replaces node and device, and
        # the old agent's Ack goes with it (the new agent has acked nothing yet); its last step
        # stays.
        r1b = self.agent()
        hello(r1b, "jr", 1, 3, "node-c", L4)
        doc = self.ranks("jr", lambda d: d["ranks"][1]["connected"])
        self.assertEqual(doc["ranks"][1], dict(rank1, node="node-c", device=L4, acked_map_version=None,
                                               applied_step=None))
        # Rank 2 joins at last and has reported nothing while others have: lagging, not acked.
        r2 = self.agent()
        r2.send(hello=pb.Hello(job_id="jr", rank=2, world_size=3, node="node-d"))  # no DeviceProfile
        self.assertEqual(r2.next().WhichOneof("kind"), "welcome")
        doc = self.ranks("jr", lambda d: d["ranks"][2]["connected"])
        self.assertEqual(doc["ranks"][2], rank_doc(2, connected=True, node="node-d", lagging=True))
        entry = self.job_entry("jr", lambda e: e["agents_connected"] == 3)
        self.assertEqual((entry["ranks_lagging"], entry["ranks_not_acked"]), (2, 2))

        # A Heartbeat without the counters makes them unknown again; one with them sets them.
        r0.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000001, last_step=5))
        doc = self.ranks("jr", lambda d: d["ranks"][0]["reports_dropped"] is None)
        self.assertEqual(doc["ranks"][0], dict(rank0, reports_dropped=None, late_switches=None))
        r0.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000002, last_step=5, trainer_late_switches=4))
        doc = self.ranks("jr", lambda d: d["ranks"][0]["late_switches"] == 4)
        self.assertEqual(doc["ranks"][0], dict(rank0, reports_dropped=None, late_switches=4))

    def test_a_device_figure_that_is_not_a_finite_number_ge_0_is_refused(self):
        for field, value in (("bf16_ops_per_second", -1.0), ("h2d_bytes_per_second", float("inf")),
                             ("int8_ops_per_second", float("nan"))):
            a = self.agent()
            device = profile(H100)
            setattr(device, field, value)
            a.send(hello=pb.Hello(job_id="jd", rank=0, world_size=1, node="n", device=device))
            self.assertEqual(a.status(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(a.done.details(), "hello.device.%s: %g is not a finite number >= 0" % (field, value))
        # Nothing was made of them.
        self.assertEqual(self.prismd.http("/v1/jobs/jd/ranks")[0], 404)

    def test_unknown_job_is_404_and_a_job_without_agents_lists_every_rank(self):
        status, body = self.prismd.http("/v1/jobs/nope/ranks")
        self.assertEqual((status, json.loads(body)["error"]["code"]), (404, "not_found"))
        a = self.agent()
        hello(a, "j2", 1, 2, "n", H100)
        a.replies.cancel()
        self.job_entry("j2", lambda e: e["agents_connected"] == 0)
        doc = self.ranks("j2", lambda d: not d["ranks"][1]["connected"])
        self.assertEqual(doc, {"job_id": "j2", "world_size": 2, "map_version": 0, "last_step": None, "ranks": [
            rank_doc(0, acked_current_map=True),
            rank_doc(1, node="n", device=H100, acked_current_map=True)]})
        self.assertEqual(self.prismd.http("/v1/jobs/j2/ranks", "HEAD")[0], 200)
        self.assertEqual(self.prismd.http("/v1/jobs/j2/ranks", "POST", "{}")[0], 405)

    def test_a_large_world_is_streamed_and_lists_every_rank(self):
        a = self.agent()
        hello(a, "big", 4999, 5000, "last", L4)
        doc = self.ranks("big", lambda d: d["ranks"][4999]["connected"])
        self.assertEqual(len(doc["ranks"]), 5000)
        self.assertEqual([r["rank"] for r in doc["ranks"]], list(range(5000)))
        self.assertEqual(doc["ranks"][0], rank_doc(0, acked_current_map=True))
        self.assertEqual(doc["ranks"][4999], rank_doc(4999, connected=True, node="last", device=L4,
                                                      acked_current_map=True))

    def test_ranks_need_a_token_when_reads_do(self):
        d = tg.Prismd("--require-read-token", config_extra=CONFIG)
        try:
            a = self.agent(d, token="tok-r")
            hello(a, "js", 0, 1, "n", H100)
            wait_for("the job in REST", lambda: d.http("/v1/jobs/js/ranks", token="tok-r")[0] == 200)
            self.assertEqual(d.http("/v1/jobs/js/ranks")[0], 401)
            status, body = d.http("/v1/jobs/js/ranks", token="wrong")
            self.assertEqual((status, json.loads(body)["error"]["code"]), (403, "permission_denied"))
            status, body = d.http("/v1/jobs/js/ranks", token="tok-r")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["ranks"][0]["node"], "n")
            self.assertEqual(d.http("/v1/jobs/nope/ranks", token="tok-r")[0], 404)
        finally:
            for x in self.agents:
                x.close()
            self.agents = []
            self.assertEqual(d.stop(), 0)


AGENT = os.path.join(BUILD, "agent", "prism-agent")
BLOCKS = [("b0", [(4, 4)]), ("b1", [(4, 4)]), ("b2", [(4, 4)]), ("b3", [(4, 4)])]


def stats(norms):
    return [{"l2_norm": n, "max_abs": n, "mean": 0.0, "variance": 0.01, "numel": 16, "nonfinite": 0} for n in norms]


@unittest.skipIf(os.environ.get("PRISM_RANKS_NO_BINDING") or not os.path.exists(AGENT),
                 "no prism-agent, or no environment for the libprism binding")
class AgentCountersTest(unittest.TestCase):
    """The trainer's counters go from libprism through the hint table and prism-agent's
    Heartbeat to /ranks (and to the agent's /metrics)."""

    def setUp(self):
        sys.path.insert(0, os.path.join(SOURCE, "python"))
        import prism
        self.prism = prism
        self.prismd = tg.Prismd(config_extra={"apply_lag_steps": 2})
        self.dir = tempfile.mkdtemp(prefix="prism-ranks-test-")
        self.agent = None

    def tearDown(self):
        if self.agent and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(timeout=10)
        self.assertEqual(self.prismd.stop(), 0)
        shutil.rmtree(self.dir, ignore_errors=True)

    def metric(self, name):
        text = http_get(self.metrics, "/metrics", openapi=False)[1]
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def test_trainer_counters_reach_ranks_through_the_real_agent(self):
        shared = os.path.join(self.dir, "shared")
        os.makedirs(shared)
        c = self.prism.Client(job_id="ja", rank=0, world_size=1, dir=shared, reconnect_interval_ms=50)
        c.register("m", BLOCKS)
        # No agent yet: the trainer's report is dropped (and counted by libprism).
        self.assertFalse(c.report_stats(0, stats(NORMS)))
        self.metrics = "127.0.0.1:%d" % free_port()
        log = open(os.path.join(self.dir, "agent.log"), "w")
        self.agent = subprocess.Popen([AGENT, "--prismd", self.prismd.grpc_addr, "--dir", shared, "--metrics-listen",
                                       self.metrics, "--device", "cpu", "--profile-budget-ms", "100",
                                       "--node", "trainer-node", "--device-class", "cpu-test", "--heartbeat-ms", "100"],
                                      stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        wait_for("the agent's /readyz", lambda: http_get(self.metrics, "/readyz", openapi=False)[0] == 200)
        # Step 10 begins before any map: the first map (decided by step 4 at the latest, effective
        # two steps later) comes late, at step 11.
        wait_for("the hint table mapped", lambda: c.begin_step(10) == 0 and c.state()["hints_mapped"])
        wait_for("the client reconnected", lambda: c.report_stats(0, stats(NORMS)))
        wait_for("the agent welcomed", lambda: self.metric("prism_agent_upstream_connected") == 1)
        for step in range(1, 5):
            self.assertTrue(c.report_stats(step, stats(NORMS)))
        wait_for("map version 1 in the hint table", lambda: self.metric("prism_agent_map_version") == 1)
        self.assertEqual(c.begin_step(11), 1)
        counters = c.counters()
        self.assertEqual(counters["late_switches"], 1)
        dropped = counters["reports_dropped"]
        self.assertGreaterEqual(dropped, 1)
        doc = self.prismd.json_until("/v1/jobs/ja/ranks", lambda d: d["ranks"][0]["late_switches"] == 1 and
                                     d["ranks"][0]["reports_dropped"] == dropped and
                                     d["ranks"][0]["acked_map_version"] == 1)
        r = doc["ranks"][0]
        self.assertEqual((r["connected"], r["node"], r["last_step"], r["applied_step"], r["lagging"],
                          r["acked_current_map"]), (True, "trainer-node", 4, 11, False, True))
        self.assertEqual(r["device"]["device_class"], "cpu-test")
        # Every drop here found no agent to send to (the agent's families carry reasons).
        self.assertEqual(self.metric('prism_agent_trainer_reports_dropped_total{reason="no_agent"}'), dropped)
        self.assertEqual(self.metric("prism_agent_trainer_late_switches_total"), 1)
        c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
