#!/usr/bin/python3
"""prism.Client (python/prism/client.py) on libprism's client, against a test that plays the agent:
a real Unix socket in a scratch directory, frames decoded with the protobuf classes protoc
generated from prism.proto. Pinned: the fingerprint equals the documented encoding hashed here
with hashlib; Hello, StepReport and CalibrationReport carry exactly what was given (statistics
equal to prism.grad_stats_blocks); a missing agent drops and counts; bad arguments raise
PrismInvalidError naming the argument. Every wait is bounded."""

import hashlib
import os
import shutil
import socket
import struct
import sys
import tempfile
import unittest

import numpy as np

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
sys.path.insert(0, os.path.join(BUILD, "python-gen"))

import prism  # noqa: E402
from prism.v1 import prism_pb2 as pb  # noqa: E402

BLOCKS = [("embed", [(100, 8)]), ("layers.0", [(8, 8), (8,)]), ("head", [])]


def documented_fingerprint(model_id, fmt, gran, k, blocks):
    """include/prism/client.h's encoding, written again here from its comment."""
    b = b"prism.fingerprint.v1"
    m = model_id.encode()
    b += struct.pack("<Q", len(m)) + m + struct.pack("<IIQ", fmt, gran, k) + struct.pack("<I", len(blocks))
    for name, shapes in blocks:
        n = name.encode()
        words = []
        for s in shapes:
            words += [len(s), *s]
        b += struct.pack("<Q", len(n)) + n + struct.pack("<Q", len(words)) + b"".join(struct.pack("<Q", w) for w in words)
    return hashlib.sha256(b).digest()


