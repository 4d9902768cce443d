#!/usr/bin/python3
"""prismd's binary traces when things go wrong (DESIGN 4.6, issue 16 item 3, review fixes): GET
.../trace never answers 200 with a hole in it and never blocks on what is not a segment file; the
writer never overwrites a file, says in the next header when records were lost, counts only the
segments it deleted; an input that starts a segment is recorded after the segment's start;
telemetry_file cannot take the trace directory's name; `prismctl trace`'s arguments; the answer
against --max-streamed-answers; a trace of many small segments replays to prismd's telemetry.

The real prismd on free loopback ports with a scratch data dir, driven by grpcio agents (the
Prismd and Agent helpers of test_grpc.py). Every wait is bounded; nothing waits on a clock."""

import contextlib
import json
import os
import resource
import socket
import subprocess
import unittest

import test_grpc as g
import test_trace_record as tr
from prismtest import wait_for

pb = g.pb


def headers_of(records):
    return [(r.header.segment, r.header.restored, r.header.gap_before) for r in records
            if r.WhichOneof("record") == "header"]


@contextlib.contextmanager
def open_file_limit(n):
    """Processes started inside get at most n open files (soft and hard limit): prismd raises its
    soft limit to the hard one at start, so the hard one must be lowered for it, in the child."""
    real = subprocess.Popen

    def popen(*args, **kw):
        kw["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
        return real(*args, **kw)

    subprocess.Popen = popen
    try:
        yield
    finally:
        subprocess.Popen = real


class TraceRobustTest(unittest.TestCase):
    setUp = tr.TraceRecordTest.setUp
    tearDown = tr.TraceRecordTest.tearDown
    start = tr.TraceRecordTest.start
    agent = tr.TraceRecordTest.agent
    trace_dir = tr.TraceRecordTest.trace_dir
    segments = tr.TraceRecordTest.segments
    telemetry_records = tr.TraceRecordTest.telemetry_records
    replay = tr.TraceRecordTest.replay
    prismctl_trace = tr.TraceRecordTest.prismctl_trace

    def segment_path(self, job, number):
        return os.path.join(self.trace_dir(job), "%06d.ptrace" % number)

    def stepper(self, agent, job, blocks):
        """A function that sends the next step and returns once its decision is in the telemetry
        (the prismd must run with update_interval_steps 1: a decision at every step from 2)."""
        state = {"step": 0}

        def step():
            state["step"] += 1
            agent.send(step_report=tr.report(state["step"], 0, blocks, loss=1.0 + state["step"]))
            if state["step"] >= 2:
                self.telemetry_records(job, state["step"] - 1)
            return state["step"]

        return step

    def until(self, step, what, predicate):
        for _ in range(300):
            step()
            if predicate():
                return
        raise AssertionError("never: " + what)

    def replay_equals_telemetry(self, job, trace, telemetry):
        path = os.path.join(self.prismd.dir, job + ".trace")
        with open(path, "wb") as f:
            f.write(trace)
        p = self.replay(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        replayed = [line for line in p.stdout.decode().split("\n") if line]
        self.assertEqual([tr.without_timestamp(line) for line in replayed],
                         [tr.without_timestamp(line) for line in telemetry])
        return p.stderr.decode()

    def test_entries_that_are_not_segment_files_are_passed_over_without_blocking(self):
        prismd = self.start()
        a = self.agent()
        a.send(hello=pb.Hello(job_id="job-f", rank=0, world_size=1, layout=pb.ModelLayout(
            blocks=[pb.BlockInfo(id=0, name="b0", param_bytes_bf16=64)])))
        a.next()
        prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        self.assertEqual(self.segments("job-f"), ["000001.ptrace"])
        with open(self.segment_path("job-f", 1), "rb") as f:
            first = f.read()
        # A FIFO (an open without O_NONBLOCK would wait for a writer forever), a directory, a
        # symbolic link and a socket, each with a segment's name, newer than the real segment.
        os.mkfifo(self.segment_path("job-f", 3))
        os.mkdir(self.segment_path("job-f", 4))
        os.symlink("000001.ptrace", self.segment_path("job-f", 5))
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.bind(self.segment_path("job-f", 6))
        for _ in range(2):  # the same answer each time: nothing was left open or held
            self.assertEqual(tr.get_trace(prismd, "job-f"), (200, "application/x-prism-trace", first))

    def test_a_file_in_the_way_is_never_overwritten_and_replay_warns_of_the_skipped_numbers(self):
        prismd = self.start("--trace-segment-bytes", "4096", config_extra={"update_interval_steps": 1})
        a = self.agent()
        a.hello("job-x", 0, 1)
        a.next()
        step = self.stepper(a, "job-x", 8)
        step()
        step()  # its decision written: both steps are in the trace
        self.assertEqual(self.segments("job-x"), ["000001.ptrace"])
        # Files the writer did not list take the next numbers: a regular file and a FIFO.
        with open(self.segment_path("job-x", 2), "wb") as f:
            f.write(b"keep")
        os.mkfifo(self.segment_path("job-x", 3))
        self.until(step, "a segment after the files in the way", lambda: os.path.exists(self.segment_path("job-x", 4)))
        with open(self.segment_path("job-x", 2), "rb") as f:
            self.assertEqual(f.read(), b"keep")
        self.assertEqual(self.segments("job-x"), ["000001.ptrace", "000002.ptrace", "000003.ptrace", "000004.ptrace"])
        self.assertEqual(tr.trace_counters(prismd)["prism_trace_write_errors_total"], 0)
        telemetry = self.telemetry_records("job-x", step() - 1)
        status, _, trace = tr.get_trace(prismd, "job-x")
        self.assertEqual(status, 200)
        records = tr.decode(trace)  # "keep" is no whole record: it is left out
        self.assertEqual(headers_of(records), [(1, False, False), (4, False, False)])
        steps = [r.step.merged.step for r in records if r.WhichOneof("record") == "step"]
        self.assertEqual(steps, list(range(1, len(telemetry) + 2)))
        err = self.replay_equals_telemetry("job-x", trace, telemetry)
        self.assertIn("prismctl replay: warning: the trace's segment numbers skip 1 time (the first: segment 4 follows "
                      "segment 1): records in between are missing; decisions from there may differ from the live "
                      "ones\n", err)
        self.assertNotIn("lost records", err)

    def test_a_trace_that_cannot_be_read_whole_is_refused_not_sent_with_a_hole(self):
        with open_file_limit(128):
            prismd = self.start("--max-streamed-answers", "2")
        a = self.agent()
        a.send(hello=pb.Hello(job_id="job-m", rank=0, world_size=1, layout=pb.ModelLayout(
            blocks=[pb.BlockInfo(id=0, name="b0", param_bytes_bf16=64)])))
        a.next()
        prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        _, _, whole = tr.get_trace(prismd, "job-m")
        # More segments than prismd may open files: 503, and the slot comes back each time.
        for n in range(2, 302):
            open(self.segment_path("job-m", n), "wb").close()
        for _ in range(4):
            status, ctype, body = tr.get_trace(prismd, "job-m")
            error = json.loads(body)["error"]
            self.assertEqual((status, ctype, error["code"]), (503, "application/json", "unavailable"), body)
            self.assertRegex(error["message"], r"^job job-m's trace cannot be read now: segment 000\d\d\d\.ptrace: "
                                               r"Too many open files; try again$")
        for n in range(2, 302):
            os.remove(self.segment_path("job-m", n))
        self.assertEqual(tr.get_trace(prismd, "job-m"), (200, "application/x-prism-trace", whole))
        # A trace directory that is not a directory: 500 naming the problem.
        os.rename(self.trace_dir("job-m"), self.trace_dir("job-m") + ".moved")
        with open(self.trace_dir("job-m"), "w") as f:
            f.write("not a directory")
        status, ctype, body = tr.get_trace(prismd, "job-m")
        self.assertEqual((status, ctype, json.loads(body)["error"]), (500, "application/json", {
            "code": "internal", "message": "job job-m's trace cannot be read: the trace directory: Not a directory"}))

    def test_a_trace_directory_that_cannot_be_listed_keeps_the_trace_off_and_the_next_header_says_so(self):
        prismd = self.start()
        os.makedirs(os.path.dirname(self.trace_dir("job-l")))
        with open(self.trace_dir("job-l"), "w") as f:
            f.write("not a directory")
        a = self.agent()
        a.hello("job-l", 0, 1)
        a.next()
        for step in range(1, 3):
            a.send(step_report=tr.report(step, 0, 2))
        self.telemetry_records("job-l", 1)
        # Each record (the two steps) is lost and counted; the log says so once.
        counters = tr.trace_counters(prismd)
        self.assertEqual((counters["prism_trace_write_errors_total"], counters["prism_trace_bytes_written_total"]),
                         (2, 0))
        self.assertEqual(prismd.logs().count("cannot write the job's trace"), 1, prismd.logs())
        os.remove(self.trace_dir("job-l"))
        for step in range(3, 5):
            a.send(step_report=tr.report(step, 0, 2))
        self.telemetry_records("job-l", 2)
        self.assertEqual(self.segments("job-l"), ["000001.ptrace"])
        status, _, trace = tr.get_trace(prismd, "job-l")
        records = tr.decode(trace)
        self.assertEqual(headers_of(records), [(1, False, True)])
        self.assertEqual([r.step.merged.step for r in records if r.WhichOneof("record") == "step"], [3, 4])
        self.assertEqual(tr.trace_counters(prismd)["prism_trace_write_errors_total"], 2)

    def test_segments_that_could_not_be_made_are_not_counted_as_dropped(self):
        prismd = self.start("--trace-segment-bytes", "4096", "--trace-max-bytes", "12288",
                            config_extra={"update_interval_steps": 1})
        a = self.agent()
        a.hello("job-c", 0, 1)
        a.next()
        step = self.stepper(a, "job-c", 8)
        self.until(step, "a second segment", lambda: self.segments("job-c") == ["000001.ptrace", "000002.ptrace"])
        moved = self.trace_dir("job-c") + ".moved"
        os.rename(self.trace_dir("job-c"), moved)
        with open(self.trace_dir("job-c"), "w") as f:
            f.write("not a directory")
        self.until(step, "two segments that could not be made",
                   lambda: tr.trace_counters(prismd)["prism_trace_write_errors_total"] == 2)
        os.remove(self.trace_dir("job-c"))
        os.rename(moved, self.trace_dir("job-c"))
        # Segments 3 and 4 were never files; 5 on are. Until the oldest left is 8: 1, 2, 5, 6 and
        # 7 were deleted, and only those count.
        self.until(step, "segment 8 the oldest", lambda: self.segments("job-c")[0] == "000008.ptrace")
        counters = tr.trace_counters(prismd)
        self.assertEqual((counters["prism_trace_segments_dropped_total"], counters["prism_trace_write_errors_total"]),
                         (5, 2))
        names = self.segments("job-c")
        self.assertEqual(names, ["%06d.ptrace" % n for n in range(8, 8 + len(names))])

    def test_a_layout_of_zero_sizes_that_starts_a_segment_is_recorded_and_replays(self):
        # 150 blocks: each step record is larger than a 4096-byte segment, so that every record
        # after a step starts a segment, the reconnecting Hello's layout among them.
        n = 150
        prismd = self.start("--trace-segment-bytes", "4096")
        a = self.agent()
        a.send(hello=pb.Hello(job_id="job-z", rank=0, world_size=1, layout=pb.ModelLayout(blocks=[
            pb.BlockInfo(id=b, name="b%d" % b, param_bytes_bf16=1000 * (b + 1)) for b in range(n)])))
        a.next()
        for step in range(1, 5):
            a.send(step_report=tr.report(step, 0, n, loss=float(step)))
        self.telemetry_records("job-z", 2)
        a.close()
        self.agents.remove(a)
        b = self.agent()
        b.send(hello=pb.Hello(job_id="job-z", rank=0, world_size=1, layout=pb.ModelLayout(blocks=[
            pb.BlockInfo(id=x, name="b%d" % x, param_bytes_bf16=0) for x in range(n)])))
        b.next()
        for step in range(5, 9):
            b.send(step_report=tr.report(step, 0, n, loss=float(step)))
        telemetry = self.telemetry_records("job-z", 4)
        # The sizes count: the saving estimated before the Hello is not the one after it.
        savings = [json.loads(line)["estimated_bandwidth_saving_pct"] for line in telemetry]
        self.assertNotEqual(savings[1], savings[3])
        status, _, trace = tr.get_trace(prismd, "job-z")
        self.assertEqual(status, 200)
        records = tr.decode(trace)
        # The segment the Hello started: its header (its start has no layout: every size is 0) and
        # the Hello's layout of zeros.
        zero = [i for i, r in enumerate(records) if r.WhichOneof("record") == "layout"
                and all(x.param_bytes_bf16 == 0 for x in r.layout.blocks)]
        self.assertEqual(len(zero), 1)
        self.assertEqual(records[zero[0] - 1].WhichOneof("record"), "header")
        self.assertEqual([x.id for x in records[zero[0]].layout.blocks], list(range(n)))
        self.replay_equals_telemetry("job-z", trace, telemetry)

    def test_many_small_segments_replay_to_prismds_own_telemetry(self):
        prismd = self.start("--trace-segment-bytes", "4096")
        a = self.agent("tok-y")
        a.send(hello=pb.Hello(job_id="job-y", rank=0, world_size=1, layout=pb.ModelLayout(blocks=[
            pb.BlockInfo(id=b, name="b%d" % b, param_bytes_bf16=100 * (b + 1)) for b in range(8)])))
        a.next()
        a.send(calibration=pb.CalibrationReport(format=pb.INT8, samples=4, errors=[
            pb.BlockError(block_id=b, relative_error=0.001 * (b + 1)) for b in range(8)]))
        for step in range(1, 21):
            a.send(step_report=tr.report(step, 0, 8, loss=float(step)))
        self.telemetry_records("job-y", 10)
        status, body = prismd.http("/v1/jobs/job-y/config", method="PATCH", token="tok-y",
                                   body=json.dumps({"bf16_threshold": 0.5}))
        self.assertEqual(status, 200, body)
        for step in range(21, 41):
            a.send(step_report=tr.report(step, 0, 8, loss=float(step)))
        telemetry = self.telemetry_records("job-y", 20)
        names = self.segments("job-y")
        self.assertGreaterEqual(len(names), 3)
        self.assertEqual(names, ["%06d.ptrace" % i for i in range(1, len(names) + 1)])
        status, _, trace = tr.get_trace(prismd, "job-y")
        records = tr.decode(trace)
        self.assertEqual(headers_of(records), [(i, False, False) for i in range(1, len(names) + 1)])
        err = self.replay_equals_telemetry("job-y", trace, telemetry)
        self.assertNotIn("warning", err)
        self.assertNotIn("note", err)

    def test_the_trace_answer_holds_a_streamed_answer_slot_until_it_is_gone(self):
        prismd = self.start("--max-streamed-answers", "1")
        a = self.agent()
        a.send(hello=pb.Hello(job_id="job-h", rank=0, world_size=1, layout=pb.ModelLayout(
            blocks=[pb.BlockInfo(id=0, name="b0", param_bytes_bf16=64)])))
        a.next()
        prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        _, _, first = tr.get_trace(prismd, "job-h")
        # A segment of one 64 MiB record, more than loopback's socket buffers hold: an answer whose
        # reader does not read stays in flight.
        size = 64 << 20
        with open(self.segment_path("job-h", 2), "wb") as f:
            f.write(bytes([0x80, 0x80, 0x80, 0x20]))  # varint 64 MiB
            f.truncate(4 + size)
        host, port = prismd.http_addr.rsplit(":", 1)
        held = socket.create_connection((host, int(port)), timeout=g.WAIT_S)
        held.sendall(b"GET /v1/jobs/job-h/trace HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        for _ in range(1000):
            if b"\r\n\r\n" in head:
                break
            head += held.recv(1)
        self.assertTrue(head.startswith(b"HTTP/1.1 200 "), head)
        os.remove(self.segment_path("job-h", 2))  # the answer in flight holds it open
        status, ctype, body = tr.get_trace(prismd, "job-h")
        self.assertEqual((status, ctype, json.loads(body)["error"]), (503, "application/json", {
            "code": "unavailable", "message": "1 large answers are being sent, the limit (--max-streamed-answers); "
                                              "try again"}))
        held.close()
        wait_for("the slot back", lambda: tr.get_trace(prismd, "job-h")[0] == 200, timeout_s=g.WAIT_S * 3)
        self.assertEqual(tr.get_trace(prismd, "job-h"), (200, "application/x-prism-trace", first))

    def test_telemetry_file_cannot_be_the_trace_directory(self):
        prismd = self.start()
        a = self.agent("tok-n")
        a.hello("job-n", 0, 1)
        a.next()
        prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        status, body = prismd.http("/v1/jobs/job-n/config", method="PATCH", token="tok-n",
                                   body=json.dumps({"telemetry_file": "trace"}))
        self.assertEqual((status, json.loads(body)["error"]), (400, {
            "code": "invalid_argument", "message": "telemetry_file: \"trace\" is reserved: prismd keeps the job's "
                                                  "binary trace in the directory \"trace\" of the job's directory"}))

    def test_prismctl_trace_arguments(self):
        prismd = self.start()
        a = self.agent()
        a.send(hello=pb.Hello(job_id="job-p", rank=0, world_size=1, layout=pb.ModelLayout(
            blocks=[pb.BlockInfo(id=0, name="b0", param_bytes_bf16=64)])))
        a.next()
        prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        _, _, trace = tr.get_trace(prismd, "job-p")
        for bad in ["a b", "x/y", "x?y", ".x", "j%41", "\u00e9", "j" * 129]:
            p = self.prismctl_trace(bad, "-o", os.path.join(prismd.dir, "x.trace"))
            shown = bad if len(bad) <= 128 else bad[:128] + "..."
            self.assertEqual((p.returncode, p.stderr.decode()), (2, "prismctl trace: \"%s\" is not a job id (1 to 128 "
                             "letters, digits, '-', '_' or '.', starting with a letter or digit)\n" % shown), bad)
        self.assertEqual(os.listdir(prismd.dir).count("x.trace"), 0)
        # A trailing '/' on the server's URL, and -o - for stdout.
        p = self.prismctl_trace("--server", "http://%s//" % prismd.http_addr, "job-p", "-o", "-")
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, trace, b""))
        # The other REST commands share the URL helper.
        env = dict(os.environ)
        env.pop("PRISM_TOKEN", None)
        p = tr.run(os.path.join(tr.BIN, "prismctl"), "--server", "http://%s/" % prismd.http_addr, "config", "get",
                   "job-p", env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("update_interval_steps", json.loads(p.stdout))


if __name__ == "__main__":
    unittest.main()
