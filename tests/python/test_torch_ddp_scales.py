#!/usr/bin/python3
"""The DDP hook's scale modes (issue 17; python/prism/ddp.py: QuantizedAllReduceState's
scale_mode current / pow2 / delayed / static / job, quantized_allreduce's scales_in, scales_out
and scale). One rank (a gloo group of one in this process): every call's result is worked out
here with prism.kernels, step by step, from the scales each mode must use, and compared bit for
bit; delayed_scales and row_amax equal the kernels' scale_delayed and amax. Two ranks (gloo
subprocesses on loopback): under delayed scaling every rank ends with the same bits; a rank in
pow2 beside one in current (a change of the job's mode seen a step apart) redoes the call with
FP32 headers on both ranks, no exception, the same bits. Bad arguments name themselves."""

import argparse
import datetime
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "python"))

import prism  # noqa: E402
import prism.ddp as ddp  # noqa: E402
import prism.torch as pt  # noqa: E402

W = 8  # row width of these tests: small rows, many scales
TIMEOUT_S = 300


def grads(call, n=100, rank=0):
    """A bucket's gradients at call `call`: magnitudes that change from call to call (so the
    history matters), a NaN, a row of zeros."""
    g = torch.Generator().manual_seed(1000 * call + rank)
    x = torch.randn(n, generator=g) * (4.0 ** (call % 3)) * (1 + rank)
    x[17] = float("nan")
    x[40:48] = 0.0
    return x


def by_hand(x, fmt, scales_in, scales_out, scale="fp32"):
    """One rank's quantized_allreduce of the one tensor x (op avg, world 1), step by step: x's rows
    quantized with scales_in (None: quantize's own), dequantized and summed into FP32, requantized
    with scales_out (None: quantize's own), dequantized into x's dtype. Returns (result, amax of
    x's rows, amax of the sum's rows)."""
    flat = x.reshape(-1)
    n = flat.numel()
    rows = n // W + (n % W != 0)
    if scales_in is None:
        c, s = prism.quantize(flat, fmt, "block", W, scale=scale)
    else:
        s = scales_in
        c, _, _ = prism.quantize_scaled(flat, s, fmt, "block", W)
    amax_in = ddp.row_amax(flat, W)
    acc = torch.zeros(rows * W, dtype=torch.float32)
    codes = torch.zeros(rows, ddp._code_bytes(fmt, W), dtype=torch.uint8)
    codes.view(-1)[:c.numel()] = c
    prism.dequantize_accumulate(acc, codes.view(-1), s.contiguous(), fmt, granularity="row", row=W)
    acc.clamp_(-ddp._FLT_MAX, ddp._FLT_MAX)
    if scales_out is None:
        c2, s2 = prism.quantize(acc, fmt, "row", row=W, scale=scale)
    else:
        s2 = scales_out
        c2, _, _ = prism.quantize_scaled(acc, s2, fmt, "row", row=W)
    amax_out = ddp.row_amax(acc, W)
    out = torch.empty_like(flat)
    prism.dequantize(c2.view(rows, -1).reshape(-1)[:ddp._code_bytes(fmt, n)], s2.contiguous(), fmt,
                     granularity="block", block=W, out=out)
    return out, amax_in, amax_out


class Bucket:
    """A stand-in for torch.distributed.GradBucket (buffer, parameters, index)."""

    def __init__(self, buffer, params, index=0):
        self._buffer, self._params, self._index = buffer, params, index

    def buffer(self):
        return self._buffer

    def parameters(self):
        return list(self._params)

    def index(self):
        return self._index


class JobClient:
    """The part of a prism.Client the hook reads under scale_mode "job": state()."""

    def __init__(self):
        self.mode = {"scale_mode": "current", "amax_history_len": 16, "scale_margin": 0}

    def state(self):
        return dict(self.mode)


class JobAttachment:
    def __init__(self):
        self.client = JobClient()