class FakeAgent:
    def __init__(self, directory):
        self.path = os.path.join(directory, "prism-agent.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        self.sock.settimeout(5)
        self.conn = None

    def accept(self):
        self.conn, _ = self.sock.accept()
        self.conn.settimeout(5)

    def read_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.conn.recv(n - len(data))
            if not chunk:
                raise AssertionError("the client closed the connection")
            data += chunk
        return data

    def read(self):
        (length,) = struct.unpack("<I", self.read_exact(4))
        msg = pb.AgentMessage()
        msg.ParseFromString(self.read_exact(length))
        return msg

    def close(self):
        if self.conn:
            self.conn.close()
        self.sock.close()


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-py-client-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_fingerprint_is_the_documented_encoding(self):
        want = documented_fingerprint("m@1", 2, 2, 128, BLOCKS)
        self.assertEqual(prism.fingerprint("m@1", BLOCKS, "fp8_e4m3"), want)
        self.assertEqual(prism.fingerprint("m@1", BLOCKS, "fp8_e4m3", "block", 0), want)  # 0: K = 128
        self.assertEqual(prism.fingerprint("m@1", BLOCKS, "int4", "row"),
                         documented_fingerprint("m@1", 4, 1, 0, BLOCKS))
        self.assertNotEqual(prism.fingerprint("m@2", BLOCKS, "fp8_e4m3"), want)

    def test_hello_reports_and_calibration_reach_the_agent(self):
        agent = FakeAgent(self.dir)
        try:
            c = prism.Client(job_id="job-1", rank=2, world_size=4, dir=self.dir)
            fp = c.register("m@1", BLOCKS)
            agent.accept()
            hello = agent.read().hello
            self.assertEqual((hello.job_id, hello.rank, hello.world_size), ("job-1", 2, 4))
            self.assertEqual(hello.layout.fingerprint, fp)
            self.assertEqual(fp, documented_fingerprint("m@1", 1, 2, 128, BLOCKS))
            self.assertEqual([b.name for b in hello.layout.blocks], ["embed", "layers.0", "head"])
            self.assertEqual([list(b.shape) for b in hello.layout.blocks], [[2, 100, 8], [2, 8, 8, 1, 8], []])
            self.assertEqual([b.param_bytes_bf16 for b in hello.layout.blocks], [1600, 144, 0])

            g0 = np.arange(800, dtype=np.float32) / 100 - 4
            g1 = [np.full((8, 8), 0.5, dtype=np.float32), np.array([3, 4, 0, 0, 0, 0, 0, 0], dtype=np.float32)]
            self.assertTrue(c.report_step(5, [[g0], g1, []], loss=1.25))
            want = prism.grad_stats_blocks([[g0], g1, []])
            r = agent.read().step_report
            self.assertEqual((r.step, r.loss), (5, 1.25))
            for b, (got, w) in enumerate(zip(r.blocks, want)):
                self.assertEqual(got.block_id, b)
                self.assertEqual((got.l2_norm, got.max_abs, got.mean, got.variance, got.numel, got.nonfinite),
                                 (w["l2_norm"], w["max_abs"], w["mean"], w["variance"], w["numel"], w["nonfinite"]))
            self.assertEqual(r.blocks[1].numel, 72)

            self.assertTrue(c.report_stats(6, [dict(want[1])], block_ids=[1]))
            r = agent.read().step_report
            self.assertFalse(r.HasField("loss"))
            self.assertEqual([b.block_id for b in r.blocks], [1])

            self.assertTrue(c.report_calibration("int8", 4, {2: 0.5, 0: 0.01}))
            cal = agent.read().calibration
            self.assertEqual((cal.fingerprint, cal.format, cal.samples), (fp, pb.INT8, 4))
            self.assertEqual([(e.block_id, e.relative_error) for e in cal.errors], [(0, 0.01), (2, 0.5)])

            n = c.counters()
            self.assertEqual((n["reports_sent"], n["calibrations_sent"], n["hellos_sent"], n["reports_dropped"]),
                             (2, 1, 1, 0))
            # No hint table here: every block is bf16, map version 0.
            self.assertEqual(c.begin_step(7), 0)
            self.assertEqual(c.precisions(), ["bf16"] * 3)
            self.assertTrue(c.state()["connected"])
            c.close()
        finally:
            agent.close()

    def test_no_agent_drops_and_counts(self):
        c = prism.Client(job_id="job-1", dir=self.dir, reconnect_interval_ms=60000)
        c.register("m@1", BLOCKS)
        for step in range(3):
            self.assertFalse(c.report_stats(step, []))
        n = c.counters()
        self.assertEqual((n["reports_sent"], n["reports_dropped"], n["connects"]), (0, 3, 0))
        self.assertEqual(n["connect_failures"], 1)  # one attempt per interval, not one per report
        self.assertFalse(c.state()["connected"])
        self.assertIn("prism-agent.sock", c.last_error())
        c.close()

    def test_bad_arguments_name_the_argument(self):
        c = prism.Client(job_id="job-1", dir=self.dir)
        with self.assertRaisesRegex(prism.PrismError, "no layout registered"):
            c.report_stats(0, [])
        c.register("m@1", BLOCKS)
        with self.assertRaisesRegex(prism.PrismInvalidError, r"block_ids\[0\]: block 7 is not in the registered"):
            c.report_stats(0, [{"l2_norm": 1, "max_abs": 1, "mean": 0, "variance": 0, "numel": 1, "nonfinite": 0}],
                           block_ids=[7])
        with self.assertRaisesRegex(prism.PrismInvalidError, "format: 'bf17' is not one of"):
            c.report_calibration("bf17", 1, {0: 0.1})
        with self.assertRaisesRegex(prism.PrismInvalidError, r"errors\[0\]: -1 is not a relative error"):
            c.report_calibration("int8", 1, {0: -1.0})
        with self.assertRaisesRegex(prism.PrismError, r"layout: already registered \(once per client\)"):
            c.register("m@1", BLOCKS)
        c.close()
        with self.assertRaisesRegex(prism.PrismInvalidError, "job"):
            prism.Client(job_id="", dir=self.dir)
        with self.assertRaisesRegex(prism.PrismInvalidError, "rank"):
            prism.Client(job_id="j", rank=4, world_size=4, dir=self.dir)


if __name__ == "__main__":
    unittest.main()
