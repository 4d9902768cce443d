#!/usr/bin/python3
"""What GET /v1/jobs says of each job's map and last decision (issue 13, plan13 Round 2):
precisions (blocks at each precision), bandwidth_saving_pct, last_decision_step and
last_decision_unix, and the server-sent `decision` event of a decision that left the map as it
was.

Real prismd, real gRPC streams (test_grpc's Prismd and Agent: grpcio), the event stream read with
http.client. Every answer is checked against the OpenAPI document (openapi_check); every wait is
bounded; prismd is stopped on every path. Config is test_grpc's CONFIG: a decision every second
step from step 2, apply lag 3."""

import http.client
import json
import os
import sqlite3
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_grpc as tg  # noqa: E402  (Prismd, Agent; its tests are not collected here)
import openapi_check  # noqa: E402

JOB = "job-s"
EVENTS = "/v1/jobs/%s/events" % JOB
LOWER = (3.0, 1.0)  # block 1 is the less sensitive: the decision at step 2 puts it at int8, later ones keep it
NO_DECISION = {"bandwidth_saving_pct": None, "last_decision_step": None, "last_decision_unix": None,
               "blocks_by_precision": None}


def precisions(bf16=0, int8=0):
    return {"bf16": bf16, "fp8_e4m3": 0, "fp8_e5m2": 0, "int8": int8, "int4": 0}


def by_precision(bf16=0, int8=0):
    """The last decision's blocks_by_precision (issue 17): the wire enum's order."""
    return {"bf16": bf16, "int8": int8, "fp8_e4m3": 0, "fp8_e5m2": 0, "int4": 0}


def entry(**fields):
    """The job's entry of GET /v1/jobs: fields over one connected rank of world size 1, no step."""
    doc = {"job_id": JOB, "step": None, "map_version": 0, "decided_step": 0, "effective_step": 0,
           "agents_connected": 1, "world_size": 1, "blocks": 0, "loss_spikes": 0, "loss_spike_decisions": 0,
           "blocks_rolled_back": 0, "ranks_lagging": 0, "ranks_not_acked": 0,
           "precisions": precisions()}
    doc.update(NO_DECISION)
    doc.update(fields)
    return doc


class EventStream:
    """GET .../events, read an event at a time (each checked against the document)."""

    def __init__(self, prismd):
        host, port = prismd.http_addr.split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=tg.WAIT_S)
        self.conn.request("GET", EVENTS)
        self.r = self.conn.getresponse()
        openapi_check.response("GET", EVENTS, self.r, b"")
        assert (self.r.status, self.r.getheader("Content-Type")) == (200, "text/event-stream")

    def next(self):
        """The next event: (its lines other than data, its data parsed). Keep-alive comments are
        skipped; a read waits at most WAIT_S (the socket's timeout)."""
        lines = []
        for _ in range(100):
            line = self.r.readline().decode()
            if line == "":
                raise AssertionError("the event stream ended")
            if line == "\n" and lines:
                openapi_check.sse_event(EVENTS, lines)
                data = [x for x in lines if x.startswith("data: ")]
                assert len(data) == 1, lines
                return [x for x in lines if not x.startswith("data: ")], json.loads(data[0][len("data: "):])
            if line.strip() and not line.startswith(":"):
                lines.append(line.rstrip("\n"))
        raise AssertionError("no event in 100 lines")

    def close(self):
        self.conn.close()


