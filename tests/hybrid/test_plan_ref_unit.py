#!/usr/bin/python3
"""Hand-worked cases pinning the Python reference of issue 15's model (plan_ref.py).

The numbers are chosen so that the times are sums of powers of two (exact in binary: asserted
with ==); indicator values involve 1/127² and /6 and are asserted against the exact rational
value (fractions.Fraction) to within 4 ulp. The workings are in the comments.
"""

import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
from fractions import Fraction as Fr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plan_ref  # noqa: E402

# Both blocks: nX = 4, DX = 4 → √1 = 1 = ½·2¹ → eX = 1; nW = 16, DW = 16 → eW = 1;
# mG = 0.5 = ½·2⁰ → eG = 0; mX = 1, mW = 2 → SX = 1/127, SW = 2/127; nG = 1; DY = 8.
STATS = {"x_l2": 4, "x_max_abs": 1, "x_numel": 4, "w_l2": 16, "w_max_abs": 2, "w_numel": 16,
         "g_l2": 1, "g_max_abs": 0.5, "y_numel": 8}

# Per-format fwd / bwd of those statistics (L = 2, γ = 4: ω0 = 4·fwd + bwd, ω1 = 2·bwd):
#   fp16 (m = 10): fwd = 2⁻²⁰·(64·1 + 64·1)/6 = 2⁻¹³/6, bwd = 2⁻²⁰·(4·1 + 32·0)/6 = 2⁻¹⁸/6
#   int8, high fp16 (k = 10): fwd = (16·4/127² + 4·4/127²·16)/6 = 320/127²/6,
#        bwd = (1·4/127² + 4·2^(2−20)·8)/6 = (4/127² + 2⁻¹³)/6
#   fp8_e4m3 (m = 3): fwd = 2⁻⁶·128/6 = 2/6, bwd = 2⁻⁶·4/6 = 2⁻⁴/6
Q2 = Fr(127 * 127)
FWD = {"fp16": Fr(1, 2 ** 13) / 6, "int8": Fr(320) / Q2 / 6, "fp8_e4m3": Fr(2, 6)}
BWD = {"fp16": Fr(1, 2 ** 18) / 6, "int8": (Fr(4) / Q2 + Fr(1, 2 ** 13)) / 6,
       "fp8_e4m3": Fr(1, 16) / 6}


def w0(f):
    return 4 * FWD[f] + BWD[f]


def w1(f):
    return 2 * BWD[f]


def block(i, flops):
    # W = 1024, A = 2048, S = 4096: M = Σ (4096 + 2048·bits/16) → all low 10240, one high 11264,
    # all high 12288.
    return {"id": i, "name": f"b{i}", "flops": flops, "param_bytes_bf16": 1024,
            "activation_bytes_bf16": 2048, "state_bytes": 4096, "stats": dict(STATS)}


def case_a():
    """fast (bf16 2⁴⁰, fixed by default) and slow (fp16 2³⁶ = int8 2³⁶, no quantize cost): a
    raise never changes the time; budget 0.5 · 22600 = 11300 holds exactly one raised block."""
    return {
        "blocks": [block(1, 2.0 ** 31), block(0, 2.0 ** 30)],
        "classes": [
            {"name": "fast", "ranks": 2, "profile": {
                "memory_bytes": 2 ** 20, "bf16_ops_per_second": 2.0 ** 40,
                "int8_ops_per_second": 2.0 ** 41,
                "quantize_cost": {"fixed_seconds": 0, "seconds_per_byte": 0}}},
            {"name": "slow", "ranks": 2, "profile": {
                "memory_bytes": 22600, "fp16_ops_per_second": 2.0 ** 36,
                "int8_ops_per_second": 2.0 ** 36,
                "quantize_cost": {"fixed_seconds": 0, "seconds_per_byte": 0}}},
        ],
        "link": {"bytes_per_second": 2.0 ** 30, "latency_seconds": 2.0 ** -16},
        "config": {"memory_fraction": 0.5},
    }


