#!/usr/bin/python3
"""prismd's /metrics families for dashboards and alerts (issue 14, plan14 "New from prismd"):
prism_ready, prism_store_write_duration_seconds and the per-job prism_job_* families, read with
exact values through a job's life.

Real prismd on loopback ports, real gRPC streams from grpcio agents (test_grpc's Prismd and Agent).
Every answer is parsed by a small parser of the text exposition below (each sample belongs to a
family declared by HELP and TYPE, a histogram's buckets are cumulative and end at +Inf = _count)
and passes `promtool check metrics`. The store's writes are counted from what the test makes
prismd write: a new job (its row), its activity time (once when the job is made, once when its
last agent leaves; while agents are connected it is saved at most every 5 minutes without
--job-idle-expiry), and one state row per decision. Every wait is bounded; prismd is stopped on
every path."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_grpc as tg  # noqa: E402  (Prismd, Agent; its tests are not collected here)
from prism.v1 import prism_pb2 as pb  # noqa: E402
from prismtest import free_port, http_get, wait_for  # noqa: E402

# The bound of every wait here, generous for a loaded 2-core CI machine and the sanitizer builds.
# test_grpc's helpers used here (Prismd's start and stop, Agent.next) read test_grpc.WAIT_S (10 s)
# when they run, so it is raised to this bound too.
WAIT_S = 30
tg.WAIT_S = max(tg.WAIT_S, WAIT_S)

# Decisions at the 2nd collected step and every 2nd after it (test_grpc's CONFIG); a step whose
# rank is missing never completes on its own during a test (10 minutes).
CONFIG = {"step_timeout_ms": 600000}
NORMS = (3.0, 1.0)  # block 1 goes int8 at the first decision, and stays there

# The buckets of prism_store_write_duration_seconds (plan14), as prismd writes their le labels.
STORE_WRITE_LE = ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5",
                  "+Inf"]
NEW_FAMILIES = {
    "prism_ready": "gauge",
    "prism_store_write_duration_seconds": "histogram",
    "prism_job_decisions_total": "counter",
    "prism_job_last_decision_timestamp_seconds": "gauge",
    "prism_job_ranks_lagging": "gauge",
    "prism_job_ranks_not_acked": "gauge",
    "prism_job_ranks_late_switches": "gauge",
}
JOB_FAMILIES = ["prism_job_decisions_total", "prism_job_last_decision_timestamp_seconds", "prism_job_ranks_lagging",
                "prism_job_ranks_not_acked", "prism_job_ranks_late_switches"]

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(r"^(%s)(?:\{(.*)\})? (\S+)$" % NAME)
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Exposition:
    """A /metrics answer parsed: families {name: (type, help)} and samples {(name, labels): value}
    with labels a sorted tuple of (name, value). Raises AssertionError on a line that is not of
    the text format, a sample of an undeclared family, a sample given twice, or a histogram whose
    buckets are not cumulative up to +Inf = _count."""

    def __init__(self, text):
        self.text = text
        self.families = {}
        self.samples = {}
        helps = {}
        assert text.endswith("\n"), "the answer does not end with a newline"
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name, _, help_text = line[7:].partition(" ")
                helps[name] = help_text
            elif line.startswith("# TYPE "):
                name, _, kind = line[7:].partition(" ")
                assert name not in self.families, "family %s declared twice" % name
                self.families[name] = (kind, helps.get(name, ""))
            else:
                m = SAMPLE.match(line)
                assert m, "not a sample line: %r" % line
                name, labels, value = m.groups()
                pairs = LABEL.findall(labels or "")
                assert ",".join('%s="%s"' % p for p in pairs) == (labels or ""), "bad labels: %r" % line
                key = (name, tuple(sorted(pairs)))
                assert key not in self.samples, "sample given twice: %r" % line
                assert self.family_of(name), "sample of an undeclared family: %r" % line
                self.samples[key] = float(value)
        for name, (kind, _) in self.families.items():
            if kind == "histogram":
                self.check_histogram(name)

    def family_of(self, sample_name):
        if sample_name in self.families:
            return sample_name
        for suffix in ("_bucket", "_sum", "_count"):
            base = sample_name[:-len(suffix)]
            if sample_name.endswith(suffix) and self.families.get(base, ("",))[0] == "histogram":
                return base
        return None

    def check_histogram(self, name):
        buckets = sorted(((float(dict(labels)["le"]), value) for (n, labels), value in self.samples.items()
                          if n == name + "_bucket"))
        counts = [value for _, value in buckets]
        assert counts == sorted(counts), "%s: buckets not cumulative: %s" % (name, buckets)
        assert buckets and buckets[-1][0] == math.inf, "%s: no +Inf bucket" % name
        assert buckets[-1][1] == self.value(name + "_count"), "%s: +Inf bucket != _count" % name

    def value(self, name, **labels):
        key = (name, tuple(sorted(labels.items())))
        assert key in self.samples, "no sample %s%s in /metrics" % (name, labels)
        return self.samples[key]

    def has(self, name, **labels):
        return (name, tuple(sorted(labels.items()))) in self.samples

    def job(self, job):
        """The job's values of the five prism_job_* families."""
        return {name: self.value(name, job=job) for name in JOB_FAMILIES}

    def store_writes(self):
        """The store write histogram's _count (checked: its le labels are exactly plan14's)."""
        les = [dict(labels)["le"] for (n, labels) in self.samples if n == "prism_store_write_duration_seconds_bucket"]
        assert les == STORE_WRITE_LE, les
        count = self.value("prism_store_write_duration_seconds_count")
        total = self.value("prism_store_write_duration_seconds_sum")
        assert total >= 0 and (count > 0 or total == 0), (count, total)
        return count