class JobsSummaryTest(unittest.TestCase):
    def setUp(self):
        self.prismd = tg.Prismd()
        self.agents, self.streams = [], []

    def tearDown(self):
        for s in self.streams:
            s.close()
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def agent(self):
        a = tg.Agent(self.prismd)
        self.agents.append(a)
        a.hello(JOB, 0, 1)
        self.assertEqual(a.next().WhichOneof("kind"), "welcome")
        return a

    def events(self):
        s = EventStream(self.prismd)
        self.streams.append(s)
        return s

    def job_entry(self, ready=lambda e: True):
        """The job's entry once ready(entry) holds (json_until: bounded)."""
        doc = self.prismd.json_until("/v1/jobs", lambda d: any(e["job_id"] == JOB and ready(e) for e in d["jobs"]))
        return next(e for e in doc["jobs"] if e["job_id"] == JOB)

    def telemetry_timestamps(self, records):
        doc = self.prismd.json_until("/v1/jobs/%s/telemetry" % JOB, lambda d: len(d["records"]) == records)
        return [(r["step_id"], r["timestamp"]) for r in doc["records"]]

    def restart(self):
        """kill -9, then a prismd on the same data dir."""
        for a in self.agents:
            a.close()
        self.agents = []
        for s in self.streams:
            s.close()
        self.streams = []
        self.prismd.kill()
        self.prismd = tg.Prismd(reuse=self.prismd)

    def test_precisions_and_the_last_decision_before_after_and_across_a_restart(self):
        a = self.agent()
        # A job with no report: no blocks, no decision.
        self.assertEqual(self.job_entry(), entry())
        events = self.events()
        self.assertEqual(events.next(), (["event: map", "id: 0"], {
            "job_id": JOB, "map_version": 0, "decided_step": 0, "effective_step": 0, "blocks": 0, "blocks_bf16": 0,
            "blocks_low": 0}))

        # Step 1 is no decision step: both blocks are known, at bf16, and still no decision.
        a.step(1, LOWER)
        self.assertEqual(self.job_entry(lambda e: e["step"] == 1), entry(step=1, blocks=2, precisions=precisions(bf16=2)))

        # The decision at step 2 lowers block 1: map version 1, told by a map event alone.
        before = time.time()
        a.step(2, LOWER)
        self.assertEqual(a.next().update.map_version, 1)
        self.assertEqual(events.next(), (["event: map", "id: 1"], {
            "job_id": JOB, "map_version": 1, "decided_step": 2, "effective_step": 5, "blocks": 2, "blocks_bf16": 1,
            "blocks_low": 1}))
        after = time.time()
        (_, first_time), = self.telemetry_timestamps(1)
        decided = entry(step=2, map_version=1, decided_step=2, effective_step=5, blocks=2, ranks_not_acked=1,
                        precisions=precisions(bf16=1, int8=1), bandwidth_saving_pct=25.0, last_decision_step=2,
                        last_decision_unix=first_time, blocks_by_precision=by_precision(bf16=1, int8=1))
        got = self.job_entry()
        self.assertEqual(got, decided)
        # The plan's order: the new fields after ranks_not_acked, the precisions as listed.
        self.assertEqual(list(got), ["job_id", "step", "map_version", "decided_step", "effective_step",
                                     "agents_connected", "world_size", "blocks", "loss_spikes",
                                     "loss_spike_decisions", "blocks_rolled_back", "ranks_lagging", "ranks_not_acked",
                                     "precisions", "bandwidth_saving_pct", "last_decision_step", "last_decision_unix",
                                     "blocks_by_precision"])
        self.assertEqual(list(got["precisions"]), ["bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"])
        # The decision's time is its telemetry timestamp, taken while the test waited for it.
        self.assertTrue(before <= first_time <= after, (before, first_time, after))
        # The block map answers share the job's fields but not these.
        blocks = json.loads(self.prismd.http("/v1/jobs/%s/blocks" % JOB)[1])
        self.assertEqual(set(blocks) & {"precisions", "bandwidth_saving_pct", "last_decision_step",
                                        "last_decision_unix", "ranks_lagging", "ranks_not_acked",
                                        "blocks_by_precision"}, set())

        # The decision at step 4 changes nothing: the decision step moves, the map version does
        # not, and the stream says so with a decision event.
        a.step(3, LOWER)
        a.step(4, LOWER)
        self.assertEqual(events.next(), (["event: decision"], {"job_id": JOB, "step": 4, "map_version": 1}))
        (_, t2), (_, t4) = self.telemetry_timestamps(2)
        self.assertEqual(t2, first_time)
        unchanged = dict(decided, step=4, last_decision_step=4, last_decision_unix=t4)
        self.assertEqual(self.job_entry(), unchanged)
        self.assertLessEqual(first_time, t4)

        # kill -9: the job comes back with its map, its precisions and its last decision, the
        # decision's time included (the store keeps it with the decision's summary); no agent.
        self.restart()
        restored = dict(unchanged, agents_connected=0, ranks_not_acked=0)
        self.assertEqual(self.job_entry(), restored)
        # A new stream starts with the map as it is; the next no-change decision (step 6) is a
        # decision event again.
        events = self.events()
        self.assertEqual(events.next(), (["event: map", "id: 1"], {
            "job_id": JOB, "map_version": 1, "decided_step": 2, "effective_step": 5, "blocks": 2, "blocks_bf16": 1,
            "blocks_low": 1}))
        a = self.agent()
        a.step(5, LOWER)
        a.step(6, LOWER)
        self.assertEqual(events.next(), (["event: decision"], {"job_id": JOB, "step": 6, "map_version": 1}))
        stamps = self.telemetry_timestamps(3)
        self.assertEqual([s for s, _ in stamps], [2, 4, 6])
        t6 = stamps[2][1]
        latest = dict(restored, step=6, agents_connected=1, ranks_not_acked=1, last_decision_step=6,
                      last_decision_unix=t6)
        self.assertEqual(self.job_entry(), latest)

        # The store holds the time as the summary's f64 after the sensitivities and saving (PRS3 then
        # adds blocks_by_precision and loss_spike, issue 17). A summary saved before prismd
        # kept it (PRS1: the same less that f64) comes back with its step and saving, and a null
        # time, as the document says.
        self.restart()
        db = sqlite3.connect(os.path.join(self.prismd.dir, "data", "prism.db"))
        try:
            # prismd is running: read the row, then change it with prismd stopped below.
            (summary,), = db.execute("SELECT summary FROM job_state WHERE job_id = ?", (JOB,)).fetchall()
        finally:
            db.close()
        self.assertEqual((summary[:4], len(summary)), (b"PRS3", 144))
        self.assertEqual(struct.unpack("<d", summary[88:96])[0], t6)
        self.assertEqual(self.job_entry(), dict(latest, agents_connected=0, ranks_not_acked=0))
        self.prismd.kill()
        db = sqlite3.connect(os.path.join(self.prismd.dir, "data", "prism.db"))
        try:
            db.execute("UPDATE job_state SET summary = ? WHERE job_id = ?", (b"PRS1" + summary[4:88], JOB))
            db.commit()
        finally:
            db.close()
        self.prismd = tg.Prismd(reuse=self.prismd)
        self.assertEqual(self.job_entry(), dict(latest, agents_connected=0, ranks_not_acked=0, last_decision_unix=None))


if __name__ == "__main__":
    unittest.main(verbosity=2)