def close(test, got, exact):
    test.assertLessEqual(abs(Fr(got) - exact), 4 * Fr(math.ulp(float(exact))),
                         f"{got!r} vs {float(exact)!r}")


class Formulas(unittest.TestCase):
    def test_eps(self):
        self.assertEqual([plan_ref.eps(v) for v in (0.0, 1.0, 0.5, 3.0, 0.25, 1e-300)],
                         [0, 1, 0, 2, -1, -996])

    def test_omega_each_format(self):
        b = block(0, 1.0)
        for f, hi in (("fp16", "fp16"), ("int8", "fp16"), ("fp8_e4m3", "bf16")):
            close(self, plan_ref.omega(b, 0, 2, f, hi, 4.0), w0(f))
            close(self, plan_ref.omega(b, 1, 2, f, hi, 4.0), w1(f))
        # bf16 (m = 7): fwd = 2⁻¹⁴·128/6 = 2⁻⁷/6, bwd = 2⁻¹⁴·4/6 = 2⁻¹²/6
        close(self, plan_ref.omega(b, 0, 2, "bf16", "bf16", 4.0), (4 * Fr(1, 128) + Fr(1, 4096)) / 6)
        # int8 with a bf16 high format: k = 7, bwd = (4/127² + 4·2^(2−14)·8)/6
        close(self, plan_ref.omega(b, 1, 2, "int8", "bf16", 4.0),
              2 * (Fr(4) / Q2 + Fr(1, 2 ** 7)) / 6)

    def test_exponents_clamped_at_5(self):
        # nX/DX = 2²⁰ → √ = 2¹⁰ = ½·2¹¹ → eX = min(5, 11) = 5; mG = 2⁻⁴⁰ → eG = min(5, 39) = 5.
        b = block(0, 1.0)
        b["stats"].update({"x_l2": 4.0 * 2 ** 20, "g_max_abs": 2.0 ** -40})
        nX = 4 * 2 ** 20
        fwd = Fr(1, 2 ** 6) * (64 * 5 + nX * 16 * 1) / 6
        bwd = Fr(1, 2 ** 6) * (4 * 5 + nX * 8 * 5) / 6
        close(self, plan_ref.omega(b, 0, 3, "fp8_e4m3", "bf16", 2.0), 2 * 2 * fwd + bwd)