class OneRank(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import torch.distributed as dist
        cls.folder = tempfile.mkdtemp(prefix="prism-ddp-scales-")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(cls.folder, "store"), 1), rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=60))

    @classmethod
    def tearDownClass(cls):
        import torch.distributed as dist
        dist.destroy_process_group()
        shutil.rmtree(cls.folder, ignore_errors=True)

    def test_delayed_scales_and_row_amax_are_the_kernels(self):
        values = [0.0, -1.0, float("nan"), float("inf"), 1e-45, 1e-40, 1e-30, 3e-8, 0.5, 1.0, 127.0, 1e30, 3.4e38]
        for fmt in ddp.WIRES:
            for margin in (-32, -3, 0, 2, 32):
                got = ddp.delayed_scales(torch.tensor(values, dtype=torch.float32), margin, fmt)
                want = np.array([prism.scale_delayed(float(np.float32(v)), margin, fmt) for v in values],
                                dtype=np.float32)
                np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32), (fmt, margin))
        x = grads(1).to(torch.bfloat16)
        ones = torch.ones(13, dtype=torch.float32)
        _, amax, _ = prism.quantize_scaled(x, ones, "int8", "block", W)
        self.assertTrue(torch.equal(ddp.row_amax(x, W), amax))

    def run_calls(self, state, calls, fmt="int8", index=0):
        outs = []
        for k in range(calls):
            x = grads(k)
            buf = x.clone()
            pt.quantized_allreduce_hook(state, Bucket(buf, [torch.nn.Parameter(torch.zeros(100))], index))
            outs.append((x, buf))
        return outs

    def test_delayed_uses_the_max_of_the_last_n_calls_amax(self):
        state = pt.QuantizedAllReduceState(wire="int8", row_width=W, scale_mode="delayed", amax_history_len=2,
                                           scale_margin=1)
        ins, outs = [], []
        for k, (x, got) in enumerate(self.run_calls(state, 5)):
            if k == 0:
                sin = sout = None
            else:
                sin = ddp.delayed_scales(torch.stack(ins[-2:]).amax(dim=0), 1, "int8")
                sout = ddp.delayed_scales(torch.stack(outs[-2:]).amax(dim=0), 1, "int8")
            want, a_in, a_out = by_hand(x, "int8", sin, sout)
            ins.append(a_in)
            outs.append(a_out)
            self.assertTrue(torch.equal(got.view(torch.int32), want.view(torch.int32)), f"call {k}")
        self.assertEqual(state.collectives, 5)
        self.assertGreater(state.saturated, 0)  # call 3's 4x larger gradients under call 1-2's scales

    def test_static_keeps_the_first_calls_scales(self):
        state = pt.QuantizedAllReduceState(wire="fp8_e4m3", row_width=W, scale_mode="static")
        first = None
        for k, (x, got) in enumerate(self.run_calls(state, 4, "fp8_e4m3")):
            if k == 0:
                want, a_in, a_out = by_hand(x, "fp8_e4m3", None, None)
                first = (ddp.delayed_scales(a_in, 0, "fp8_e4m3"), ddp.delayed_scales(a_out, 0, "fp8_e4m3"))
            else:
                want, _, _ = by_hand(x, "fp8_e4m3", *first)
            self.assertTrue(torch.equal(got.view(torch.int32), want.view(torch.int32)), f"call {k}")

    def test_pow2_and_current_are_the_kernels_scales(self):
        for mode, scale in (("current", "fp32"), ("pow2", "pow2")):
            state = pt.QuantizedAllReduceState(wire="int4", row_width=W, scale_mode=mode)
            for k, (x, got) in enumerate(self.run_calls(state, 2, "int4")):
                want, _, _ = by_hand(x, "int4", None, None, scale=scale)
                self.assertTrue(torch.equal(got.view(torch.int32), want.view(torch.int32)), (mode, k))

    def test_the_default_follows_the_job_with_an_attachment(self):
        self.assertEqual(pt.QuantizedAllReduceState(wire="int8").scale_mode, "current")
        self.assertEqual(pt.QuantizedAllReduceState(wire="int8", attachment=JobAttachment()).scale_mode, "job")
        att = JobAttachment()
        att.client.mode = {"scale_mode": "pow2", "amax_history_len": 4, "scale_margin": 0}
        state = pt.QuantizedAllReduceState(wire="int8", row_width=W, attachment=att)
        x, got = self.run_calls(state, 1)[0]
        self.assertTrue(torch.equal(got, by_hand(x, "int8", None, None, scale="pow2")[0]))

    def test_job_mode_follows_the_attachment_and_starts_histories_afresh(self):
        att = JobAttachment()
        state = pt.QuantizedAllReduceState(wire="int8", row_width=W, scale_mode="job", attachment=att)
        x, got = self.run_calls(state, 1)[0]
        self.assertTrue(torch.equal(got, by_hand(x, "int8", None, None)[0]))
        att.client.mode = {"scale_mode": "delayed", "amax_history_len": 4, "scale_margin": 0}
        # The first delayed call has no history: current scales; the second uses the first's amax.
        outs = self.run_calls(state, 2)
        want0, a_in, a_out = by_hand(outs[0][0], "int8", None, None)
        self.assertTrue(torch.equal(outs[0][1], want0))
        want1, _, _ = by_hand(outs[1][0], "int8", ddp.delayed_scales(a_in, 0, "int8"),
                              ddp.delayed_scales(a_out, 0, "int8"))
        self.assertTrue(torch.equal(outs[1][1], want1))
        att.client.mode = {"scale_mode": "pow2", "amax_history_len": 4, "scale_margin": 0}
        x, got = self.run_calls(state, 1)[0]
        self.assertTrue(torch.equal(got, by_hand(x, "int8", None, None, scale="pow2")[0]))
        self.assertEqual(state.scale_mismatches, 0)

    def test_bad_arguments_name_themselves(self):
        for kwargs, name in (({"scale_mode": "amax"}, "scale_mode"), ({"scale_mode": "job"}, "attachment"),
                             ({"amax_history_len": 0}, "amax_history_len"),
                             ({"amax_history_len": 1025}, "amax_history_len"),
                             ({"scale_margin": 33}, "scale_margin"), ({"scale_margin": 1.5}, "scale_margin")):
            with self.assertRaises(ValueError) as cm:
                pt.QuantizedAllReduceState(wire="int8", **kwargs)
            self.assertTrue(str(cm.exception).startswith(name + ":"), (kwargs, str(cm.exception)))
        with self.assertRaises(ValueError) as cm:
            pt.quantized_allreduce([torch.ones(10)], "int8", scale="e8m0")
        self.assertTrue(str(cm.exception).startswith("scale:"))
        with self.assertRaises(ValueError) as cm:
            pt.quantized_allreduce([torch.ones(10)], "int8", row_width=W, scales_in=torch.ones(3))
        self.assertEqual(str(cm.exception), "scales_in: (3,), the tensors make 2 rows")


