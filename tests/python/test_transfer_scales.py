#!/usr/bin/python3
"""prism.Transfer's scale modes (python/prism/transfer.py, include/prism/transfer.h), CPU backend:
a fetch under each mode is exactly prism.kernels' quantize (counted, or with the scales worked
out here: the static scales of the weights as registered, the delayed max of the last N prepares' amax) then dequantize;
block_counts are the kernel's counts; set_scale_mode starts the histories afresh and keeps
the static scales; bad values raise
PrismInvalidError naming them."""

import os
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import prism  # noqa: E402

LOW = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")


def weights(n, seed, factor=1.0):
    """BF16 weights; factor a power of two, so the values scale exactly."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, generator=g) * torch.linspace(0.01, 4, n)).to(torch.bfloat16)
    return (w.float() * factor).to(torch.bfloat16)


def decoded(codes, scales, fmt, n):
    return prism.dequantize(codes, scales, fmt, numel=n, granularity="block", block=128, dtype="bfloat16")


def fetched(t, block, fmt, n):
    dst = torch.empty(n, dtype=torch.bfloat16)
    t.fetch(block, fmt, dst)
    return dst


def counts_dict(c, n):
    return {"saturated": c.saturated, "underflowed": c.underflowed, "nonfinite": c.nonfinite, "numel": n}


def group_amax(w):
    """Per group of 128, the largest |x|, by hand in float32."""
    a = w.float().abs().numpy()
    pad = (-len(a)) % 128
    return np.pad(a, (0, pad)).reshape(-1, 128).max(axis=1).astype(np.float32)


class TransferScalesTest(unittest.TestCase):
    def test_current_and_pow2_are_the_counted_kernel(self):
        n = 3000
        w = weights(n, 1)
        for mode, scale in (("current", "fp32"), ("pow2", "pow2")):
            t = prism.Transfer("cpu", max_block_bytes=2 * n, scale_mode=mode)
            t.add_block(3, w)
            for fmt in LOW:
                codes, scales, counts = prism.quantize_counted(w, fmt, "block", 128, scale=scale)
                self.assertTrue(torch.equal(fetched(t, 3, fmt, n).view(torch.int16),
                                            decoded(codes, scales, fmt, n).view(torch.int16)), (mode, fmt))
                self.assertEqual(t.block_counts(3, fmt), counts_dict(counts, n))
            t.close()

    def test_static_keeps_the_registered_scales_and_growth_saturates(self):
        n = 2048
        w0, w1 = weights(n, 2), weights(n, 2, 4.0)
        for fmt in LOW:
            t = prism.Transfer("cpu", max_block_bytes=2 * n, scale_mode="static")
            t.add_block(0, w0)
            _, s0, c0 = prism.quantize_counted(w0, fmt, "block", 128)
            t.update_block(0, w1)  # before the first fetch: the scales are still w0's
            fetched(t, 0, fmt, n)
            t.update_block(0, w0)
            fetched(t, 0, fmt, n)
            self.assertEqual(t.block_counts(0, fmt), counts_dict(c0, n))
            t.update_block(0, w1)
            codes, _, c1 = prism.quantize_scaled(w1, s0, fmt, "block", 128)
            self.assertGreater(c1.saturated, 0)
            self.assertTrue(torch.equal(fetched(t, 0, fmt, n).view(torch.int16),
                                        decoded(codes, s0, fmt, n).view(torch.int16)), fmt)
            self.assertEqual(t.block_counts(0, fmt), counts_dict(c1, n))
            c = t.counters()
            self.assertEqual(c["quantized"][fmt], 3 * n)
            self.assertEqual(c["saturated"][fmt], c0.saturated + 2 * c1.saturated)
            self.assertEqual(c["underflowed"][fmt], c0.underflowed + 2 * c1.underflowed)
            t.close()

    def test_delayed_uses_the_max_of_exactly_the_last_n_prepares(self):
        n, hist_len = 1000, 2
        factors = (8.0, 1.0, 1.0, 1.0, 0.5, 2.0)
        for margin in (0, 1):
            for fmt in LOW:
                t = prism.Transfer("cpu", max_block_bytes=2 * n, scale_mode="delayed",
                                   amax_history_len=hist_len, scale_margin=margin)
                amaxes = []
                for k, f in enumerate(factors):
                    w = weights(n, 5, f)
                    amaxes.append(group_amax(w))
                    window = amaxes[-1:] if k == 0 else amaxes[max(0, k - hist_len):k]
                    hist_max = np.max(np.stack(window), axis=0)
                    scales = np.array([prism.scale_delayed(float(m), margin, fmt) for m in hist_max], dtype=np.float32)
                    if k == 0:
                        t.add_block(1, w)
                    else:
                        t.update_block(1, w)
                    codes, amax, counts = prism.quantize_scaled(w, scales, fmt, "block", 128)
                    np.testing.assert_array_equal(amax, amaxes[-1])
                    self.assertTrue(torch.equal(fetched(t, 1, fmt, n).view(torch.int16),
                                                decoded(codes, scales, fmt, n).view(torch.int16)), (margin, fmt, k))
                    self.assertEqual(t.block_counts(1, fmt), counts_dict(counts, n))
                t.close()

    def test_set_scale_mode_starts_afresh(self):
        n = 1024
        w0, w1 = weights(n, 7), weights(n, 7, 8.0)
        t = prism.Transfer("cpu", max_block_bytes=2 * n, scale_mode="static")
        t.add_block(2, w0)
        fetched(t, 2, "int8", n)
        t.update_block(2, w1)
        t.set_scale_mode("delayed", 4, 0)
        self.assertEqual(t.scale_mode, "delayed")
        self.assertEqual(t.block_counts(2, "int8"), {"saturated": 0, "underflowed": 0, "nonfinite": 0, "numel": 0})
        t.set_scale_mode("static")
        _, s0, _ = prism.quantize_counted(w0, "int8", "block", 128)  # the registered weights' scales
        codes, _, counts = prism.quantize_scaled(w1, s0, "int8", "block", 128)
        self.assertTrue(torch.equal(fetched(t, 2, "int8", n).view(torch.int16),
                                    decoded(codes, s0, "int8", n).view(torch.int16)))
        self.assertEqual(t.block_counts(2, "int8"), counts_dict(counts, n))
        t.close()

    def test_bad_values_raise_naming_them(self):
        for kwargs, name in (({"scale_mode": "amax"}, "scale_mode"), ({"amax_history_len": 1025}, "amax_history_len"),
                             ({"scale_margin": 33}, "scale_margin"), ({"amax_history_len": 1.5}, "amax_history_len")):
            with self.assertRaises(prism.PrismInvalidError) as cm:
                prism.Transfer("cpu", max_block_bytes=256, **kwargs)
            self.assertIn(name, str(cm.exception))
        t = prism.Transfer("cpu", max_block_bytes=256)
        t.add_block(0, weights(16, 1))
        with self.assertRaises(prism.PrismInvalidError) as cm:
            t.block_counts(0, "bf16")
        self.assertIn("precision", str(cm.exception))
        with self.assertRaises(prism.PrismInvalidError) as cm:
            t.set_scale_mode("delayed", 0, -40)
        self.assertIn("scale_margin", str(cm.exception))
        t.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
