#!/usr/bin/python3
"""The numerics config on the wire (issue 17, part C1): real prismd, real prism-agents (one per
rank, each with its own shared directory) and trainers through libprism's Python binding.

- The Welcome's numerics fields (scale_mode, amax_history_len, scale_margin, low_precision "auto"
  with low_formats, the formats prismd wants calibrated) reach every rank's client state() with the
  exact values of the job's config; a PATCH of them reaches every rank at the decision that applies
  it (and not before); a PATCH of keys agents do not use sends nothing.
- Under "auto" the trainer's fingerprint is its own (format 255 in the hashed bytes), and the
  calibration formats are exactly those the fingerprint has no errors for: calibrate one format,
  restart the trainer and its agent, only the others are wanted; calibrate them, none.
- The saturated and underflowed fractions a trainer reports come out in prismd's binary trace (GET
  /v1/jobs/{job}/trace, decoded with prism_pb2) merged as the mean over the ranks that sent them,
  absent where no rank did; a fraction outside [0, 1] is refused by the client naming the block.

Loopback only; every wait is bounded (prismtest.wait_for); every process is stopped on every path."""

import hashlib
import json
import math
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_grpc as g  # noqa: E402  (puts BUILD/python-gen on sys.path)
from prismtest import free_port, http_get, wait_for  # noqa: E402
from test_trace_record import decode, get_trace  # noqa: E402

SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "python"))
import prism  # noqa: E402
import prism.client  # noqa: E402

import numpy as np  # noqa: E402

pb = g.pb
AGENT = os.path.join(os.path.abspath(g.BUILD), "agent", "prism-agent")
BLOCKS = [("b0", [(4, 4)]), ("b1", [(4, 4)]), ("b2", [(4, 4)]), ("b3", [(4, 4)])]
NUMERICS = {"low_precision": "auto", "low_formats": ["int4", "fp8_e5m2", "int8"], "scale_mode": "delayed",
            "amax_history_len": 8, "scale_margin": -2, "run_calibration": True, "calibration_samples": 3}


class Proc:
    def __init__(self, argv, log):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fd)
        finally:
            os.close(fd)
        self.log = log

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                return self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        return self.p.returncode


def stats(scale):
    return [{"l2_norm": s, "max_abs": s, "mean": 0.0, "variance": 0.01, "numel": 16, "nonfinite": 0} for s in scale]


def expected_fingerprint(model_id, blocks, fmt):
    """include/prism/client.h's encoding, granularity block (2) of 128."""
    b = b"prism.fingerprint.v1" + struct.pack("<Q", len(model_id)) + model_id.encode()
    b += struct.pack("<IIQI", fmt, 2, 128, len(blocks))
    for name, shapes in blocks:
        words = []
        for s in shapes:
            words += [len(s), *s]
        b += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<Q", len(words))
        b += b"".join(struct.pack("<Q", w) for w in words)
    return hashlib.sha256(b).digest()


def two_blocks(step):
    """Norms 3 and 1: relative 1.5 / 0.5, grad scores 0.75 / 0.25, so the first decision puts block 1 low."""
    return pb.StepReport(step=step, blocks=[pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=16)
                                            for i, n in enumerate((3.0, 1.0))])


class NumericsWireTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-numerics-wire-")
        self.procs, self.clients = [], []
        self.prismd = None

    def tearDown(self):
        for c in self.clients:
            c.close()
        for p in self.procs:
            p.stop(signal.SIGKILL)
        if self.prismd:
            code = self.prismd.stop()
            self.assertEqual(code, 0, self.prismd.logs())
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, config):
        self.prismd = g.Prismd(config_extra=config)

    def agent(self, shared):
        metrics = "127.0.0.1:%d" % free_port()
        p = Proc([AGENT, "--prismd", self.prismd.grpc_addr, "--dir", os.path.join(self.dir, shared),
                  "--metrics-listen", metrics, "--device", "cpu", "--profile-budget-ms", "100"],
                 os.path.join(self.dir, shared + ".log"))
        self.procs.append(p)
        wait_for("the agent's /readyz", lambda: http_get(metrics, "/readyz", openapi=False)[0] == 200)
        return p

    def client(self, job, rank, world, shared, low="auto"):
        c = prism.Client(job_id=job, rank=rank, world_size=world, dir=os.path.join(self.dir, shared),
                         reconnect_interval_ms=50)
        c.register("m", BLOCKS, low)
        self.clients.append(c)
        return c

    def ranks(self, job, world, low="auto"):
        """world ranks, each an agent with its own directory and a client; returned once every
        client's state shows a welcomed agent."""
        out = []
        for r in range(world):
            self.agent("%s-%d" % (job, r))
            out.append(self.client(job, r, world, "%s-%d" % (job, r), low))
        for c in out:
            self.state_until(c, lambda s: s["upstream_connected"])
        return out

    def state_until(self, c, ready, what="the client's state"):
        def poll():
            c.begin_step(0)
            s = c.state()
            return s if ready(s) else None
        return wait_for(what, poll, timeout_s=g.WAIT_S * 2)

    def numerics(self, s):
        return {k: s[k] for k in ("scale_mode", "amax_history_len", "scale_margin", "low_precision", "low_formats",
                                  "calibration_needed", "calibration_formats")}

    def test_welcome_and_patched_numerics_reach_every_rank(self):
        self.start(NUMERICS)
        ranks = self.ranks("job-w", 2)
        for c in ranks:
            c.begin_step(0)
            self.assertEqual(self.numerics(c.state()), {
                "scale_mode": "delayed", "amax_history_len": 8, "scale_margin": -2, "low_precision": "auto",
                "low_formats": ["int4", "fp8_e5m2", "int8"], "calibration_needed": True,
                "calibration_formats": ["int4", "fp8_e5m2", "int8"]})
        status, body = self.prismd.http("/v1/jobs/job-w/config", "PATCH", json.dumps(
            {"scale_mode": "pow2", "amax_history_len": 4, "scale_margin": 3, "low_formats": ["fp8_e4m3", "int8"]}))
        self.assertEqual(status, 200, body)
        # Step 1: no decision, so the PATCH is not in force and prismd sent nothing.
        for r, c in enumerate(ranks):
            self.assertTrue(c.report_stats(1, stats([1.0, 2.0, 3.0, 4.0])))
        for c in ranks:
            c.begin_step(1)
            self.assertEqual(c.state()["scale_mode"], "delayed")
        # Step 2 is the first decision: it applies the config, and every rank's agent gets it.
        for c in ranks:
            self.assertTrue(c.report_stats(2, stats([1.0, 2.0, 3.0, 4.0])))
        for c in ranks:
            s = self.state_until(c, lambda s: s["scale_mode"] == "pow2", "the patched scale mode")
            self.assertEqual(self.numerics(s), {
                "scale_mode": "pow2", "amax_history_len": 4, "scale_margin": 3, "low_precision": "auto",
                "low_formats": ["fp8_e4m3", "int8"], "calibration_needed": True,
                "calibration_formats": ["fp8_e4m3", "int8"]})
        # A fixed low_precision: low_precision names it, the one format wanted is it.
        status, body = self.prismd.http("/v1/jobs/job-w/config", "PATCH",
                                        json.dumps({"low_precision": "fp8_e5m2", "scale_mode": "static"}))
        self.assertEqual(status, 200, body)
        for step in (3, 4):
            for c in ranks:
                self.assertTrue(c.report_stats(step, stats([1.0, 2.0, 3.0, 4.0])))
        for c in ranks:
            s = self.state_until(c, lambda s: s["scale_mode"] == "static", "the second patch")
            self.assertEqual(self.numerics(s), {
                "scale_mode": "static", "amax_history_len": 4, "scale_margin": 3, "low_precision": "fp8_e5m2",
                "low_formats": ["fp8_e4m3", "int8"], "calibration_needed": True, "calibration_formats": ["fp8_e5m2"]})

    def test_a_table_without_numerics_reads_as_the_defaults(self):
        """An older agent leaves the numerics block (hints.h, offset 896) zero: the client then shows
        the defaults, with the one format the table's low_precision names."""
        self.start(NUMERICS)
        (c,) = self.ranks("job-o", 1)
        with open(os.path.join(self.dir, "job-o-0", "prism-hints"), "r+b") as f:
            with mmap.mmap(f.fileno(), 1024) as m:
                self.assertEqual(struct.unpack_from("<I", m, 896)[0], 1)  # published by this agent
                m[896:936] = bytes(40)
        c.begin_step(0)
        self.assertEqual(self.numerics(c.state()), {
            "scale_mode": "current", "amax_history_len": 16, "scale_margin": 0, "low_precision": "int8",
            "low_formats": ["int8"], "calibration_needed": True, "calibration_formats": ["int8"]})

    def test_only_keys_agents_use_are_pushed(self):
        """A grpcio rank sees the push itself: a PATCH of thresholds sends no ConfigUpdate; a PATCH of
        scale_mode sends one before the decision's map, with the exact config in force."""
        self.start(dict(NUMERICS, run_calibration=False))
        a = g.Agent(self.prismd)
        try:
            a.send(hello=pb.Hello(job_id="job-p", rank=0, world_size=1))
            w = a.next().welcome
            c = w.config
            self.assertEqual((c.low_precision_auto, list(c.low_formats), c.low_precision, c.scale_mode,
                              c.amax_history_len, c.scale_margin, w.calibration_needed, list(w.calibration_formats)),
                             (True, [pb.INT4, pb.FP8_E5M2, pb.INT8], pb.INT8, pb.SCALE_DELAYED, 8, -2, False, []))
            self.assertEqual(self.prismd.http("/v1/jobs/job-p/config", "PATCH", '{"bf16_threshold": 0.9}')[0], 200)
            for step in (1, 2):
                a.send(step_report=two_blocks(step))
            m = a.next()  # block 1 (score 0.25) goes low: a map, and no config message for the thresholds
            self.assertEqual(m.WhichOneof("kind"), "update")
            self.assertEqual(self.prismd.http("/v1/jobs/job-p/config", "PATCH", '{"scale_mode": "current"}')[0], 200)
            for step in (3, 4):
                a.send(step_report=two_blocks(step))
            m = a.next()
            self.assertEqual(m.WhichOneof("kind"), "config")
            self.assertEqual((m.config.config.scale_mode, m.config.config.bf16_threshold,
                              m.config.calibration_needed, list(m.config.calibration_formats)),
                             (pb.SCALE_CURRENT, 0.9, False, []))
        finally:
            a.close()

    def test_calibration_needed_speaks_of_low_precision_for_older_agents(self):
        """Under auto, Welcome.calibration_needed is about PolicyConfig.low_precision alone (the
        last of low_formats, the one format an agent older than calibration_formats knows): once
        that format is calibrated, such an agent is no longer asked on every new stream, while
        calibration_formats still lists the other formats, and a current agent still calibrates."""
        self.start(NUMERICS)
        fingerprint = bytes(range(32))
        layout = pb.ModelLayout(fingerprint=fingerprint, model_id="m", blocks=[
            pb.BlockInfo(id=0, name="h.0", param_bytes_bf16=1000), pb.BlockInfo(id=1, name="h.1", param_bytes_bf16=3000)])

        def welcome(job):
            a = g.Agent(self.prismd)
            try:
                a.send(hello=pb.Hello(job_id=job, rank=0, world_size=1, layout=layout))
                w = a.next().welcome
                return (w.config.low_precision, w.calibration_needed, list(w.calibration_formats))
            finally:
                a.close()

        self.assertEqual(welcome("job-l1"), (pb.INT8, True, [pb.INT4, pb.FP8_E5M2, pb.INT8]))
        a = g.Agent(self.prismd)
        try:
            a.send(hello=pb.Hello(job_id="job-l2", rank=0, world_size=1, layout=layout))
            a.next()
            a.send(calibration=pb.CalibrationReport(fingerprint=fingerprint, format=pb.INT8, samples=2, errors=[
                pb.BlockError(block_id=0, relative_error=0.01), pb.BlockError(block_id=1, relative_error=0.02)]))
            self.accepted(1)
            # A format that was wanted: the agent is told at once which remain (a config message).
            m = a.next()
            self.assertEqual(m.WhichOneof("kind"), "config")
            self.assertEqual((m.config.calibration_needed, list(m.config.calibration_formats)),
                             (False, [pb.INT4, pb.FP8_E5M2]))
        finally:
            a.close()
        self.assertEqual(welcome("job-l3"), (pb.INT8, False, [pb.INT4, pb.FP8_E5M2]))
        # A config push says the same (scale_mode changes what agents use: a ConfigUpdate).
        a = g.Agent(self.prismd)
        try:
            a.send(hello=pb.Hello(job_id="job-l3", rank=0, world_size=1, layout=layout))
            a.next()
            self.assertEqual(self.prismd.http("/v1/jobs/job-l3/config", "PATCH", '{"scale_mode": "current"}')[0], 200)
            for step in (1, 2):
                a.send(step_report=two_blocks(step))
            m = a.next()
            while m.WhichOneof("kind") != "config":
                m = a.next()
            self.assertEqual((m.config.calibration_needed, list(m.config.calibration_formats)),
                             (False, [pb.INT4, pb.FP8_E5M2]))
        finally:
            a.close()

    def test_auto_fingerprint_and_calibration_formats_are_the_uncached_ones(self):
        self.assertEqual(prism.client.fingerprint("m", BLOCKS, "auto"), expected_fingerprint("m", BLOCKS, 255))
        self.assertEqual(prism.client.fingerprint("m", BLOCKS, "int8"), expected_fingerprint("m", BLOCKS, 1))
        self.start(NUMERICS)
        (c,) = self.ranks("job-c", 1)
        c.begin_step(0)
        self.assertEqual(c.state()["calibration_formats"], ["int4", "fp8_e5m2", "int8"])
        self.assertTrue(c.report_calibration("int4", 3, {0: 0.01, 1: 0.02, 2: 0.03, 3: 0.04}))
        self.accepted(1)
        # prismd tells the rank at once which formats remain (no new stream needed).
        s = self.state_until(c, lambda s: s["calibration_formats"] != ["int4", "fp8_e5m2", "int8"],
                             "the formats still wanted")
        self.assertEqual((s["calibration_needed"], s["calibration_formats"]), (True, ["fp8_e5m2", "int8"]))
        c = self.restart(c, "job-c", "job-c-0")
        s = self.state_until(c, lambda s: s["upstream_connected"])
        self.assertEqual((s["calibration_needed"], s["calibration_formats"]), (True, ["fp8_e5m2", "int8"]))
        # A format prismd did not ask for is kept too (fp8_e4m3); the two wanted ones end the asking.
        for fmt in ("fp8_e4m3", "fp8_e5m2", "int8"):
            self.assertTrue(c.report_calibration(fmt, 3, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}))
        self.accepted(4)
        c = self.restart(c, "job-c", "job-c-0")
        s = self.state_until(c, lambda s: s["upstream_connected"])
        self.assertEqual((s["calibration_needed"], s["calibration_formats"]), (False, []))

    def accepted(self, n):
        """Waits until prismd accepted n calibration reports (its /metrics)."""
        line = 'prism_calibration_reports_total{outcome="accepted"} %d' % n
        wait_for(line, lambda: line in self.prismd.http("/metrics")[1].splitlines(), timeout_s=g.WAIT_S * 2)

    def restart(self, c, job, shared):
        """The trainer and its agent restarted (a new Hello, a new Welcome)."""
        self.clients.remove(c)
        c.close()
        self.procs.pop().stop()
        self.agent(shared)
        return self.client(job, 0, 1, shared)

    def test_fractions_reach_the_trace_merged_over_the_ranks_that_sent_them(self):
        self.start({})
        r0, r1 = self.ranks("job-f", 2, low="int8")
        with self.assertRaises(prism.client._lib.PrismInvalidError) as e:
            r0.report_stats(1, stats([1, 1, 1, 1]), fractions=[(0.5, 0.5), (1.5, 0.0), None, None])
        self.assertIn("fractions[1].saturated (block 1): 1.5 is not a fraction in [0, 1]", str(e.exception))
        with self.assertRaises(prism.client._lib.PrismInvalidError) as e:
            r0.report_stats(1, stats([1, 1]), block_ids=[2, 3], fractions=[(0.0, 0.0), (0.25, -0.125)])
        self.assertIn("fractions[1].underflowed (block 3): -0.125 is not a fraction in [0, 1]", str(e.exception))
        with self.assertRaises(prism.client._lib.PrismInvalidError) as e:
            r0.report_stats(1, stats([1]), fractions=[(math.nan, 0.0)])
        self.assertIn("fractions[0] (block 0)", str(e.exception))
        grads = [[np.full((4, 4), 0.5, dtype=np.float32)] for _ in BLOCKS]
        # Rank 0 through the CPU kernels (report_step_cpu_ex), rank 1 with statistics (report_step_ex).
        self.assertTrue(r0.report_step(1, grads, loss=1.0,
                                       fractions=[(0.25, 0.5), (0.125, 0.0625), None, None]))
        self.assertTrue(r1.report_stats(1, stats([1, 1, 1, 1]), loss=1.0,
                                        fractions=[(0.75, 0.0), None, None, (1.0, 0.0)]))
        self.assertTrue(r0.report_step(2, grads, loss=1.0))
        self.assertTrue(r1.report_stats(2, stats([1, 1, 1, 1]), loss=1.0))

        def steps():
            status, _, body = get_trace(self.prismd, "job-f")
            got = {r.step.merged.step: r.step for r in decode(body) if r.WhichOneof("record") == "step"}
            return got if status == 200 and 2 in got else None

        got = wait_for("steps 1 and 2 in the trace", steps, timeout_s=g.WAIT_S * 2)

        def figures(step):
            out = {}
            for b in got[step].merged.blocks:
                has = (b.WhichOneof("optional_saturated_fraction"), b.WhichOneof("optional_underflowed_fraction"))
                out[b.block_id] = (b.saturated_fraction, b.underflowed_fraction) if has[0] else None
                self.assertEqual(has[0] is None, has[1] is None)
            return out

        self.assertEqual(got[1].ranks, 2)
        self.assertEqual(figures(1), {0: (0.5, 0.25), 1: (0.125, 0.0625), 2: None, 3: (1.0, 0.0)})
        self.assertEqual(figures(2), {0: None, 1: None, 2: None, 3: None})


if __name__ == "__main__":
    unittest.main()
