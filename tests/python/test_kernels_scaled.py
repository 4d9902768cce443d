"""prism.quantize_counted, prism.quantize_scaled and prism.scale_delayed (python/prism/kernels.py)
against include/prism/kernels.h: codes, amax and counts worked out by hand, the saturation
boundaries, the delayed scale's values, refused arguments, NumPy and torch giving the same bytes,
and the CUDA kernels against the CPU ones where there is a device.

Run by ctest (test_python_kernels_scaled) with PRISM_LIBRARY and PYTHONPATH set; by hand:
    PRISM_LIBRARY=build/lib/libprism.so PYTHONPATH=python /usr/bin/python3 tests/python/test_kernels_scaled.py
"""

import ctypes
import math
import unittest

import numpy as np

import prism
from prism import _lib
from prism.kernels import Counts

try:
    import torch
except ImportError:
    torch = None

FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")
FLT_MAX = float(np.finfo(np.float32).max)


def arr(*values):
    return np.array(values, dtype=np.float32)


def below(v):
    return float(np.nextafter(np.float32(v), np.float32(0)))


def above(v):
    return float(np.nextafter(np.float32(v), np.float32(np.inf)))


class Layout(unittest.TestCase):
    def test_counts_struct_is_four_uint64(self):
        self.assertEqual(ctypes.sizeof(_lib.QuantCounts), 32)
        self.assertEqual([getattr(_lib.QuantCounts, n).offset
                          for n in ("saturated", "underflowed", "nonfinite", "bad_scale")], [0, 8, 16, 24])


class Scaled(unittest.TestCase):
    def test_blocks_with_given_scales_exact_codes_amax_and_counts(self):
        x = arr(1, -5, 2, math.nan, 0, -0.0, -0.25, 3)
        codes, amax, counts = prism.quantize_scaled(x, arr(1, 1, 0.5), "int8", block=3)
        self.assertEqual(codes.tolist(), [1, 0xfb, 2, 0, 0, 0, 0, 6])  # -0.25 / 0.5 rounds to 0
        self.assertEqual(amax.tolist(), [5.0, 0.0, 3.0])
        self.assertEqual(counts, Counts(saturated=0, underflowed=1, nonfinite=1, bad_scale=0))
        # Rows of 4 with a small scale on the second: 3 / 0.01 = 300 saturates.
        codes, amax, counts = prism.quantize_scaled(x.reshape(2, 4), arr(0.5, 0.01), "int8",
                                                    granularity="row")
        self.assertEqual(codes.tolist(), [2, 0xf6, 4, 0, 0, 0, 0xe7, 0x7f])
        self.assertEqual(amax.tolist(), [5.0, 3.0])
        self.assertEqual(counts, Counts(1, 0, 1, 0))

    def test_nearest_saturation_boundaries(self):
        cases = {
            "int8": ([127.0, below(127.5), 127.5, above(127.5), -127.5, below(-127.5)],
                     [0, 0, 1, 1, 1, 0]),
            "int4": ([7.0, below(7.5), 7.5, above(7.5), -7.5], [0, 0, 1, 1, 1]),
            "fp8_e4m3": ([448.0, below(464), 464.0, above(464), -above(464), 480.0],
                         [0, 0, 0, 1, 1, 1]),
            "fp8_e5m2": ([57344.0, below(61440), 61440.0, above(61440), -61440.0],
                         [0, 0, 1, 1, 1]),
        }
        for fmt, (values, saturated) in cases.items():
            for v, want in zip(values, saturated):
                _, _, counts = prism.quantize_scaled(arr(v), arr(1.0), fmt, granularity="tensor")
                self.assertEqual(counts.saturated, want, (fmt, v))
                self.assertEqual(counts.underflowed, 0, (fmt, v))

    def test_underflow_and_the_odd_int4_byte(self):
        codes, _, counts = prism.quantize_scaled(arr(0.5, -0.5, above(0.5), 0, 1e-45, 1.5, 7),
                                                 arr(1.0), "int4", granularity="tensor")
        self.assertEqual(codes.tolist(), [0x00, 0x01, 0x20, 0x07])  # nibbles 0 0, 1 0, 0 2, 7 (0)
        self.assertEqual(counts, Counts(0, 3, 0, 0))

    def test_given_scales_equal_to_quantize_give_its_codes(self):
        rng = np.random.default_rng(17)
        x = (rng.standard_normal(1000) * 3).astype(np.float32)
        x[::97] = np.nan
        for fmt in FORMATS:
            for rounding in ("nearest", "stochastic"):
                codes, scales, nonfinite = prism.quantize(x, fmt, rounding=rounding, seed=5,
                                                          return_nonfinite=True)
                c2, s2, counts = prism.quantize_counted(x, fmt, rounding=rounding, seed=5)
                self.assertTrue(np.array_equal(codes, c2))
                self.assertTrue(np.array_equal(scales, s2))
                self.assertEqual(counts.nonfinite, nonfinite)
                c3, amax, counts3 = prism.quantize_scaled(x, scales, fmt, rounding=rounding, seed=5)
                self.assertTrue(np.array_equal(codes, c3))
                self.assertEqual(counts3, counts)
                if rounding == "nearest":
                    self.assertEqual(counts.saturated, 0)  # the largest element lands on qmax
                blocks = [x[i:i + 128] for i in range(0, 1000, 128)]
                self.assertEqual(amax.tolist(), [float(np.nanmax(np.abs(b))) for b in blocks])

    def test_refused_scales_are_named(self):
        x = arr(1, 2, 3, 4)
        for bad, text in ((0.0, "0"), (-1.0, "-1"), (math.nan, "nan"), (math.inf, "inf")):
            with self.assertRaises(prism.PrismInvalidError) as cm:
                prism.quantize_scaled(x, arr(1.0, bad), "int8", block=2)
            self.assertEqual(cm.exception.message, f"scales[1]: {text} is not a finite scale > 0")
        with self.assertRaises(ValueError) as cm:
            prism.quantize_scaled(x, arr(1.0), "int8", block=2)
        self.assertIn("scales: 1 scales, but the layout has 2 groups", str(cm.exception))