class Allocation(unittest.TestCase):
    def test_case_a_memory_stops_the_second_raise(self):
        out = plan_ref.plan(case_a())
        # slow, int8 and fp16 both 2³⁶: fwd 2⁻⁶, 2⁻⁵; bwd 2⁻⁵, 2⁻⁴ → f(0) = 9·2⁻⁶, f(1) = 7·2⁻⁶.
        # all-reduce: end(1) = 7·2⁻⁶ + 2⁻¹⁶ + 2⁻²⁰; start(0) = 9·2⁻⁶; T = 9·2⁻⁶ + 2⁻¹⁶ + 2⁻²⁰.
        t = 9 * 2.0 ** -6 + 2.0 ** -16 + 2.0 ** -20
        self.assertEqual(out["iteration_seconds"], t)
        self.assertEqual(out["start_seconds"], t)
        fast, slow = out["classes"]
        self.assertEqual((fast["name"], fast["fixed"], fast["high_format"], fast["low_format"]),
                         ("fast", True, "bf16", "int8"))
        self.assertEqual((slow["name"], slow["fixed"], slow["high_format"], slow["low_format"]),
                         ("slow", False, "fp16", "int8"))
        self.assertEqual(fast["plan"], ["bf16", "bf16"])
        self.assertEqual(slow["plan"], ["fp16", "int8"])
        self.assertEqual(fast["memory_bytes"], 12288.0)
        self.assertEqual(fast["budget_bytes"], 524288.0)
        self.assertEqual(slow["memory_bytes"], 11264.0)
        self.assertEqual(slow["budget_bytes"], 11300.0)
        # fast: fwd 2⁻¹⁰ + 2⁻⁹, bwd 2⁻⁹ + 2⁻⁸ → 9·2⁻¹⁰
        self.assertEqual(fast["compute_seconds"], 9 * 2.0 ** -10)
        self.assertEqual(slow["compute_seconds"], 9 * 2.0 ** -6)
        close(self, out["indicator"], w0("fp16") + w1("int8"))
        r = out["raises"]
        self.assertEqual([(x["class"], x["block"], x["accepted"], x["reason"]) for x in r],
                         [("slow", 0, True, "ok"), ("slow", 1, False, "memory")])
        close(self, r[0]["delta"], w0("int8") - w0("fp16"))
        close(self, r[1]["delta"], w1("int8") - w1("fp16"))
        lo, hi = out["baselines"]["uniform_low"], out["baselines"]["uniform_high"]
        self.assertEqual((lo["iteration_seconds"], lo["fits"]), (t, True))
        self.assertEqual((hi["iteration_seconds"], hi["fits"]), (t, False))
        close(self, lo["indicator"], w0("int8") + w1("int8"))
        close(self, hi["indicator"], w0("fp16") + w1("fp16"))
        self.assertEqual(list(out), ["iteration_seconds", "start_seconds", "indicator", "classes",
                                     "baselines", "raises"])

    def test_case_b_time_refuses_raises_and_force(self):
        doc = case_a()
        slow = doc["classes"][1]["profile"]
        slow.update({"memory_bytes": 2 ** 20, "int8_ops_per_second": 2.0 ** 38,
                     "quantize_cost": {"fixed_seconds": 2.0 ** -20, "seconds_per_byte": 2.0 ** -30}})
        out = plan_ref.plan(doc)
        # slow int8 fwd: 2⁻⁸ + (2⁻²⁰ + 2⁻³⁰·3072) = 2⁻⁸ + 2⁻¹⁸, 2⁻⁷ + 2⁻¹⁸; bwd in fp16 2⁻⁵, 2⁻⁴.
        # f(0) = 3·2⁻⁸ + 2⁻¹⁷ + 3·2⁻⁵; T0 = f(0) + 2⁻¹⁶ + 2⁻²⁰. Each raise costs forward time.
        t0 = 3 * 2.0 ** -8 + 2.0 ** -17 + 3 * 2.0 ** -5 + 2.0 ** -16 + 2.0 ** -20
        self.assertEqual(out["start_seconds"], t0)
        self.assertEqual(out["iteration_seconds"], t0)
        self.assertEqual(out["classes"][1]["plan"], ["int8", "int8"])
        self.assertEqual([(x["block"], x["reason"]) for x in out["raises"]], [(0, "time"), (1, "time")])
        # uniform high: slow fwd 2⁻⁶ + 2⁻⁵, bwd 2⁻⁵ + 2⁻⁴ → 9·2⁻⁶ + 2⁻¹⁶ + 2⁻²⁰
        self.assertEqual(out["baselines"]["uniform_high"]["iteration_seconds"],
                         9 * 2.0 ** -6 + 2.0 ** -16 + 2.0 ** -20)
        # force block 1 high: the start is [int8, fp16], only block 0 is tried.
        doc["config"]["force_bf16_blocks"] = [1]
        out = plan_ref.plan(doc)
        self.assertEqual(out["classes"][1]["plan"], ["int8", "fp16"])
        self.assertEqual([(x["block"], x["reason"]) for x in out["raises"]], [(0, "time")])
        # f(0) = (2⁻⁸ + 2⁻¹⁸ + 2⁻⁵) + (2⁻⁴ + 2⁻⁵)
        self.assertEqual(out["start_seconds"], 2.0 ** -8 + 2.0 ** -18 + 2.0 ** -5 + 2.0 ** -4
                         + 2.0 ** -5 + 2.0 ** -16 + 2.0 ** -20)

    def test_ties_class_name_then_block_and_default_fixed_ties(self):
        doc = case_a()
        slow = doc["classes"][1]
        doc["classes"][1] = dict(copy.deepcopy(slow), name="b")
        doc["classes"].append(dict(copy.deepcopy(slow), name="a"))
        doc["classes"].append({"name": "fast2", "ranks": 1, "profile": {
            "memory_bytes": 1, "fp16_ops_per_second": 2.0 ** 40, "int8_ops_per_second": 1.0,
            "quantize_cost": {"fixed_seconds": 0, "seconds_per_byte": 0}}})
        out = plan_ref.plan(doc)
        self.assertEqual([c["fixed"] for c in out["classes"]], [True, False, False, True])
        self.assertEqual([(x["class"], x["block"], x["reason"]) for x in out["raises"]],
                         [("a", 0, "ok"), ("b", 0, "ok"), ("a", 1, "memory"), ("b", 1, "memory")])
        close(self, out["indicator"], 2 * (w0("fp16") + w1("int8")))

    def test_zero_statistics_tie_by_block_id(self):
        doc = case_a()
        doc["config"]["memory_fraction"] = 1.0
        for b in doc["blocks"]:
            b["stats"].update({"x_l2": 0, "x_max_abs": 0, "w_l2": 0, "w_max_abs": 0, "g_l2": 0,
                               "g_max_abs": 0})
        out = plan_ref.plan(doc)
        self.assertEqual([(x["block"], x["delta"], x["reason"]) for x in out["raises"]],
                         [(0, 0.0, "ok"), (1, 0.0, "ok")])
        self.assertEqual(out["indicator"], 0.0)

    def test_explicit_fixed_classes(self):
        doc = case_a()
        doc["config"]["fixed_classes"] = []
        out = plan_ref.plan(doc)
        self.assertEqual([c["fixed"] for c in out["classes"]], [False, False])
        # fast now starts low; raising its blocks adds forward time on fast (2⁻¹⁰ instead of
        # 2⁻¹¹), but slow's 9·2⁻⁶ still sets T, so both of fast's raises are kept.
        self.assertEqual(out["classes"][0]["plan"], ["bf16", "bf16"])
        self.assertEqual(out["classes"][1]["plan"], ["fp16", "int8"])
        self.assertEqual(sorted((x["class"], x["block"], x["reason"]) for x in out["raises"]),
                         [("fast", 0, "ok"), ("fast", 1, "ok"), ("slow", 0, "ok"),
                          ("slow", 1, "memory")])
        doc["config"]["fixed_classes"] = ["fast", "slow"]
        out = plan_ref.plan(doc)
        self.assertEqual(out["raises"], [])
        self.assertEqual(out["indicator"], 0.0)
        self.assertEqual(out["classes"][1]["plan"], ["fp16", "fp16"])

    def test_start_refused_exit_1(self):
        doc = case_a()
        doc["classes"][1]["profile"]["memory_bytes"] = 20000  # budget 10000 < start 10240
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(doc, fh)
        try:
            p = subprocess.run([sys.executable, os.path.join(HERE, "plan_ref.py"), fh.name],
                               capture_output=True, text=True, timeout=60)
        finally:
            os.unlink(fh.name)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "")
        self.assertEqual(p.stderr, 'plan_ref: class "slow" does not fit: its start needs 10240.0 '
                         'bytes, its budget is 10000.0 bytes\n')

    def test_bad_input_exit_2(self):
        doc = case_a()
        del doc["classes"][0]["profile"]["int8_ops_per_second"]  # fixed: its low is never run
        self.assertEqual(plan_ref.plan(doc), plan_ref.plan(case_a()))
        doc = case_a()
        doc["classes"][1]["profile"]["int8_ops_per_second"] = 0
        with self.assertRaises(plan_ref.PlanError) as e:
            plan_ref.plan(doc)
        self.assertEqual(e.exception.key, "classes[1].profile.int8_ops_per_second")
        doc = case_a()
        doc["config"]["colour"] = 1
        with self.assertRaises(plan_ref.PlanError) as e:
            plan_ref.plan(doc)
        self.assertEqual(e.exception.key, "config.colour")


if __name__ == "__main__":
    unittest.main()