def worker(rank, world, folder):
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    result = {"delayed": []}
    state = pt.QuantizedAllReduceState(wire="int8", row_width=W, scale_mode="delayed", amax_history_len=2)
    for k in range(4):
        buf = grads(k, rank=rank)
        pt.quantized_allreduce_hook(state, Bucket(buf, [torch.nn.Parameter(torch.zeros(100))]))
        result["delayed"].append(buf.numpy().tobytes())
    # A change of the job's mode seen a step apart: rank 0 in pow2, the others in current.
    att = JobAttachment()
    att.client.mode["scale_mode"] = "pow2" if rank == 0 else "current"
    job = pt.QuantizedAllReduceState(wire="fp8_e4m3", row_width=W, scale_mode="job", attachment=att)
    buf = grads(7, rank=rank)
    pt.quantized_allreduce_hook(job, Bucket(buf, [torch.nn.Parameter(torch.zeros(100))]))
    result["mismatch"] = (buf.numpy().tobytes(), job.scale_mismatches)
    dist.destroy_process_group()
    with open(os.path.join(folder, f"py.{rank}.tmp"), "wb") as f:
        pickle.dump(result, f)
    os.rename(os.path.join(folder, f"py.{rank}.tmp"), os.path.join(folder, f"py.{rank}"))


class TwoRanks(unittest.TestCase):
    world = 2

    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="prism-ddp-scales-2-")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), "--ranks",
                                   str(cls.world), "--dir", cls.folder],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(cls.world)]
        logs = []
        try:
            for p in procs:
                out, _ = p.communicate(timeout=TIMEOUT_S)
                logs.append((p.returncode, out))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for r, (rc, out) in enumerate(logs):
            if rc != 0:
                raise AssertionError(f"rank {r}: exit {rc}\n{out}")
        cls.py = []
        for r in range(cls.world):
            with open(os.path.join(cls.folder, f"py.{r}"), "rb") as f:
                cls.py.append(pickle.load(f))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.folder, ignore_errors=True)

    def test_delayed_gives_every_rank_the_same_bits(self):
        for k in range(4):
            self.assertEqual(len({r["delayed"][k] for r in self.py}), 1, f"call {k}")
        self.assertNotEqual(self.py[0]["delayed"][0], self.py[0]["delayed"][1])

    def test_a_mode_change_seen_a_step_apart_is_redone_in_fp32_everywhere(self):
        self.assertEqual([r["mismatch"][1] for r in self.py], [1] * self.world)
        self.assertEqual(len({r["mismatch"][0] for r in self.py}), 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--worker", type=int)
    ap.add_argument("--dir")
    args, rest = ap.parse_known_args()
    if args.worker is not None:
        worker(args.worker, args.ranks, args.dir)
        return
    TwoRanks.world = args.ranks
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