def scrape(prismd):
    """/metrics parsed and checked by promtool."""
    status, text = prismd.http("/metrics")
    assert status == 200, (status, text)
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=WAIT_S)
    assert check.returncode == 0, check.stdout + check.stderr
    return Exposition(text)


def scrape_until(prismd, what, ready):
    """The first parsed /metrics for which ready(m) holds (snapshots follow a change within 250 ms),
    waited for at most WAIT_S."""
    return wait_for(what, lambda: (lambda m: m if ready(m) else None)(scrape(prismd)), timeout_s=WAIT_S,
                    every_s=0.025)


def hello(agent, job, rank, world_size):
    agent.send(hello=pb.Hello(job_id=job, rank=rank, world_size=world_size, node="node-%d" % rank))
    kind = agent.next().WhichOneof("kind")
    assert kind == "welcome", kind


def job_values(decisions=0, timestamp=0.0, lagging=0, not_acked=0, late=0):
    return dict(zip(JOB_FAMILIES, map(float, (decisions, timestamp, lagging, not_acked, late))))


class PrismdMetricsTest(unittest.TestCase):
    def setUp(self):
        self.prismd = tg.Prismd(config_extra=CONFIG)
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def agent(self):
        a = tg.Agent(self.prismd)
        self.agents.append(a)
        return a

    def job_entry(self, job):
        doc = json.loads(self.prismd.http("/v1/jobs")[1])
        return next(e for e in doc["jobs"] if e["job_id"] == job)

    def assert_job_matches_rest(self, m, job):
        """The prism_job_* values /v1/jobs also shows are its figures (last_decision_unix null: 0)."""
        e = self.job_entry(job)
        self.assertEqual(m.value("prism_job_last_decision_timestamp_seconds", job=job), e["last_decision_unix"] or 0.0)
        self.assertEqual(m.value("prism_job_ranks_lagging", job=job), e["ranks_lagging"])
        self.assertEqual(m.value("prism_job_ranks_not_acked", job=job), e["ranks_not_acked"])

    def test_families_are_declared_with_their_types_and_a_help(self):
        m = scrape(self.prismd)
        for name, kind in NEW_FAMILIES.items():
            self.assertEqual(m.families[name][0], kind, name)
            self.assertGreater(len(m.families[name][1]), 20, name)
        # No job yet: no per-job series, nothing written.
        self.assertEqual([k for k in m.samples if k[0] in JOB_FAMILIES], [])
        self.assertEqual(m.store_writes(), 0)
        self.assertEqual(m.value("prism_ready"), 1)

    def test_job_families_follow_a_job_through_its_life_and_a_restart(self):
        r0, r1 = self.agent(), self.agent()
        hello(r0, "jm", 0, 2)
        hello(r1, "jm", 1, 2)
        # Before any decision: every family has the job's series, all 0 (no map yet: version 0,
        # which every rank has "acked"). Written: the job's row and its activity time.
        m = scrape_until(self.prismd, "both agents and 2 store writes",
                         lambda m: m.has("prism_agents_connected", job="jm") and
                         m.value("prism_agents_connected", job="jm") == 2 and m.store_writes() == 2)
        self.assertEqual(m.job("jm"), job_values())
        self.assertEqual(m.store_writes(), 2)
        self.assert_job_matches_rest(m, "jm")
        self.assertIsNone(self.job_entry("jm")["last_decision_unix"])

        # Steps 1 and 2 from both ranks: the first decision (map version 1), which neither rank
        # has acked yet. Written: the decision's state.
        for step in (1, 2):
            r0.step(step, NORMS)
            r1.step(step, NORMS)
        m = scrape_until(self.prismd, "the first decision",
                         lambda m: m.value("prism_job_decisions_total", job="jm") == 1)
        first = m.value("prism_job_last_decision_timestamp_seconds", job="jm")
        self.assertGreater(first, 1.7e9)  # a Unix time, not 0
        self.assertEqual(m.job("jm"), job_values(1, first, not_acked=2))
        self.assertEqual(m.store_writes(), 3)
        self.assertEqual(m.value("prism_map_version", job="jm"), 1)
        self.assert_job_matches_rest(m, "jm")

        # Rank 0 acks it: rank 1 has not; then rank 1 acks too.
        r0.send(ack=pb.Ack(map_version=1, applied_step=5))
        m = scrape_until(self.prismd, "rank 0's Ack", lambda m: m.value("prism_job_ranks_not_acked", job="jm") == 1)
        self.assertEqual(m.job("jm"), job_values(1, first, not_acked=1))
        self.assert_job_matches_rest(m, "jm")
        r1.send(ack=pb.Ack(map_version=1, applied_step=5))
        m = scrape_until(self.prismd, "rank 1's Ack", lambda m: m.value("prism_job_ranks_not_acked", job="jm") == 0)
        self.assertEqual(m.job("jm"), job_values(1, first))

        # Rank 0 goes on alone to step 5: rank 1 (at 2) is 3 steps behind, lagging. Steps 3..5
        # wait for rank 1: no decision, nothing written.
        for step in (3, 4, 5):
            r0.step(step, NORMS)
        m = scrape_until(self.prismd, "rank 1 lagging", lambda m: m.value("prism_job_ranks_lagging", job="jm") == 1)
        self.assertEqual(m.job("jm"), job_values(1, first, lagging=1))
        self.assertEqual(m.store_writes(), 3)
        self.assert_job_matches_rest(m, "jm")

        # Rank 1 catches up: steps 3..5 complete, a decision at step 4 (same map), not lagging.
        for step in (3, 4, 5):
            r1.step(step, NORMS)
        m = scrape_until(self.prismd, "the second decision",
                         lambda m: m.value("prism_job_decisions_total", job="jm") == 2 and
                         m.value("prism_job_ranks_lagging", job="jm") == 0)
        second = m.value("prism_job_last_decision_timestamp_seconds", job="jm")
        self.assertGreaterEqual(second, first)
        self.assertEqual(m.job("jm"), job_values(2, second))
        self.assertEqual(m.store_writes(), 4)
        self.assertEqual(m.value("prism_map_version", job="jm"), 1)
        self.assertEqual(m.value("prism_decisions_total"), 2)
        self.assert_job_matches_rest(m, "jm")

        # The trainers' late switches from each rank's Heartbeat, summed; a Heartbeat without the
        # counter makes that rank's unknown (0 here) again. Heartbeats write nothing.
        r0.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000000, last_step=5, trainer_late_switches=3))
        r1.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000000, last_step=5, trainer_late_switches=4,
                                       trainer_reports_dropped=9))
        m = scrape_until(self.prismd, "7 late switches",
                         lambda m: m.value("prism_job_ranks_late_switches", job="jm") == 7)
        self.assertEqual(m.job("jm"), job_values(2, second, late=7))
        r1.send(heartbeat=pb.Heartbeat(unix_time_ms=1700000000001, last_step=5))
        m = scrape_until(self.prismd, "3 late switches",
                         lambda m: m.value("prism_job_ranks_late_switches", job="jm") == 3)
        self.assertEqual(m.job("jm"), job_values(2, second, late=3))

        # Rank 0's agent goes: what it last said stays (its late switches too); rank 1's goes, the
        # last: the job's activity time is written.
        r0.replies.cancel()
        m = scrape_until(self.prismd, "rank 0 gone", lambda m: m.value("prism_agents_connected", job="jm") == 1)
        self.assertEqual(m.job("jm"), job_values(2, second, late=3))
        r1.replies.cancel()
        m = scrape_until(self.prismd, "rank 1 gone and its activity written",
                         lambda m: m.value("prism_agents_connected", job="jm") == 0 and m.store_writes() == 5)
        self.assertEqual(m.job("jm"), job_values(2, second, late=3))
        self.assertEqual(m.store_writes(), 5)

        # kill -9 and a restart on the same data: the last decision's time survives; decisions
        # count from this start; rank facts are not kept; the restore wrote nothing.
        for a in self.agents:
            a.close()
        self.agents = []
        self.prismd.kill()
        self.prismd = tg.Prismd(reuse=self.prismd)
        m = scrape_until(self.prismd, "the restored job", lambda m: m.has("prism_job_decisions_total", job="jm"))
        self.assertEqual(m.job("jm"), job_values(0, second))
        self.assertEqual(m.store_writes(), 0)
        self.assert_job_matches_rest(m, "jm")

        # Both ranks back. The store holds the state of the last decision (step 4), so steps 5
        # and 6 are taken: a decision at step 6, written once; the agents' activity is within 5
        # minutes of the saved time: not written while they are connected.
        self.assertEqual(self.job_entry("jm")["step"], 4)
        r0, r1 = self.agent(), self.agent()
        hello(r0, "jm", 0, 2)
        hello(r1, "jm", 1, 2)
        for step in (5, 6):
            r0.step(step, NORMS)
            r1.step(step, NORMS)
        m = scrape_until(self.prismd, "the decision after the restart",
                         lambda m: m.value("prism_job_decisions_total", job="jm") == 1)
        third = m.value("prism_job_last_decision_timestamp_seconds", job="jm")
        self.assertGreaterEqual(third, second)
        # The map did not change (version 1, which the new agents have not acked).
        self.assertEqual(m.job("jm"), job_values(1, third, not_acked=2))
        self.assertEqual(m.store_writes(), 1)
        self.assert_job_matches_rest(m, "jm")

    def test_config_change_and_job_deletion_are_store_writes(self):
        # DELETE takes the admin token.
        self.prismd.stop()
        secrets = tempfile.mkdtemp(prefix="prism-admin-")
        self.addCleanup(shutil.rmtree, secrets, True)
        admin = os.path.join(secrets, "admin-token")
        with open(admin, "w") as f:
            f.write("the-admin\n")
        self.prismd = tg.Prismd("--admin-token-file", admin, config_extra=CONFIG)
        a = self.agent()
        hello(a, "jw", 0, 1)
        scrape_until(self.prismd, "the job's row and activity", lambda m: m.store_writes() == 2)
        status, body = self.prismd.http("/v1/jobs/jw/config", "PATCH", json.dumps({"history_window": 3}),
                                         token="the-admin")
        self.assertEqual(status, 200, body)
        scrape_until(self.prismd, "the config written", lambda m: m.store_writes() == 3)
        a.replies.cancel()
        self.agents = []
        scrape_until(self.prismd, "the last agent's activity written",
                     lambda m: m.value("prism_agents_connected", job="jw") == 0 and m.store_writes() == 4)
        status, body = self.prismd.http("/v1/jobs/jw", "DELETE", token="the-admin")
        self.assertEqual(status, 200, body)
        m = scrape_until(self.prismd, "the deletion written", lambda m: m.store_writes() == 5)
        # The job is gone, and so are its series.
        self.assertEqual([k for k in m.samples if k[0] in JOB_FAMILIES], [])
        self.assertEqual(m.store_writes(), 5)

    def test_every_job_has_its_series_in_a_streamed_answer_too(self):
        # Over 4096 blocks in all, /metrics streams the per-block samples last (after the other
        # families, which it makes whole): the new families are in it with the same values.
        big, small = self.agent(), self.agent()
        hello(big, "big", 0, 1)
        hello(small, "small", 0, 1)
        norms = [1.0 + (i % 7) for i in range(5000)]
        for step in (1, 2):
            big.step(step, norms)
        small.step(1, NORMS)
        m = scrape_until(self.prismd, "the big job's decision and the small job's step",
                         lambda m: m.value("prism_job_decisions_total", job="big") == 1 and
                         m.has("prism_last_step", job="small") and m.store_writes() == 5)
        families = [line.split()[2] for line in m.text.splitlines() if line.startswith("# TYPE ")]
        # streamed: the per-block families last
        self.assertEqual(families[-4:], ["prism_block_sensitivity", "prism_block_precision",
                                         "prism_block_saturated_fraction", "prism_block_underflowed_fraction"])
        self.assertEqual(sum(1 for k in m.samples if k[0] == "prism_block_sensitivity"), 5000)
        self.assertEqual(sum(1 for k in m.samples if k[0] == "prism_block_precision"), 5000 + len(NORMS))
        stamp = m.value("prism_job_last_decision_timestamp_seconds", job="big")
        self.assertEqual(m.job("big"), job_values(1, stamp, not_acked=1))
        self.assertEqual(m.job("small"), job_values())
        # Two jobs' rows, two activity times, one decision.
        self.assertEqual(m.store_writes(), 5)
        for name in NEW_FAMILIES:
            self.assertIn(name, m.families)
        self.assert_job_matches_rest(m, "big")
        self.assert_job_matches_rest(m, "small")