class Delayed(unittest.TestCase):
    def test_values(self):
        self.assertEqual(prism.scale_delayed(254.0, 0, "int8"), 2.0)
        self.assertEqual(prism.scale_delayed(254.0, 1, "int8"), 4.0)
        self.assertEqual(prism.scale_delayed(448.0, -1, "fp8_e4m3"), 0.5)
        self.assertEqual(prism.scale_delayed(14.0, 2, "int4"), 8.0)
        self.assertEqual(prism.scale_delayed(0.0, 0, "int8"), 1.0)
        self.assertEqual(prism.scale_delayed(math.nan, 3, "fp8_e5m2"), 1.0)
        self.assertEqual(prism.scale_delayed(FLT_MAX, 1, "int4"), FLT_MAX)
        self.assertEqual(prism.scale_delayed(1.0, -200, "int8"), 2.0 ** -149)
        self.assertEqual(prism.scale_delayed(1.0, 0, "int8"), float(np.float32(1) / np.float32(127)))
        # margin 0 on a block's amax is quantize's fp32 scale
        x = arr(0.3, -2.5, 1.0)
        _, scales = prism.quantize(x, "fp8_e4m3", granularity="tensor")
        self.assertEqual(prism.scale_delayed(2.5, 0, "fp8_e4m3"), float(scales[0]))


@unittest.skipIf(torch is None, "python3-torch is not installed")
class Torch(unittest.TestCase):
    def test_torch_cpu_tensors_give_the_numpy_bytes(self):
        rng = np.random.default_rng(3)
        x = (rng.standard_normal(300) * 50).astype(np.float32)
        scales = np.full(3, 0.2, dtype=np.float32)
        for fmt in FORMATS:
            codes, amax, counts = prism.quantize_scaled(x, scales, fmt)
            tc, ta, tcounts = prism.quantize_scaled(torch.from_numpy(x), torch.from_numpy(scales), fmt)
            self.assertTrue(np.array_equal(codes, tc.numpy()))
            self.assertTrue(np.array_equal(amax, ta.numpy()))
            self.assertEqual(counts, tcounts)
            if fmt != "fp8_e5m2":  # |x / 0.2| stays far below E5M2's 61440
                self.assertGreater(counts.saturated, 0)
        xb = torch.from_numpy(x).to(torch.bfloat16)
        c1, s1, k1 = prism.quantize_counted(xb, "int8")
        c2, s2 = prism.quantize(xb, "int8")
        self.assertTrue(torch.equal(c1, c2) and torch.equal(s1, s2))
        self.assertEqual(k1.saturated, 0)

    @unittest.skipIf(torch is None or not torch.cuda.is_available() or not prism.has_cuda(),
                     "no CUDA device (or a libprism without its CUDA kernels)")
    def test_cuda_matches_cpu(self):
        rng = np.random.default_rng(9)
        x = (rng.standard_normal(5000) * 20).astype(np.float32)
        x[::101] = np.inf
        scales = np.abs(rng.standard_normal(40)).astype(np.float32) * 0.1 + 0.01
        for fmt in FORMATS:
            for rounding in ("nearest", "stochastic"):
                want = prism.quantize_scaled(x, scales, fmt, rounding=rounding, seed=11)
                got = prism.quantize_scaled(torch.from_numpy(x).cuda(), torch.from_numpy(scales).cuda(),
                                            fmt, rounding=rounding, seed=11)
                self.assertTrue(np.array_equal(want[0], got[0].cpu().numpy()))
                self.assertTrue(np.array_equal(want[1], got[1].cpu().numpy()))
                self.assertEqual(want[2], got[2])
                want = prism.quantize_counted(x, fmt, rounding=rounding, seed=11)
                got = prism.quantize_counted(torch.from_numpy(x).cuda(), fmt, rounding=rounding, seed=11)
                self.assertTrue(np.array_equal(want[0], got[0].cpu().numpy()))
                self.assertEqual(want[2], got[2])


if __name__ == "__main__":
    unittest.main()
