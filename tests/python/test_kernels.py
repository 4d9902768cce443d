"""The Python binding of libprism (python/prism) against the C kernels: exact codes and scales
computed by hand from include/prism/kernels.h, NumPy and torch giving the same bytes, the
statistics against float64 NumPy, argument errors, and the struct layouts against lib/abi.c.

Run by ctest (test_python_kernels) with PRISM_LIBRARY and PYTHONPATH set; by hand:
    PRISM_LIBRARY=build/lib/libprism.so PYTHONPATH=python /usr/bin/python3 tests/python/test_kernels.py
CUDA tests skip without a CUDA device (and a libprism with its CUDA kernels).
"""

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
import unittest

import numpy as np  # scripts/install-deps.sh installs python3-numpy; without it this fails

import prism  # noqa: E402
from prism import _lib  # noqa: E402

try:
    import torch
except ImportError:  # the NumPy half still runs
    torch = None

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")
f32 = np.float32
needs_torch = unittest.skipIf(torch is None, "python3-torch is not installed")


def arr(*values):
    return np.array(values, dtype=np.float32)


def u8(*codes):
    return np.array(codes, dtype=np.uint8)


class StructLayout(unittest.TestCase):
    """ctypes' structs against the offsets lib/abi.c makes the C compiler assert."""

    def test_ctypes_structs_match_the_offsets_and_sizes_asserted_in_lib_abi_c(self):
        with open(os.path.join(SOURCE, "lib", "abi.c")) as f:
            text = f.read()
        from prism import client, transfer
        structs = {"prism_error": _lib.Error, "prism_tensor": _lib.Tensor,
                   "prism_quant_spec": _lib.QuantSpec, "prism_grad_stats": _lib.GradStats,
                   "prism_client_options": client.ClientOptions, "prism_quant_config": client.QuantConfig,
                   "prism_block_layout": client.BlockLayout, "prism_model_layout": client.ModelLayout,
                   "prism_client_runtime_hints": client.RuntimeHints, "prism_client_state": client.ClientState,
                   "prism_client_counters": client.ClientCounters,
                   "prism_block_tensor_stats": client.BlockTensorStats, "prism_client_plan": client.ClientPlan,
                   "prism_transfer_options": transfer.TransferOptions, "prism_transfer_ticket": transfer.Ticket,
                   "prism_transfer_counters": transfer.TransferCounters,
                   "prism_block_fractions": client.BlockFractions, "prism_quant_counts": _lib.QuantCounts}
        offsets = re.findall(r"offsetof\((prism_\w+), (\w+)\) == (\d+)", text)
        sizes = re.findall(r"sizeof\((prism_\w+)\) == (\d+)", text)
        # every field of the five kernel structs, the client's (its counters by size: 19 u64) and
        # transfer's (options 9 and counters 12 with the scale modes)
        # (prism_client_state: 13, and 8 for its numerics fields; prism_block_fractions: 2;
        # prism_quant_counts: 4)
        self.assertEqual(len(offsets), 2 + 3 + 6 + 6 + 7 + 3 + 7 + 4 + 7 + 13 + 8 + 8 + 9 + 2 + 12 + 8 + 2 + 4)
        self.assertEqual(len(client.ClientCounters._fields_), 19)
        for struct, field, offset in offsets:
            self.assertEqual(getattr(structs[struct], field).offset, int(offset), (struct, field))
        self.assertTrue(set(structs) <= {s for s, _ in sizes})
        for name, size in sizes:  # the structs, and the enums that ctypes passes as c_int
            self.assertEqual(ctypes.sizeof(structs.get(name, ctypes.c_int)), int(size), name)
        for struct, cls in structs.items():
            if struct == "prism_client_counters":
                continue
            # (prism_block_tensor_stats.reserved, always 0, is pinned by the offsets around it)
            self.assertEqual({f for s, f, _ in offsets if s == struct},
                             {name for name, _ in cls._fields_} - {"reserved"}, struct)

    def spec_error(self, numel=10, **fields):
        spec = _lib.QuantSpec(format=1, granularity=0)
        for k, v in fields.items():
            setattr(spec, k, v)
        err = _lib.Error()
        groups = ctypes.c_size_t(99)
        status = _lib.load().prism_quant_layout(ctypes.byref(spec), numel, ctypes.byref(groups),
                                                None, None, ctypes.byref(err))
        return status, err.status, err.message.decode(), groups.value

    def test_each_spec_field_reaches_prism_quant_layout(self):
        self.assertEqual(self.spec_error(), (0, 0, "", 1))
        self.assertEqual(self.spec_error(format=0)[:3], (
            1, 1, "format: bf16 is not a quantized format (int8, fp8_e4m3, fp8_e5m2, int4)"))
        self.assertEqual(self.spec_error(granularity=9)[2],
                         "granularity: unknown value 9 (tensor 0, row 1, block 2)")
        self.assertEqual(self.spec_error(granularity=1, group=3)[2],
                         "group: 10 elements are not a whole number of rows of 3")
        self.assertEqual(self.spec_error(granularity=2, group=3)[3], 4)
        self.assertEqual(self.spec_error(scale_mode=5)[2],
                         "scale_mode: unknown value 5 (fp32 0, pow2 1)")
        self.assertEqual(self.spec_error(rounding=7)[2],
                         "rounding: unknown value 7 (nearest 0, stochastic 1)")

    def test_seed_is_passed_whole_as_64_bits(self):
        # Stochastic int8 recomputed here from prism_philox4x32_10 (kernels.h): element i takes
        # word i % 4 of Philox(counter (i / 4, 0, 0), key (seed low, seed high)), and rounds up
        # when its top 24 bits, as a float, are below fraction * 2^24.
        lib = _lib.load()
        x = (np.arange(64, dtype=np.float32) - 31.7) * f32(1.37)
        x[0] = 127 * 40  # amax: s = 40
        seed = (0x9E3779B9 << 32) | 0x7F4A7C15
        codes, scales = prism.quantize(x, "int8", "tensor", rounding="stochastic", seed=seed)
        self.assertEqual(scales[0], f32(40))
        key = (ctypes.c_uint32 * 2)(seed & 0xFFFFFFFF, seed >> 32)
        expected = []
        for i, xi in enumerate(x):
            ctr = (ctypes.c_uint32 * 4)(i // 4, 0, 0, 0)
            out = (ctypes.c_uint32 * 4)()
            lib.prism_philox4x32_10(ctr, key, out)
            v = f32(xi) / f32(40)
            lo = np.floor(v)
            up = f32(out[i % 4] >> 8) < (v - lo) * f32(16777216)
            expected.append(int(min(max(lo + up, -127), 127)) & 0xFF)
        np.testing.assert_array_equal(codes, np.array(expected, dtype=np.uint8))
        low_only, _ = prism.quantize(x, "int8", "tensor", rounding="stochastic",
                                     seed=seed & 0xFFFFFFFF)
        self.assertFalse(np.array_equal(codes, low_only))


class Library(unittest.TestCase):
    def test_exports_only_prism_symbols(self):
        nm = shutil.which("nm")
        if nm is None:
            self.skipTest("nm is not installed")
        out = subprocess.run([nm, "-D", "--defined-only", prism.library_path()], check=True,
                             capture_output=True, text=True).stdout
        names = [line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()]
        names = [n for n in names if n != "PRISM_0"]  # the version node
        self.assertIn("prism_quantize_cpu", names)
        self.assertEqual([n for n in names if not n.startswith("prism_")], [])

    def test_missing_library_raises_import_error_naming_where_it_looked(self):
        env = dict(os.environ, PRISM_LIBRARY="/nonexistent/libprism.so")
        code = ("import prism\n"
                "try:\n    prism.qmax('int8')\n"
                "except ImportError as e:\n    print(type(e).__name__, e)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout
        self.assertIn("LibraryNotFoundError", out)
        self.assertIn("PRISM_LIBRARY: /nonexistent/libprism.so does not exist", out)

    def test_scalar_helpers(self):
        self.assertEqual([prism.qmax(f) for f in FORMATS], [127.0, 448.0, 57344.0, 7.0])
        self.assertEqual(prism.qmax(prism.Format.INT4), 7.0)
        self.assertEqual(prism.f32_to_fp8(448, "fp8_e4m3"), 0x7E)
        self.assertEqual(prism.f32_to_fp8(1000, "fp8_e4m3"), 0x7E)
        self.assertEqual(prism.f32_to_fp8(-1000, "fp8_e4m3"), 0xFE)
        self.assertEqual(prism.f32_to_fp8(float("nan"), "fp8_e4m3"), 0x7F)
        self.assertEqual(prism.f32_to_fp8(1e9, "fp8_e5m2"), 0x7B)
        self.assertEqual(prism.fp8_to_f32(0x7E, "fp8_e4m3"), 448.0)
        self.assertEqual(prism.fp8_to_f32(0x01, "fp8_e4m3"), 2.0**-9)
        self.assertEqual(prism.fp8_to_f32(0x7B, "fp8_e5m2"), 57344.0)
        with self.assertRaisesRegex(ValueError, "^fmt: 'int8' is not one of 'fp8_e4m3', 'fp8_e5m2'$"):
            prism.f32_to_fp8(1.0, "int8")

    def test_layout_helpers(self):
        self.assertEqual(prism.layout("int4", 5, "block", block=2), prism.Layout(3, 2, 3))
        self.assertEqual(prism.layout("int8", 300), prism.Layout(3, 128, 300))
        self.assertEqual(prism.layout("fp8_e5m2", 12, "row", row=4), prism.Layout(3, 4, 12))
        self.assertEqual(prism.layout("int8", 0, "tensor"), prism.Layout(0, 0, 0))
        self.assertEqual(prism.code_bytes("int4", 5), 3)
        self.assertEqual(prism.code_bytes("fp8_e4m3", 5), 5)
        self.assertEqual(prism.groups(300), 3)
        self.assertEqual(prism.groups(12, "row", row=4), 3)
        self.assertEqual(prism.groups(7, "tensor"), 1)


class QuantizeExact(unittest.TestCase):
    """Codes and scales worked out by hand from kernels.h."""

    def check(self, x, fmt, granularity, codes, scales, nonfinite=0, **kw):
        c, s, bad = prism.quantize(x, fmt, granularity, return_nonfinite=True, **kw)
        self.assertEqual((c.dtype, s.dtype), (np.uint8, np.float32))
        np.testing.assert_array_equal(c, np.asarray(codes, dtype=np.uint8))
        np.testing.assert_array_equal(s, np.asarray(scales, dtype=np.float32))
        self.assertEqual(bad, nonfinite)

    def test_int8_per_tensor_scale_is_amax_over_127(self):
        # s = 63.5 / 127 = 0.5: 1 -> 2, -2 -> -4 (0xfc), 63.5 -> 127
        self.check(arr(0, 1, -2, 63.5), "int8", "tensor", [0, 2, 0xFC, 127], [0.5])

    def test_int8_rounds_ties_to_even(self):
        # s = 1: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0, -0.5 -> 0 (never a negative zero code)
        self.check(arr(127, 2.5, -3.5, 0.5, -0.5), "int8", "tensor", [127, 2, 0xFC, 0, 0], [1])

    def test_int8_blocks_each_have_their_scale_and_the_last_is_shorter(self):
        x = arr(127, -63.5, 254, 1, 0, 0, 12.7)
        # [127, -63.5]: s 1, -63.5 ties to -64 (0xc0); [254, 1]: s 2, 0.5 -> 0; zeros: s 1;
        # [12.7]: s = 12.7f / 127, and 12.7f / s rounds to 127.
        self.check(x, "int8", "block", [127, 0xC0, 127, 0, 0, 0, 127],
                   [1, 2, 1, f32(12.7) / f32(127)], block=2)

    def test_int8_rows_are_the_last_dimension(self):
        x = arr(0, 127, -127, 254, 0, 1).reshape(2, 3)
        self.check(x, "int8", "row", [0, 127, 0x81, 127, 0, 0], [1, 2])
        # row= overrides the shape: three rows of two; -127 / 2 ties to -64 (0xc0)
        self.check(x, "int8", "row", [0, 127, 0xC0, 127, 0, 127], [1, 2, f32(1) / f32(127)],
                   row=2)

    def test_fp8_e4m3_codes_of_max_one_half_and_subnormal(self):
        # s = 1: 448 -> 0x7e, -448 -> 0xfe, 1 -> 0x38 (exponent 7), 0.5 -> 0x30, 2^-9 -> 0x01
        self.check(arr(448, -448, 1, 0.5, 2.0**-9), "fp8_e4m3", "tensor",
                   [0x7E, 0xFE, 0x38, 0x30, 0x01], [1])

    def test_fp8_e4m3_fp32_scale_maps_amax_to_448(self):
        self.check(arr(1000, -1000, 0), "fp8_e4m3", "tensor", [0x7E, 0xFE, 0],
                   [f32(1000) / f32(448)])

    def test_fp8_e4m3_pow2_scale(self):
        # smallest e with 448 * 2^e >= 1000: e = 2, s = 4; 1000 / 4 = 250 -> 256 = 0x78 (steps
        # of 16 there), 1 / 4 -> 0x28 (exponent -2 + 7)
        self.check(arr(1000, 1), "fp8_e4m3", "tensor", [0x78, 0x28], [4], scale="pow2")

    def test_fp8_e5m2_max(self):
        self.check(arr(57344, -57344, 1), "fp8_e5m2", "tensor", [0x7B, 0xFB, 0x3C], [1])

    def test_int4_odd_length_packs_low_nibble_first(self):
        # s = 1: nibbles 1, -1 (0xf), 7, -7 (0x9), 3; the last byte's high nibble is 0
        self.check(arr(1, -1, 7, -7, 3), "int4", "tensor", [0xF1, 0x97, 0x03], [1])

    def test_int4_blocks_of_odd_length_share_bytes(self):
        # blocks of 3: [7, -7, 1] s 1 and [14, 7] s 2 -> nibbles 7, 9, 1, 7, 4 (7/2 = 3.5 -> 4)
        self.check(arr(7, -7, 1, 14, 7), "int4", "block", [0x97, 0x71, 0x04], [1, 2], block=3)

    def test_pow2_scale_is_the_smallest_power_of_two_covering_amax(self):
        # amax 1: 127 * 2^-6 >= 1 > 127 * 2^-7, s = 1/64
        self.check(arr(1, -0.5, 0.25), "int8", "tensor", [64, 0xE0, 16], [2.0**-6], scale="pow2")
        self.check(arr(127), "int8", "tensor", [127], [1], scale="pow2")
        self.check(arr(254, 2), "int8", "tensor", [127, 1], [2], scale="pow2")

    def test_all_zero_group_has_scale_one_and_zero_codes(self):
        for fmt in FORMATS:
            nbytes = prism.code_bytes(fmt, 4)
            self.check(arr(0, -0.0, 0, 0), fmt, "tensor", [0] * nbytes, [1])

    def test_nonfinite_values_are_counted_coded_zero_and_left_out_of_amax(self):
        inf, nan = float("inf"), float("nan")
        self.check(arr(nan, 1, inf, -127, -inf), "int8", "tensor", [0, 1, 0, 0x81, 0], [1], 3)
        self.check(arr(nan, nan), "fp8_e4m3", "tensor", [0, 0], [1], 2)

    def test_empty_input_gives_empty_codes_and_scales(self):
        self.check(np.zeros(0, np.float32), "int8", "tensor", [], [])
        self.check(np.zeros(0, np.float32), "int4", "block", [], [])

    def test_float16_input(self):
        x = np.array([0, 1, -2, 63.5], dtype=np.float16)
        self.check(x, "int8", "tensor", [0, 2, 0xFC, 127], [0.5])


class Dequantize(unittest.TestCase):
    def test_dequantize_multiplies_codes_by_their_group_scale(self):
        y = prism.dequantize(u8(0, 2, 0xFC, 127), arr(0.5), "int8", 4, "tensor")
        self.assertEqual(y.dtype, np.float32)
        np.testing.assert_array_equal(y, arr(0, 1, -2, 63.5))
        y = prism.dequantize(u8(0xF1, 0x97, 0x03), arr(1, 2), "int4", 5, "block", block=3)
        np.testing.assert_array_equal(y, arr(1, -1, 7, -14, 6))

    def test_dequantize_to_a_shape_and_to_float16(self):
        y = prism.dequantize(u8(0, 127, 0x81, 127, 0, 1), arr(1, 2), "int8", (2, 3), "row",
                             dtype="float16")
        self.assertEqual((y.dtype, y.shape), (np.float16, (2, 3)))
        np.testing.assert_array_equal(y, np.array([[0, 127, -127], [254, 0, 2]], np.float16))
        y = prism.dequantize(u8(1, 2), arr(3), "int8", [1, 2], "tensor", dtype=np.float32)
        np.testing.assert_array_equal(y, arr(3, 6).reshape(1, 2))

    def test_dequantize_into_out(self):
        out = np.full((2, 2), 9, np.float32)
        r = prism.dequantize(u8(1, 2, 3, 4), arr(0.5, 2), "int8", granularity="row", out=out)
        self.assertIs(r, out)
        np.testing.assert_array_equal(out, arr(0.5, 1, 6, 8).reshape(2, 2))

    def test_dequantize_accumulate_adds_in_place(self):
        acc = arr(1, 1, 1, 1, 1)
        r = prism.dequantize_accumulate(acc, u8(0xF1, 0x97, 0x03), arr(1, 2), "int4", "block",
                                        block=3)
        self.assertIs(r, acc)
        np.testing.assert_array_equal(acc, arr(2, 0, 8, -13, 7))

    def test_round_trip_error_per_format_on_normal_data(self):
        # Measured over N(0, 1) with blocks of 128 (nearest): int8 0.0066, e4m3 0.026,
        # e5m2 0.051, int4 0.12; stochastic rounding about 1.4 times as much.
        x = np.random.default_rng(7).standard_normal(1 << 16).astype(np.float32)
        bounds = {"int8": 0.008, "fp8_e4m3": 0.03, "fp8_e5m2": 0.06, "int4": 0.14}
        for fmt, bound in bounds.items():
            for rounding, factor in (("nearest", 1), ("stochastic", 1.5)):
                codes, scales = prism.quantize(x, fmt, rounding=rounding, seed=11)
                y = prism.dequantize(codes, scales, fmt, x.size)
                err = prism.relative_error(x, y)
                self.assertLess(err, bound * factor, (fmt, rounding))
                self.assertGreater(err, 0, (fmt, rounding))

    def test_stochastic_rounding_is_reproducible_and_unbiased(self):
        x = np.full(1 << 14, 0.25, np.float32)
        x[0] = 127  # s = 1: every other element is 0 or 1, 1 with probability 1/4
        a, _ = prism.quantize(x, "int8", "tensor", rounding="stochastic", seed=5)
        b, _ = prism.quantize(x, "int8", "tensor", rounding="stochastic", seed=5)
        c, _ = prism.quantize(x, "int8", "tensor", rounding="stochastic", seed=6)
        np.testing.assert_array_equal(a, b)
        self.assertFalse(np.array_equal(a, c))
        self.assertEqual(set(np.unique(a[1:])), {0, 1})
        self.assertAlmostEqual(a[1:].mean(), 0.25, delta=0.02)


class RelativeError(unittest.TestCase):
    def test_relative_error_values(self):
        self.assertEqual(prism.relative_error(arr(3, 4), arr(0, 0)), 1.0)
        self.assertEqual(prism.relative_error(arr(3, 4), arr(3, 4)), 0.0)
        self.assertEqual(prism.relative_error(arr(3, 4), np.array([3, 4], np.float16)), 0.0)
        self.assertEqual(prism.relative_error(arr(0, 0), arr(0, 0)), 0.0)
        self.assertEqual(prism.relative_error(arr(0, 0), arr(0, 1)), math.inf)
        self.assertTrue(math.isnan(prism.relative_error(arr(1, float("nan")), arr(1, 1))))

    def test_relative_error_of_different_sizes_surfaces_the_library_message(self):
        with self.assertRaises(prism.PrismInvalidError) as ctx:
            prism.relative_error(arr(1, 2), arr(1, 2, 3))
        self.assertEqual(ctx.exception.message, "relative_error: a has 2 elements and b has 3")
        self.assertEqual(ctx.exception.status, prism.Status.INVALID)


class GradStats(unittest.TestCase):
    KEYS = {"l2_norm", "max_abs", "mean", "variance", "numel", "nonfinite"}

    def expected(self, tensors):
        flat = np.concatenate([np.asarray(t, np.float64).ravel() for t in tensors])
        fin = flat[np.isfinite(flat)]
        return {"l2_norm": math.sqrt(np.sum(fin * fin)), "max_abs": np.max(np.abs(fin)),
                "mean": np.mean(fin), "variance": np.var(fin), "numel": flat.size,
                "nonfinite": flat.size - fin.size}

    def assert_stats(self, got, want):
        self.assertEqual(set(got), self.KEYS)
        self.assertEqual((got["numel"], got["nonfinite"]), (want["numel"], want["nonfinite"]))
        self.assertEqual(got["max_abs"], want["max_abs"])
        for key in ("l2_norm", "mean", "variance"):
            self.assertLessEqual(abs(got[key] - want[key]), 1e-12 * abs(want[key]), key)

    def tensors(self):
        rng = np.random.default_rng(3)
        a = (rng.standard_normal(5000) * 0.01 + 0.003).astype(np.float32)
        a[17], a[4000] = np.nan, -np.inf
        b = rng.standard_normal((3, 700)).astype(np.float16)
        b[2, 5] = np.inf
        c = rng.standard_normal(3).astype(np.float32)
        return [a, b, c]

    def test_grad_stats_matches_float64_numpy(self):
        ts = self.tensors()
        self.assert_stats(prism.grad_stats(ts), self.expected(ts))
        self.assert_stats(prism.grad_stats(ts[2]), self.expected(ts[2:]))

    def test_grad_stats_blocks_one_dict_per_block_and_empty_blocks_are_zero(self):
        ts = self.tensors()
        got = prism.grad_stats_blocks([ts[:2], [], [ts[2]]])
        self.assertEqual(len(got), 3)
        self.assert_stats(got[0], self.expected(ts[:2]))
        self.assertEqual(got[1], {"l2_norm": 0.0, "max_abs": 0.0, "mean": 0.0, "variance": 0.0,
                                  "numel": 0, "nonfinite": 0})
        self.assert_stats(got[2], self.expected(ts[2:]))
        self.assertEqual(prism.grad_stats_blocks([]), [])


class Arguments(unittest.TestCase):
    x = np.arange(10, dtype=np.float32)

    def test_unknown_names_raise_value_error_naming_the_parameter_and_the_choices(self):
        cases = [
            (dict(fmt="int3"), r"^fmt: 'int3' is not one of 'int8', 'fp8_e4m3', 'fp8_e5m2', 'int4'"),
            (dict(fmt=prism.Format.BF16), r"^fmt: Format.BF16 is not a quantized format"),
            (dict(fmt=1), r"^fmt: 1 is not one of"),
            (dict(granularity="col"), r"^granularity: 'col' is not one of 'tensor', 'row', 'block'$"),
            (dict(scale="e8m0"), r"^scale: 'e8m0' is not one of 'fp32', 'pow2'$"),
            (dict(rounding="up"), r"^rounding: 'up' is not one of 'nearest', 'stochastic'$"),
            (dict(block=0), r"^block: 0 is out of range \(expected an integer >= 1\)$"),
            (dict(block=2.5), r"^block: expected an integer, got 2.5$"),
            (dict(seed=-1), r"^seed: -1 is out of range"),
            (dict(seed=2**64), r"^seed: 18446744073709551616 is out of range"),
        ]
        for kwargs, pattern in cases:
            args = dict(fmt="int8")
            args.update(kwargs)
            with self.subTest(kwargs=kwargs), self.assertRaisesRegex(ValueError, pattern):
                prism.quantize(self.x, **args)

    def test_format_enum_members_are_accepted(self):
        a = prism.quantize(self.x, prism.Format.FP8_E5M2)
        b = prism.quantize(self.x, "fp8_e5m2")
        np.testing.assert_array_equal(a[0], b[0])

    def test_row_length_not_dividing_numel_surfaces_the_library_message(self):
        with self.assertRaises(prism.PrismInvalidError) as ctx:
            prism.quantize(self.x, "int8", "row", row=3)
        self.assertEqual(str(ctx.exception),
                         "group: 10 elements are not a whole number of rows of 3 [INVALID]")
        self.assertIsInstance(ctx.exception, ValueError)
        self.assertIsInstance(ctx.exception, RuntimeError)
        with self.assertRaisesRegex(ValueError, "^group: the row length must be at least 1"):
            prism.quantize(np.zeros((2, 0), np.float32), "int8", "row")

    def test_bad_dtypes_and_types(self):
        with self.assertRaisesRegex(ValueError, "^x: dtype float64 is not float32, float16"):
            prism.quantize(self.x.astype(np.float64), "int8")
        with self.assertRaisesRegex(TypeError, "^x: expected a NumPy array or a torch tensor, got list"):
            prism.quantize([1.0, 2.0], "int8")
        codes, scales = prism.quantize(self.x, "int8")
        with self.assertRaisesRegex(ValueError, "^codes: dtype float32 is not uint8"):
            prism.dequantize(scales, scales, "int8", 10)
        with self.assertRaisesRegex(ValueError, "^scales: dtype float16 is not float32"):
            prism.dequantize(codes, scales.astype(np.float16), "int8", 10)
        with self.assertRaisesRegex(ValueError, "^dtype: 'bfloat16' needs torch tensors"):
            prism.dequantize(codes, scales, "int8", 10, dtype="bfloat16")
        with self.assertRaisesRegex(ValueError, r"^dtype: 'float64' is not one of"):
            prism.dequantize(codes, scales, "int8", 10, dtype="float64")

    def test_codes_and_scales_must_fit_the_layout(self):
        codes, scales = prism.quantize(self.x, "int4", "block", block=4)
        with self.assertRaisesRegex(ValueError, "^codes: 5 bytes, but 11 int4 elements take 6$"):
            prism.dequantize(codes, scales, "int4", 11, block=4)
        with self.assertRaisesRegex(ValueError, "^scales: 3 scales, but the layout has 5 groups$"):
            prism.dequantize(codes, scales, "int4", 10, block=2)
        with self.assertRaisesRegex(ValueError, "^row: the row length is needed"):
            prism.dequantize(codes, scales, "int4", 10, "row")
        with self.assertRaisesRegex(ValueError, "^numel: needed"):
            prism.dequantize(codes, scales, "int4")
        with self.assertRaisesRegex(ValueError, "^out: 4 elements, but numel is 10$"):
            prism.dequantize(codes, scales, "int4", 10, block=4, out=np.zeros(4, np.float32))

    def test_non_contiguous_inputs_are_copied_and_outputs_refused(self):
        x = np.random.default_rng(2).standard_normal((6, 40)).astype(np.float32)
        view = x[:, ::2]
        for fmt in FORMATS:
            a = prism.quantize(view, fmt, "row")
            b = prism.quantize(np.ascontiguousarray(view), fmt, "row")
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        big_endian = x.astype(">f4")
        np.testing.assert_array_equal(prism.quantize(big_endian, "int8")[0],
                                      prism.quantize(x, "int8")[0])
        codes, scales = prism.quantize(x, "int8", "row")
        out = np.zeros((6, 80), np.float32)[:, ::2]
        with self.assertRaisesRegex(ValueError, "^out: must be a C-contiguous, writeable array"):
            prism.dequantize(codes, scales, "int8", granularity="row", out=out)
        with self.assertRaisesRegex(ValueError, "^acc: must be a C-contiguous, writeable array"):
            prism.dequantize_accumulate(out, codes, scales, "int8", "row")
        readonly = np.zeros((6, 40), np.float32)
        readonly.flags.writeable = False
        with self.assertRaisesRegex(ValueError, "^acc: must be a C-contiguous, writeable array"):
            prism.dequantize_accumulate(readonly, codes, scales, "int8", "row")

    def test_a_kernel_missing_from_the_library_raises_unavailable(self):
        with self.assertRaises(prism.PrismError) as ctx:
            prism.kernels._cuda_call("prism_no_such_kernel_cuda", None)
        self.assertEqual(ctx.exception.status, prism.Status.UNAVAILABLE)
        self.assertIn("has no prism_no_such_kernel_cuda", ctx.exception.message)


@needs_torch
class TorchCpu(unittest.TestCase):
    def data(self, n=(1 << 17) + 3):
        return np.random.default_rng(4).standard_normal(n).astype(np.float32) * 3

    def test_numpy_and_torch_give_identical_bytes(self):
        x = self.data()
        t = torch.from_numpy(x)
        for fmt in FORMATS:
            for granularity, kw in (("tensor", {}), ("block", {"block": 64}),
                                    ("row", {"row": 131075 // 5})):
                for rounding in ("nearest", "stochastic"):
                    with self.subTest(fmt=fmt, granularity=granularity, rounding=rounding):
                        cn, sn = prism.quantize(x, fmt, granularity, rounding=rounding, seed=9, **kw)
                        ct, st = prism.quantize(t, fmt, granularity, rounding=rounding, seed=9, **kw)
                        self.assertIsInstance(ct, torch.Tensor)
                        self.assertEqual((ct.dtype, st.dtype), (torch.uint8, torch.float32))
                        np.testing.assert_array_equal(cn, ct.numpy())
                        np.testing.assert_array_equal(sn, st.numpy())
                        yn = prism.dequantize(cn, sn, fmt, x.size, granularity, **kw)
                        yt = prism.dequantize(ct, st, fmt, x.size, granularity, **kw)
                        np.testing.assert_array_equal(yn, yt.numpy())

    def test_half_precision_tensors_equal_their_float32_values(self):
        t = torch.from_numpy(self.data(4096))
        for half in (torch.bfloat16, torch.float16):
            h = t.to(half)
            a = prism.quantize(h, "fp8_e4m3", return_nonfinite=True)
            b = prism.quantize(h.float(), "fp8_e4m3", return_nonfinite=True)
            self.assertTrue(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2])
        f16 = t.half()
        np.testing.assert_array_equal(prism.quantize(f16, "int8")[0].numpy(),
                                      prism.quantize(f16.numpy(), "int8")[0])

    def test_dequantize_dtypes_shape_out_and_accumulate(self):
        t = torch.tensor([[0, 1, -2, 63.5]])
        codes, scales = prism.quantize(t, "int8", "tensor")
        self.assertEqual(codes.tolist(), [0, 2, 0xFC, 127])
        y = prism.dequantize(codes, scales, "int8", t.shape, "tensor", dtype="bfloat16")
        self.assertEqual((y.dtype, tuple(y.shape)), (torch.bfloat16, (1, 4)))
        self.assertTrue(torch.equal(y.float(), t))
        y = prism.dequantize(codes, scales, "int8", 4, "tensor", dtype=torch.float16)
        self.assertEqual(y.dtype, torch.float16)
        out = torch.empty(4, dtype=torch.bfloat16)
        self.assertIs(prism.dequantize(codes, scales, "int8", granularity="tensor", out=out), out)
        self.assertTrue(torch.equal(out.float(), t[0]))
        acc = torch.ones(4)
        prism.dequantize_accumulate(acc, codes, scales, "int8", "tensor")
        self.assertEqual(acc.tolist(), [1, 2, -1, 64.5])
        # numpy codes with torch out, both in host memory
        out = torch.zeros(4)
        prism.dequantize(codes.numpy(), scales.numpy(), "int8", 4, "tensor", out=out)
        self.assertEqual(out.tolist(), [0, 1, -2, 63.5])

    def test_non_contiguous_tensors_are_copied_and_outputs_refused(self):
        t = torch.from_numpy(self.data(4096)).reshape(64, 64)
        tt = t.t()
        a = prism.quantize(tt, "int8", "row")
        b = prism.quantize(tt.contiguous(), "int8", "row")
        self.assertTrue(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
        with self.assertRaisesRegex(ValueError, "^acc: must be a contiguous tensor"):
            prism.dequantize_accumulate(torch.zeros(64, 64).t(), a[0], a[1], "int8", "row")

    def test_grad_stats_and_relative_error_of_tensors(self):
        ts = [torch.randn(3000, generator=torch.Generator().manual_seed(1)),
              torch.randn(50, 7).bfloat16(), torch.randn(9).half().requires_grad_()]
        got = prism.grad_stats(ts)
        want = prism.grad_stats([t.detach().float().numpy() for t in ts])
        self.assertEqual(got, want)
        self.assertEqual(got["numel"], 3000 + 350 + 9)
        self.assertEqual(prism.relative_error(ts[0], ts[0].numpy()), 0.0)


def cuda_ready():
    return torch is not None and torch.cuda.is_available()


@unittest.skipUnless(cuda_ready(), "no CUDA device (torch.cuda.is_available() is false)")
class TorchCuda(unittest.TestCase):
    """The CUDA kernels against the CPU reference (DESIGN 8: bit-identical for nearest rounding
    and for the Philox stochastic rounding)."""

    def setUp(self):
        if not prism.has_cuda():
            self.skipTest(f"{prism.library_path()} was built without the CUDA kernels")
        gen = torch.Generator().manual_seed(8)
        self.x = (torch.randn(1000, 300, generator=gen) * 2)
        self.x[3, 7] = float("nan")

    def test_quantize_and_dequantize_match_the_cpu_bit_for_bit(self):
        xd = self.x.cuda()
        for fmt in FORMATS:
            for rounding in ("nearest", "stochastic"):
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    with self.subTest(fmt=fmt, rounding=rounding, dtype=dtype):
                        h, d = self.x.to(dtype), xd.to(dtype)
                        ch, sh, bh = prism.quantize(h, fmt, "row", rounding=rounding, seed=3,
                                                    return_nonfinite=True)
                        cd, sd, bd = prism.quantize(d, fmt, "row", rounding=rounding, seed=3,
                                                    return_nonfinite=True)
                        self.assertEqual((cd.device, sd.device), (xd.device, xd.device))
                        self.assertTrue(torch.equal(ch, cd.cpu()) and torch.equal(sh, sd.cpu()))
                        self.assertEqual((bh, bd), (1, 1))
                        yh = prism.dequantize(ch, sh, fmt, h.shape, "row", dtype=dtype)
                        yd = prism.dequantize(cd, sd, fmt, d.shape, "row", dtype=dtype)
                        self.assertEqual(yd.device, xd.device)
                        bits = torch.int32 if dtype == torch.float32 else torch.int16
                        self.assertTrue(torch.equal(yh.view(bits), yd.cpu().view(bits)))

    def test_accumulate_relative_error_and_grad_stats_match_the_cpu(self):
        codes, scales = prism.quantize(self.x, "int8", "block")
        acc_h = torch.ones(self.x.numel())
        acc_d = acc_h.cuda()
        prism.dequantize_accumulate(acc_h, codes, scales, "int8")
        prism.dequantize_accumulate(acc_d, codes.cuda(), scales.cuda(), "int8")
        self.assertTrue(torch.equal(acc_h, acc_d.cpu()))
        clean = torch.nan_to_num(self.x)
        y = prism.dequantize(codes, scales, "int8", clean.numel())
        # A sum of 300,000 squares: the GPU adds per chunk and warp, in another order than the
        # CPU, so the two agree to 1e-12 relative (test_kernels_cuda.c's ERROR_RTOL), not bit for
        # bit; the emulated device happened to match, a real H200 gave ...8635 against ...8632.
        want = prism.relative_error(clean, y)
        self.assertLessEqual(abs(prism.relative_error(clean.cuda(), y.cuda()) - want), 1e-12 * want)
        blocks = [[self.x, clean[:10]], [], [clean.bfloat16()]]
        host = prism.grad_stats_blocks(blocks)
        dev = prism.grad_stats_blocks([[t.cuda() for t in b] for b in blocks])
        # Counts and max_abs are exact; the sums agree to 1e-9 relative, the mean to 1e-9 of the
        # data's spread (test_kernels_cuda.c's STATS_RTOL and same_stats).
        self.assertEqual([(h["numel"], h["nonfinite"], h["max_abs"]) for h in host],
                         [(d["numel"], d["nonfinite"], d["max_abs"]) for d in dev])
        for h, d in zip(host, dev):
            for key in ("l2_norm", "variance"):
                self.assertLessEqual(abs(h[key] - d[key]), 1e-9 * abs(h[key]), key)
            spread = h["variance"] ** 0.5 + abs(h["mean"])
            self.assertLessEqual(abs(h["mean"] - d["mean"]), 1e-9 * spread, "mean")

    def test_mixed_host_and_device_arguments_are_refused(self):
        codes, scales = prism.quantize(self.x, "int8")
        with self.assertRaisesRegex(ValueError, "^arguments are in different places"):
            prism.dequantize(codes.cuda(), scales, "int8", self.x.numel())
        with self.assertRaisesRegex(ValueError, "^x: the CUDA tensor is not contiguous"):
            prism.quantize(self.x.cuda().t(), "int8")


if __name__ == "__main__":
    unittest.main(verbosity=2)