class ReadyTest(unittest.TestCase):
    """prism_ready is 1 exactly when /readyz answers 200, on the main listener and the health one."""

    def test_prism_ready_follows_readyz(self):
        health = "127.0.0.1:%d" % free_port()
        p = tg.Prismd("--health-listen", health)
        try:
            def both():
                return p.http("/readyz")[0], http_get(health, "/readyz")[0], scrape(p).value("prism_ready")

            self.assertEqual(both(), (200, 200, 1))
            # The data directory's lock file moved away (renamed, as an operator's mv does): no lock
            # file at the path, so prismd no longer holds the directory's lock: not ready. Moved back,
            # it is the file prismd holds again: ready.
            lock = os.path.join(p.dir, "data", "prismd.lock")
            moved = os.path.join(p.dir, "data", "prismd.lock.moved")
            os.rename(lock, moved)
            self.assertEqual(both(), (503, 503, 0))
            doc = json.loads(p.http("/readyz")[1])
            self.assertEqual(doc["error"]["code"], "not_ready")
            self.assertIn("prismd.lock was removed or replaced", doc["error"]["message"])
            os.rename(moved, lock)
            self.assertEqual(both(), (200, 200, 1))
            # Removed, or replaced by another file: not the one prismd holds, not ready.
            os.remove(lock)
            self.assertEqual(both(), (503, 503, 0))
            with open(lock, "w") as f:
                f.write("12345\n")
            self.assertEqual(both(), (503, 503, 0))
            self.assertEqual(json.loads(p.http("/readyz")[1])["error"]["code"], "not_ready")
        finally:
            p.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
