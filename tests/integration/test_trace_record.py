#!/usr/bin/python3
"""prismd records each job's binary trace (DESIGN 4.6, issue 16 item 3) and `prismctl replay` of it
decides as prismd did live (item 4's cross-check).

The real prismd on free loopback ports with a scratch data dir, driven by grpcio agents (the
Prismd and Agent helpers of test_grpc.py); the trace is downloaded over REST and with `prismctl
trace`, and decoded here with the prism_pb2 that protoc generated from proto/prism/v1/prism.proto.
Every wait is bounded; nothing waits on a clock."""

import json
import os
import resource
import pty
import shutil
import subprocess
import tempfile
import unittest
import urllib.request

import openapi_check
import test_grpc as g
from prismtest import wait_for

pb = g.pb
BIN = os.path.join(g.BUILD, "service")
TELEMETRY = "selective_precision_telemetry.jsonl"


def varint(data, pos):
    """(value, next position) of the base-128 varint at data[pos]."""
    value, shift = 0, 0
    for i in range(10):
        b = data[pos + i]
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos + i + 1
    raise AssertionError("a length prefix longer than 10 bytes at byte %d" % pos)


def decode(data):
    """The TraceRecords of a binary trace; every byte must belong to a whole record."""
    records, pos = [], 0
    for _ in range(len(data) + 1):
        if pos == len(data):
            return records
        size, pos = varint(data, pos)
        if pos + size > len(data):
            raise AssertionError("a record of %d bytes runs past the end at byte %d" % (size, pos))
        r = pb.TraceRecord()
        r.ParseFromString(data[pos:pos + size])
        records.append(r)
        pos += size
    raise AssertionError("unreachable")


def kinds(records):
    return [r.WhichOneof("record") for r in records]


def get_trace(prismd, job, token=None):
    """(status, Content-Type, body bytes) of GET /v1/jobs/JOB/trace, checked against openapi.json."""
    req = urllib.request.Request("http://%s/v1/jobs/%s/trace" % (prismd.http_addr, job))
    if token:
        req.add_header("Authorization", "Bearer " + token)
    answer = openapi_check.urlopen(req, timeout=g.WAIT_S)
    return answer.status, answer.headers.get("Content-Type"), answer.body


def metrics(prismd):
    """The samples of /metrics: {"name{labels}": value}."""
    status, body = prismd.http("/metrics")
    assert status == 200, body
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def trace_counters(prismd):
    m = metrics(prismd)
    return {k: int(v) for k, v in m.items() if k.startswith("prism_trace_")}


def run(*args, **kw):
    """A command's CompletedProcess (stdout and stderr captured as bytes unless kw redirects them)."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(list(args), timeout=60, **kw)


def without_timestamp(line):
    """A telemetry record as an ordered structure of (key, value) pairs, less its timestamp: equal
    when the records have the same keys in the same order with the same values."""
    return json.loads(line, object_pairs_hook=lambda pairs: [p for p in pairs if p[0] != "timestamp"])


def norms(step, rank, n):
    """Gradient norms of each block, by step and rank: one block in turn is hot for 4 steps (bf16),
    the others cool (low), so that blocks switch both ways at the decisions."""
    hot = (step // 4) % n
    return [10.0 + rank if b == hot else 1.0 + 0.1 * rank + 0.05 * b for b in range(n)]


def report(step, rank, n, loss=None):
    blocks = [pb.BlockGradStats(block_id=b, l2_norm=x, max_abs=x / 3, mean=0.001 * (b + 1), variance=0.01 * x,
                                numel=1000 + b, nonfinite=0)
              for b, x in enumerate(norms(step, rank, n))]
    r = pb.StepReport(step=step, blocks=blocks)
    if loss is not None:
        r.loss = loss
    return r


class TraceRecordTest(unittest.TestCase):
    def setUp(self):
        self.prismd = None
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        if self.prismd:
            code = self.prismd.stop()
            self.assertEqual(code, 0, self.prismd.logs())

    def start(self, *extra, config_extra=None, reuse=None):
        self.prismd = g.Prismd(*extra, config_extra=config_extra, reuse=reuse)
        return self.prismd

    def agent(self, token=None):
        a = g.Agent(self.prismd, token)
        self.agents.append(a)
        return a

    def scratch(self):
        d = tempfile.mkdtemp(prefix="prism-trace-test-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def trace_dir(self, job):
        return os.path.join(self.prismd.dir, "data", "jobs", job, "trace")

    def segments(self, job):
        """The segment files of the job's trace (none before its first record)."""
        d = self.trace_dir(job)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def telemetry_records(self, job, count):
        """Waits for the job's telemetry file to hold count records; returns its lines."""
        path = os.path.join(self.prismd.dir, "data", "jobs", job, TELEMETRY)

        def lines():
            if not os.path.exists(path):
                return None
            with open(path) as f:
                got = [line for line in f.read().split("\n") if line]
            return got if len(got) == count else None

        return wait_for("%d telemetry records of %s" % (count, job), lines, timeout_s=g.WAIT_S * 3)

    def replay(self, trace, *extra):
        return run(os.path.join(BIN, "prismctl"), "replay", *extra, trace)

    def prismctl_trace(self, *args, **kw):
        env = dict(os.environ, PRISM_SERVER="http://" + self.prismd.http_addr)
        env.pop("PRISM_TOKEN", None)
        return run(os.path.join(BIN, "prismctl"), "trace", *args, env=env, **kw)

    def test_a_job_is_recorded_in_order_and_replays_to_prismds_own_telemetry(self):
        prismd = self.start()
        layout = pb.ModelLayout(fingerprint=bytes(range(32)), model_id="m", blocks=[
            pb.BlockInfo(id=b, name="h.%d" % b, param_bytes_bf16=1000 * (b + 1)) for b in range(4)])
        ranks = [self.agent("tok-t"), self.agent("tok-t")]
        for rank, a in enumerate(ranks):  # one after the other: the trace's order is the Hellos' order
            a.send(hello=pb.Hello(job_id="job-t", rank=rank, world_size=2, layout=layout))
            self.assertTrue(a.next().welcome.calibration_needed)
        status, config_before = prismd.http("/v1/jobs/job-t/config")
        self.assertEqual(status, 200)
        errors = [0.001, 0.002, 0.003, 0.004]
        ranks[0].send(calibration=pb.CalibrationReport(format=pb.INT8, samples=4, errors=[
            pb.BlockError(block_id=b, relative_error=e) for b, e in enumerate(errors)]))
        sent = {}
        for step in range(1, 9):
            for rank, a in enumerate(ranks):
                r = report(step, rank, 4, loss=None if step % 3 == 0 else 2.0 + step + rank * 0.5)
                sent[(step, rank)] = r
                a.send(step_report=r)
        self.telemetry_records("job-t", 4)  # decisions at 2, 4, 6, 8: step 8 is recorded
        status, body = prismd.http("/v1/jobs/job-t/config", method="PATCH", token="tok-t",
                                   body=json.dumps({"bf16_threshold": 0.5, "hysteresis_margin": 0.05}))
        self.assertEqual(status, 200, body)
        patched = json.loads(body)["config"]
        for step in range(9, 17):
            for rank, a in enumerate(ranks):
                r = report(step, rank, 4, loss=1.0 + rank)
                sent[(step, rank)] = r
                a.send(step_report=r)
        telemetry = self.telemetry_records("job-t", 8)

        status, ctype, trace = get_trace(prismd, "job-t")
        self.assertEqual((status, ctype), (200, "application/x-prism-trace"))
        records = decode(trace)
        # The segment's start (header; the layout the policy holds, the first Hello's), the first
        # Hello's layout record (it started the segment and follows its start), the second Hello's,
        # the calibration report, 8 merged steps, the PATCH, 8 more steps.
        self.assertEqual(kinds(records), ["header", "layout", "layout", "layout", "calibration"] + ["step"] * 8 +
                         ["config_json"] + ["step"] * 8)
        h = records[0].header
        self.assertEqual((h.trace_version, h.job_id, h.segment, h.restored, h.gap_before),
                         (1, "job-t", 1, False, False))
        self.assertEqual(json.loads(h.config_json), json.loads(config_before))
        for r in records[1:4]:
            self.assertEqual([(b.id, b.param_bytes_bf16) for b in r.layout.blocks],
                             [(0, 1000), (1, 2000), (2, 3000), (3, 4000)])
        cal = records[4].calibration
        self.assertEqual((cal.format, [(e.block_id, e.relative_error) for e in cal.errors]),
                         (pb.INT8, list(enumerate(errors))))
        self.assertEqual(json.loads(records[13].config_json), patched)
        steps = [r.step for r in records if r.WhichOneof("record") == "step"]
        self.assertEqual([s.merged.step for s in steps], list(range(1, 17)))
        for s in steps:
            a, b = sent[(s.merged.step, 0)], sent[(s.merged.step, 1)]
            self.assertEqual((s.ranks, s.map_version_bumped), (2, False))
            if a.HasField("loss"):
                self.assertEqual(s.merged.loss, (a.loss + b.loss) / 2)
            else:
                self.assertFalse(s.merged.HasField("loss"))
            self.assertEqual([(x.block_id, x.l2_norm, x.max_abs, x.numel, x.nonfinite) for x in s.merged.blocks],
                             [(x.block_id, (x.l2_norm + y.l2_norm) / 2, max(x.max_abs, y.max_abs), x.numel + y.numel,
                               0) for x, y in zip(a.blocks, b.blocks)])
        # On disk: one segment, the same bytes; /metrics counted each record and byte.
        self.assertEqual(self.segments("job-t"), ["000001.ptrace"])
        with open(os.path.join(self.trace_dir("job-t"), "000001.ptrace"), "rb") as f:
            self.assertEqual(f.read(), trace)
        self.assertEqual(trace_counters(prismd), {
            "prism_trace_bytes_written_total": len(trace),
            'prism_trace_records_total{kind="header"}': 1, 'prism_trace_records_total{kind="layout"}': 3,
            'prism_trace_records_total{kind="calibration"}': 1, 'prism_trace_records_total{kind="config"}': 1,
            'prism_trace_records_total{kind="step"}': 16, "prism_trace_segments_dropped_total": 0,
            "prism_trace_write_errors_total": 0})

        # prismctl trace: to a file, and to stdout when it is not a terminal.
        out = os.path.join(prismd.dir, "run.trace")
        p = self.prismctl_trace("job-t", "-o", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr.decode(), "prismctl trace: job job-t: %d bytes written to %s\n" % (len(trace), out))
        with open(out, "rb") as f:
            self.assertEqual(f.read(), trace)
        self.assertFalse(os.path.exists(out + ".part"))
        p = self.prismctl_trace("--url", "http://" + prismd.http_addr, "job-t")
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, trace, b""))

        # The cross-check: the replay of the downloaded trace (its own config: no --config) prints
        # prismd's telemetry records exactly, but for their timestamps.
        p = self.replay(out)
        self.assertEqual(p.returncode, 0, p.stderr)
        replayed = [line for line in p.stdout.decode().split("\n") if line]
        self.assertEqual([without_timestamp(line) for line in replayed], [without_timestamp(line) for line in telemetry])
        # ... and the run it checks switched blocks both before and after the PATCH.
        changes = [json.loads(line)["precision_changes"] for line in telemetry]
        self.assertTrue(any(changes[:4]) and any(changes[4:]), changes)

    def test_segments_are_bounded_the_oldest_dropped_and_counted(self):
        prismd = self.start("--trace-segment-bytes", "4096", "--trace-max-bytes", "10000")
        a = self.agent()
        a.hello("job-s", 0, 1)
        a.next()
        for step in range(1, 61):
            a.send(step_report=report(step, 0, 8, loss=float(step)))
        self.telemetry_records("job-s", 30)
        names = self.segments("job-s")
        numbers = [int(n.split(".")[0]) for n in names]
        self.assertEqual(names, ["%06d.ptrace" % n for n in numbers])
        first, last = numbers[0], numbers[-1]
        self.assertEqual(numbers, list(range(first, last + 1)))
        self.assertGreater(first, 1)
        sizes = [os.path.getsize(os.path.join(self.trace_dir("job-s"), n)) for n in names]
        self.assertLessEqual(sum(sizes), 10000)
        self.assertTrue(all(s <= 4096 for s in sizes), sizes)
        counters = trace_counters(prismd)
        self.assertEqual(counters["prism_trace_segments_dropped_total"], first - 1)
        self.assertEqual(counters['prism_trace_records_total{kind="header"}'], last)
        self.assertEqual(counters['prism_trace_records_total{kind="step"}'], 60)
        self.assertEqual(counters["prism_trace_write_errors_total"], 0)

        status, _, trace = get_trace(prismd, "job-s")
        self.assertEqual(status, 200)
        on_disk = b""
        for n in names:
            with open(os.path.join(self.trace_dir("job-s"), n), "rb") as f:
                on_disk += f.read()
        self.assertEqual(trace, on_disk)
        records = decode(trace)
        # Each segment starts with its header; the steps that remain run without a gap to 60.
        self.assertEqual(records[0].WhichOneof("record"), "header")
        self.assertEqual([r.header.segment for r in records if r.WhichOneof("record") == "header"], numbers)
        self.assertEqual(set(kinds(records)), {"header", "step"})
        steps = [r.step.merged.step for r in records if r.WhichOneof("record") == "step"]
        self.assertEqual(steps, list(range(steps[0], 61)))
        self.assertGreater(steps[0], 1)
        # What is left still replays, with a note that it starts late.
        path = os.path.join(prismd.dir, "bounded.trace")
        with open(path, "wb") as f:
            f.write(trace)
        p = self.replay(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"starts after older segments were dropped", p.stderr)

    def test_a_restart_continues_the_numbering_with_a_restored_header(self):
        prismd = self.start()
        layout = pb.ModelLayout(blocks=[pb.BlockInfo(id=b, name="b%d" % b, param_bytes_bf16=500) for b in range(3)])
        a = self.agent("tok-k")
        a.send(hello=pb.Hello(job_id="job-k", rank=0, world_size=1, layout=layout))
        a.next()
        for step in range(1, 5):
            a.send(step_report=report(step, 0, 3))
        self.telemetry_records("job-k", 2)
        _, _, before = get_trace(prismd, "job-k")
        a.close()
        self.agents.remove(a)
        prismd.kill()
        prismd = self.start(reuse=prismd)
        # Restored, nothing new yet: the trace as it was.
        self.assertEqual(get_trace(prismd, "job-k")[2], before)
        b = self.agent("tok-k")
        b.send(hello=pb.Hello(job_id="job-k", rank=0, world_size=1, layout=layout))
        b.next()
        for step in range(5, 9):
            b.send(step_report=report(step, 0, 3))
        telemetry = self.telemetry_records("job-k", 4)
        self.assertEqual(self.segments("job-k"), ["000001.ptrace", "000002.ptrace"])
        status, _, trace = get_trace(prismd, "job-k")
        self.assertEqual((status, trace[:len(before)]), (200, before))
        records = decode(trace)
        # Each segment: its header, the layout its policy holds, the Hello's layout that started
        # it, the steps; the second's header says restored.
        segment = ["header", "layout", "layout"] + ["step"] * 4
        self.assertEqual(kinds(records), segment + segment)
        self.assertEqual([(r.header.segment, r.header.restored) for r in records if r.WhichOneof("record") == "header"],
                         [(1, False), (2, True)])
        for r in records[8:10]:
            self.assertEqual([(x.id, x.param_bytes_bf16) for x in r.layout.blocks], [(0, 500), (1, 500), (2, 500)])
        path = os.path.join(prismd.dir, "restart.trace")
        with open(path, "wb") as f:
            f.write(trace)
        p = self.replay(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"continues after prismd restored the job", p.stderr)
        # The same decisions: the kill -9 came right after the decision at step 4 was written
        # (telemetry_records waited for it), and prismd saves a job's policy state with each
        # decision, so the store held every step the trace holds and the restored policy went on
        # from the state the replay reaches at the end of segment 1. A kill between two decisions
        # would lose the steps since the last one from the store (not from the trace), and the
        # replay could then differ: that is what the note on stderr is for.
        replayed = [line for line in p.stdout.decode().split("\n") if line]
        self.assertEqual([without_timestamp(line) for line in replayed], [without_timestamp(line) for line in telemetry])

    def test_a_failed_write_is_counted_logged_once_and_the_trace_resumes_at_its_next_segment(self):
        prismd = self.start("--trace-segment-bytes", "4096", config_extra={"update_interval_steps": 1})
        a = self.agent()
        a.hello("job-w", 0, 1)
        a.next()
        state = {"step": 0}

        def step():
            """One more step, returned once its decision is on disk (a decision at every step from 2)."""
            state["step"] += 1
            a.send(step_report=report(state["step"], 0, 8))
            if state["step"] >= 2:
                self.telemetry_records("job-w", state["step"] - 1)

        def until(what, predicate):
            for _ in range(200):
                step()
                if predicate():
                    return
            raise AssertionError("never: " + what)

        until("a second segment", lambda: len(self.segments("job-w")) == 2)
        # The trace directory goes away and a file takes its name: the next segment cannot be made.
        moved = self.trace_dir("job-w") + ".moved"
        os.rename(self.trace_dir("job-w"), moved)
        with open(self.trace_dir("job-w"), "w") as f:
            f.write("not a directory")
        until("a failed segment", lambda: trace_counters(prismd)["prism_trace_write_errors_total"] == 1)
        until("a second failed segment", lambda: trace_counters(prismd)["prism_trace_write_errors_total"] == 2)
        self.assertEqual(prismd.logs().count("cannot write the job's trace"), 1, prismd.logs())
        os.remove(self.trace_dir("job-w"))
        os.rename(moved, self.trace_dir("job-w"))
        until("a segment after the failures", lambda: len(self.segments("job-w")) == 3)
        self.assertEqual(self.segments("job-w"), ["000001.ptrace", "000002.ptrace", "000005.ptrace"])
        self.assertEqual(trace_counters(prismd)["prism_trace_write_errors_total"], 2)
        status, _, trace = get_trace(prismd, "job-w")
        records = decode(trace)
        # Segment 5's header says records were lost before it (those of segments 3 and 4).
        headers = [(r.header.segment, r.header.restored, r.header.gap_before) for r in records
                   if r.WhichOneof("record") == "header"]
        self.assertEqual(headers, [(1, False, False), (2, False, False), (5, False, True)])
        steps = [r.step.merged.step for r in records if r.WhichOneof("record") == "step"]
        self.assertEqual(steps, sorted(steps))
        self.assertEqual(steps[-1], state["step"])
        # The replay warns of both: the numbers skip from 2 to 5, and segment 5 follows lost records.
        path = os.path.join(prismd.dir, "gap.trace")
        with open(path, "wb") as f:
            f.write(trace)
        p = self.replay(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        err = p.stderr.decode().split("\n")
        self.assertIn("prismctl replay: warning: the trace's segment numbers skip 1 time (the first: segment 5 follows "
                      "segment 2): records in between are missing; decisions from there may differ from the live ones",
                      err)
        self.assertIn("prismctl replay: warning: prismd lost records of the job before 1 segment (a failed write; the "
                      "first: segment 5); decisions from there may differ from the live ones", err)

    def test_jobs_without_a_trace_unknown_jobs_and_terminals(self):
        prismd = self.start()
        a = self.agent()
        a.hello("job-e", 0, 1)  # no layout: the policy was given nothing yet
        a.next()
        prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        self.assertEqual(get_trace(prismd, "job-e"), (200, "application/x-prism-trace", b""))
        status, ctype, body = get_trace(prismd, "nope")
        self.assertEqual((status, ctype, json.loads(body)["error"]),
                         (404, "application/json", {"code": "not_found", "message": "job nope does not exist"}))
        p = self.prismctl_trace("nope", "-o", os.path.join(prismd.dir, "x.trace"))
        self.assertEqual((p.returncode, p.stderr.decode()),
                         (2, "prismctl trace: job nope: the server answered 404: job nope does not exist\n"))
        self.assertFalse(os.path.exists(os.path.join(prismd.dir, "x.trace")))
        self.assertFalse(os.path.exists(os.path.join(prismd.dir, "x.trace.part")))
        # Binary to a terminal: refused before anything is asked.
        master, slave = pty.openpty()
        try:
            p = self.prismctl_trace("job-e", stdout=slave, stderr=subprocess.PIPE)
        finally:
            os.close(slave)
            os.close(master)
        self.assertEqual((p.returncode, p.stderr.decode()), (2, "prismctl trace: the trace is binary and stdout is a "
                                                                "terminal: redirect stdout or use -o FILE\n"))
        p = self.prismctl_trace("--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"usage: prismctl trace JOB", p.stdout)
        p = self.prismctl_trace("job-e", "--bogus")
        self.assertEqual((p.returncode, p.stderr), (2, b"prismctl trace: unknown option --bogus (see --help)\n"))
        p = self.prismctl_trace()
        self.assertEqual(p.returncode, 2)

    def test_trace_max_bytes_0_keeps_no_trace(self):
        prismd = self.start("--trace-max-bytes", "0")
        a = self.agent()
        a.hello("job-0", 0, 1)
        a.next()
        for step in range(1, 5):
            a.send(step_report=report(step, 0, 2))
        self.telemetry_records("job-0", 2)
        self.assertFalse(os.path.exists(self.trace_dir("job-0")))
        self.assertEqual(get_trace(prismd, "job-0"), (200, "application/x-prism-trace", b""))
        self.assertEqual(trace_counters(prismd)["prism_trace_bytes_written_total"], 0)

    def test_prismd_raises_its_open_file_soft_limit_to_the_hard_one(self):
        # Every job holds its telemetry file and its trace segment open: prismd takes the hard
        # limit at start so that a thousand jobs do not run out of descriptors.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        low = min(256, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        try:
            prismd = self.start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        with open("/proc/%d/limits" % prismd.proc.pid) as f:
            row = [line.split() for line in f if line.startswith("Max open files")][0]
        hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        self.assertEqual(row[3:5], [hard_text, hard_text])

    def test_deleting_a_job_deletes_its_trace(self):
        token_file = os.path.join(self.scratch(), "admin-token")
        with open(token_file, "w") as f:
            f.write("adm\n")
        prismd = self.start("--admin-token-file", token_file)
        a = self.agent()
        a.hello("job-d", 0, 1)
        a.next()
        for step in range(1, 3):
            a.send(step_report=report(step, 0, 2))
        self.telemetry_records("job-d", 1)
        self.assertEqual(self.segments("job-d"), ["000001.ptrace"])
        status, body = prismd.http("/v1/jobs/job-d", method="DELETE", token="adm")
        self.assertEqual(status, 200, body)
        self.assertFalse(os.path.exists(os.path.dirname(self.trace_dir("job-d"))))
        self.assertEqual(get_trace(prismd, "job-d")[0], 404)


if __name__ == "__main__":
    unittest.main()
