#!/usr/bin/python3
"""`prismctl plan PLAN.json` end to end (issue 15, items 2 and 5): the real binary on real files.

A worked example of three blocks on two classes whose every number was worked out by hand (the
values are exact in binary, so the expected object is compared exactly), the start that does not
fit (exit 1), and every bad PLAN.json key: each required key missing, each wrong type, each value
out of range, unknown keys at every level, duplicate and out-of-range block ids, an unknown fixed
class or force block id, a format a class cannot run, a JSON syntax error. Each bad PLAN must exit 2
with exactly one stderr line "prismctl plan: FILE: KEY: PROBLEM" and nothing on stdout."""

import copy
import json
import os
import subprocess
import tempfile
import unittest

BUILD = os.environ.get("PRISM_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
PRISMCTL = os.path.join(BUILD, "service", "prismctl")
TIMEOUT_S = 60


def stats(x_l2, x_max_abs, x_numel, w_l2, w_max_abs, w_numel, g_l2, g_max_abs, y_numel):
    return {"x_l2": x_l2, "x_max_abs": x_max_abs, "x_numel": x_numel, "w_l2": w_l2, "w_max_abs": w_max_abs,
            "w_numel": w_numel, "g_l2": g_l2, "g_max_abs": g_max_abs, "y_numel": y_numel}


# Blocks given out of id order (2, 0, 1): the model uses id order.
# Block 0: eX = |eps(sqrt(64/4) = 4)| = 3, eW = |eps(sqrt(32))| = 3, eG = eps(0.5) = 0; SX = 254/127 = 2,
#   SW = 1. bf16 (m = 7, p = 2^-14): fwd = p (64*4*3 + 64*2*3) / 6 = 192p, bwd = p (2*4*3 + 0) / 6 = 4p;
#   int8 (k = 7): fwd = (64*4*4 + 64*1*2) / 6 = 192, bwd = (2*4*4 + 64*2^-8*1024) / 6 = 48.
#   depth 1 of 3, gamma 4: omega = 8 fwd + bwd: bf16 1540p, int8 1584.
# Block 1: eX = 2 (sqrt 8), eW = 2 (sqrt 4), eG = 2; SX = 2, SW = 1. bf16: fwd 32p, bwd 24p;
#   int8: fwd (32*4 + 8*8) / 6 = 32, bwd (8*4 + 8*2^-10*8) / 6 = 171/32. omega = 4 fwd + 2 bwd:
#   bf16 176p, int8 138.6875.
# Block 2: eX = eW = 2 (sqrt 6), eG = 5 (eps(16)); SX = 1/4, SW = 1/2. bf16: fwd 16p, bwd 56p;
#   int8: fwd (12/16*2 + 12/4*2) / 6 = 1.25, bwd (24/16*2 + 12*2^-10*4) / 6 = 65/128. omega = 3 bwd:
#   bf16 168p, int8 1.5234375.
BASE = {
    "blocks": [
        {"id": 2, "name": "layer.2", "flops": 16, "param_bytes_bf16": 8, "activation_bytes_bf16": 0,
         "state_bytes": 4, "stats": stats(12, 31.75, 2, 12, 63.5, 2, 24, 16, 4)},
        {"id": 0, "name": "layer.0", "flops": 32, "param_bytes_bf16": 16, "activation_bytes_bf16": 64,
         "state_bytes": 4, "stats": stats(64, 254, 4, 64, 127, 2, 2, 0.5, 1024)},
        {"id": 1, "name": "layer.1", "flops": 8, "param_bytes_bf16": 8, "activation_bytes_bf16": 8,
         "state_bytes": 4, "stats": stats(8, 254, 1, 32, 127, 8, 8, 2, 8)},
    ],
    "classes": [
        {"name": "a100", "ranks": 2, "profile": {
            "device_class": "a100", "device_name": "emulated A100", "memory_bytes": 1024,
            "bf16_ops_per_second": 64, "fp16_ops_per_second": 64, "int8_ops_per_second": 128,
            "fp8_ops_per_second": 0, "quantize_cost": {"fixed_seconds": 0, "seconds_per_byte": 0},
            "cast_cost": {"fixed_seconds": 0, "seconds_per_byte": 0}, "h2d_bytes_per_second": 1e9}},
        {"name": "t4", "ranks": 2, "profile": {
            "memory_bytes": 64, "bf16_ops_per_second": 8, "int8_ops_per_second": 32,
            "quantize_cost": {"fixed_seconds": 1, "seconds_per_byte": 0}}},
    ],
    "link": {"bytes_per_second": 8, "latency_seconds": 0.25},
    "config": {"memory_fraction": 0.8125, "gamma": 4, "low_format": "auto"},
}

P = 2.0 ** -14
# a100 is fixed (the largest bf16 ops). Its times: fwd F/64 = 0.5, 0.125, 0.25; bwd 1, 0.25, 0.5:
#   f(0) = 0.875 + 1.75 = 2.625. t4 int8: fwd F/32 + 1 = 2, 1.25, 1.5 (sum 4.75); bwd 2F/8 = 8, 2, 4
#   (int8's backward runs in bf16): f(2) = 8.75, f(1) = 10.75, f(0) = 18.75. All-reduce, W/8 = 2, 1, 1,
#   latency 0.25: end(2) = 8.75 + 0.25 + 1 = 10, end(1) = 10.75 + 1.25 = 12, end(0) = 18.75 + 2.25 = 21.
#   T0 = 21. Memory of the start: (4 + 32) + (4 + 4) + (4 + 0) = 48 <= 0.8125 * 64 = 52.
# Raises by delta: block 0 (1584 - 1540p): memory 80 > 52; block 1 (138.6875 - 176p): bf16 fwd 1 < 1.25,
#   T = 20.75, memory 52 <= 52: kept; block 2 (1.5234375 - 168p): fwd 2 > 1.5, T = 21.25 > 21: time.
# uniform_high: t4 fwd 4, 1, 2: f(2) = 11, f(1) = 13, f(0) = 21: end 12.25, 14.25, 23.25; memory 84.
EXPECTED = {
    "iteration_seconds": 20.75,
    "start_seconds": 21.0,
    "indicator": 1584 + 176 * P + 1.5234375,
    "classes": [
        {"name": "a100", "fixed": True, "low_format": "int8", "high_format": "bf16",
         "plan": ["bf16", "bf16", "bf16"], "memory_bytes": 84.0, "budget_bytes": 832.0, "compute_seconds": 2.625},
        {"name": "t4", "fixed": False, "low_format": "int8", "high_format": "bf16",
         "plan": ["int8", "bf16", "int8"], "memory_bytes": 52.0, "budget_bytes": 52.0, "compute_seconds": 18.5},
    ],
    "baselines": {
        "uniform_low": {"iteration_seconds": 21.0, "indicator": 1584 + 138.6875 + 1.5234375, "fits": True},
        "uniform_high": {"iteration_seconds": 23.25, "indicator": (1540 + 176 + 168) * P, "fits": False},
    },
    "raises": [
        {"class": "t4", "block": 0, "delta": 1584 - 1540 * P, "accepted": False, "reason": "memory"},
        {"class": "t4", "block": 1, "delta": 138.6875 - 176 * P, "accepted": True, "reason": "ok"},
        {"class": "t4", "block": 2, "delta": 1.5234375 - 168 * P, "accepted": False, "reason": "time"},
    ],
}


def run_plan(text, name="plan.json"):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        r = subprocess.run([PRISMCTL, "plan", path], capture_output=True, text=True, timeout=TIMEOUT_S)
        return r.returncode, r.stdout, r.stderr.replace(path, "FILE")


def at(doc, path):
    """The container holding the last element of path (a list of keys and indexes), and that key."""
    for key in path[:-1]:
        doc = doc[key]
    return doc, path[-1]


def delete(*path):
    def f(doc):
        c, k = at(doc, path)
        del c[k]
    return f


def put(value, *path):
    def f(doc):
        c, k = at(doc, path)
        c[k] = value
    return f


def key_name(path):
    out = ""
    for k in path:
        out += "[%d]" % k if isinstance(k, int) else ("." if out else "") + k
    return out


BLOCK_NUMBERS = ["flops", "param_bytes_bf16", "activation_bytes_bf16", "state_bytes"]
STATS = ["x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs", "w_numel", "g_l2", "g_max_abs", "y_numel"]
OPS = ["bf16_ops_per_second", "fp16_ops_per_second", "int8_ops_per_second", "fp8_ops_per_second"]


def bad_cases():
    """(mutation, expected stderr problem after "prismctl plan: FILE: ") for every bad key."""
    cases = []

    def missing(*path):
        cases.append((delete(*path), "%s: missing (required)" % key_name(path)))

    def wrong(value, got, expected, *path):
        cases.append((put(value, *path), "%s: expected %s, got %s" % (key_name(path), expected, got)))

    def out_of_range(value, problem, *path):
        cases.append((put(value, *path), "%s: %s" % (key_name(path), problem)))

    def unknown(*path):
        cases.append((put(1, *path), "%s: unknown key" % key_name(path)))

    # The top level.
    unknown("extra")
    for key, expected in (("blocks", "an array"), ("classes", "an array"), ("link", "an object")):
        missing(key)
        wrong({} if expected == "an array" else [], "an object" if expected == "an array" else "an array",
              expected, key)
    wrong([], "an array", "an object", "config")
    out_of_range([], "must hold at least one block", "blocks")
    out_of_range([], "must hold at least one class", "classes")
    cases.append((lambda doc: doc["blocks"].__setitem__(1, 7), "blocks[1]: expected an object, got an integer"))
    cases.append((lambda doc: doc["classes"].__setitem__(0, "a100"),
                  "classes[0]: expected an object, got a string"))

    # Blocks (entry 1 holds id 0).
    unknown("blocks", 1, "extra")
    for key in ["id", "name"] + BLOCK_NUMBERS + ["stats"]:
        missing("blocks", 1, key)
    wrong("0", "a string", "an integer", "blocks", 1, "id")
    wrong(0.0, "a real", "an integer", "blocks", 1, "id")
    out_of_range(-1, "must be >= 0, got -1", "blocks", 1, "id")
    wrong(3, "an integer", "a string", "blocks", 1, "name")
    for key in BLOCK_NUMBERS:
        wrong("1", "a string", "a number", "blocks", 1, key)
        out_of_range(-0.5, "must be >= 0, got -0.5", "blocks", 1, key)
    wrong([], "an array", "an object", "blocks", 1, "stats")
    unknown("blocks", 1, "stats", "extra")
    for key in STATS:
        missing("blocks", 1, "stats", key)
        wrong(None, "null", "a number", "blocks", 1, "stats", key)
        low = 1 if key in ("x_numel", "w_numel") else 0
        out_of_range(low - 0.5, "must be >= %d, got %s" % (low, repr(low - 0.5)), "blocks", 1, "stats", key)
    out_of_range(3, "3 is not below the number of blocks (3): ids are 0..L-1, each once", "blocks", 0, "id")
    out_of_range(0, "0 is also blocks[1].id", "blocks", 2, "id")

    # Classes.
    unknown("classes", 1, "extra")
    for key in ("name", "ranks", "profile"):
        missing("classes", 1, key)
    wrong(1, "an integer", "a string", "classes", 1, "name")
    out_of_range("", "must be a non-empty string without NUL characters", "classes", 1, "name")
    out_of_range("a100", "\"a100\" is also classes[0].name", "classes", 1, "name")
    wrong(2.0, "a real", "an integer", "classes", 1, "ranks")
    out_of_range(0, "must be >= 1, got 0", "classes", 1, "ranks")
    wrong(True, "a boolean", "an object", "classes", 1, "profile")
    unknown("classes", 1, "profile", "extra")
    for key in ("memory_bytes", "quantize_cost"):
        missing("classes", 1, "profile", key)
    for key in ["memory_bytes", "h2d_bytes_per_second"] + OPS:
        wrong("1", "a string", "a number", "classes", 0, "profile", key)
        out_of_range(-1, "must be >= 0, got -1", "classes", 0, "profile", key)
    for key in ("device_class", "device_name"):
        wrong(1, "an integer", "a string", "classes", 0, "profile", key)
    for cost in ("quantize_cost", "cast_cost"):
        wrong(1, "an integer", "an object", "classes", 0, "profile", cost)
        unknown("classes", 0, "profile", cost, "extra")
        for key in ("fixed_seconds", "seconds_per_byte"):
            missing("classes", 0, "profile", cost, key)
            wrong("0", "a string", "a number", "classes", 0, "profile", cost, key)
            out_of_range(-1, "must be >= 0, got -1", "classes", 0, "profile", cost, key)

    # Formats a class cannot run.
    out_of_range(0, "must be > 0: the class's low format is int8", "classes", 1, "profile", "int8_ops_per_second")
    # The fixed class 0 has no fp8 either, but never runs its low format: class 1 is named.
    cases.append((put("fp8_e4m3", "config", "low_format"),
                  "classes[1].profile.fp8_ops_per_second: must be > 0: the class's low format is fp8_e4m3"))
    cases.append((put(0, "classes", 1, "profile", "bf16_ops_per_second"),
                  "classes[1].profile.fp16_ops_per_second: must be > 0 when bf16_ops_per_second is 0 "
                  "(the class needs a 16-bit high format)"))

    # The link.
    unknown("link", "extra")
    for key in ("bytes_per_second", "latency_seconds"):
        missing("link", key)
        wrong([1], "an array", "a number", "link", key)
    out_of_range(0, "must be > 0, got 0", "link", "bytes_per_second")
    out_of_range(-0.25, "must be >= 0, got -0.25", "link", "latency_seconds")

    # The config.
    unknown("config", "extra")
    wrong("a100", "a string", "an array", "config", "fixed_classes")
    cases.append((put([1], "config", "fixed_classes"), "config.fixed_classes[0]: expected a string, got an integer"))
    cases.append((put(["a100", "v100"], "config", "fixed_classes"),
                  "config.fixed_classes[1]: no class is named \"v100\""))
    wrong("0.5", "a string", "a number", "config", "memory_fraction")
    out_of_range(0, "must be > 0 and <= 1, got 0", "config", "memory_fraction")
    out_of_range(1.5, "must be > 0 and <= 1, got 1.5", "config", "memory_fraction")
    wrong(False, "a boolean", "a number", "config", "gamma")
    out_of_range(-1, "must be >= 0, got -1", "config", "gamma")
    wrong(8, "an integer", "a string", "config", "low_format")
    out_of_range("fp8_e5m2", "must be \"int8\", \"fp8_e4m3\" or \"auto\", got \"fp8_e5m2\"", "config", "low_format")
    wrong({}, "an object", "an array", "config", "force_bf16_blocks")
    cases.append((put([0, "1"], "config", "force_bf16_blocks"),
                  "config.force_bf16_blocks[1]: expected an integer, got a string"))
    cases.append((put([3], "config", "force_bf16_blocks"), "config.force_bf16_blocks[0]: no block has id 3"))
    cases.append((put([-1], "config", "force_bf16_blocks"), "config.force_bf16_blocks[0]: no block has id -1"))
    return cases


class PrismctlPlanTest(unittest.TestCase):
    def test_worked_example_prints_the_hand_computed_plan_on_one_line(self):
        rc, out, err = run_plan(json.dumps(BASE))
        self.assertEqual((rc, err), (0, ""))
        self.assertTrue(out.endswith("}\n"))
        self.assertEqual(out.count("\n"), 1)
        self.assertEqual(json.loads(out), EXPECTED)
        # The documented key order.
        self.assertEqual(list(json.loads(out)), ["iteration_seconds", "start_seconds", "indicator", "classes",
                                                 "baselines", "raises"])

    def test_config_is_optional_and_has_its_defaults(self):
        doc = copy.deepcopy(BASE)
        del doc["config"]
        doc["classes"][1]["profile"]["memory_bytes"] = 64 * 13 / 16 / 0.9  # the same budget at 0.9
        rc, out, err = run_plan(json.dumps(doc))
        self.assertEqual((rc, err), (0, ""))
        got = json.loads(out)
        self.assertEqual(got["classes"][1]["plan"], ["int8", "bf16", "int8"])
        self.assertEqual(got["classes"][1]["budget_bytes"], 0.9 * (64 * 13 / 16 / 0.9))

    def test_force_bf16_blocks_start_high_and_are_not_raised(self):
        doc = copy.deepcopy(BASE)
        doc["config"]["force_bf16_blocks"] = [1]
        rc, out, err = run_plan(json.dumps(doc))
        self.assertEqual((rc, err), (0, ""))
        got = json.loads(out)
        # The start is the plan the example ends with: T0 = 20.75; block 0 still too big, block 2 slower.
        self.assertEqual(got["start_seconds"], 20.75)
        self.assertEqual(got["classes"][1]["plan"], ["int8", "bf16", "int8"])
        self.assertEqual([(r["block"], r["reason"]) for r in got["raises"]], [(0, "memory"), (2, "time")])

    def test_start_that_does_not_fit_exits_1_naming_the_class(self):
        doc = copy.deepcopy(BASE)
        doc["config"]["memory_fraction"] = 1
        doc["classes"][1]["profile"]["memory_bytes"] = 47
        rc, out, err = run_plan(json.dumps(doc))
        self.assertEqual((rc, out), (1, ""))
        self.assertEqual(err, "prismctl plan: class \"t4\" does not fit: its start needs 48.0 bytes, "
                              "its budget is 47.0 bytes\n")

    def test_every_bad_key_exits_2_with_file_key_and_problem(self):
        cases = bad_cases()
        self.assertGreater(len(cases), 120)
        for mutate, problem in cases:
            doc = copy.deepcopy(BASE)
            mutate(doc)
            with self.subTest(problem=problem):
                rc, out, err = run_plan(json.dumps(doc))
                self.assertEqual((rc, out, err), (2, "", "prismctl plan: FILE: %s\n" % problem))

    def test_syntax_errors_name_line_and_column(self):
        for text, where in (('{"blocks": [\n  {"id": 0,\n', "3:0: JSON syntax error: string or '}' expected near end of file"),
                            ('{"link": 1, "link": 2}', "1:18: JSON syntax error: duplicate object key near '\"link\"'"),
                            ('[1, 2', "1:5: JSON syntax error: ']' expected near end of file")):
            with self.subTest(text=text):
                rc, out, err = run_plan(text)
                self.assertEqual((rc, out, err), (2, "", "prismctl plan: FILE:%s\n" % where))

    def test_top_level_must_be_an_object(self):
        rc, out, err = run_plan("[]")
        self.assertEqual((rc, out, err), (2, "", "prismctl plan: FILE: (top level): expected an object, got an array\n"))

    def test_missing_file_exits_2(self):
        r = subprocess.run([PRISMCTL, "plan", "/nonexistent/plan.json"], capture_output=True, text=True,
                           timeout=TIMEOUT_S)
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertTrue(r.stderr.startswith("prismctl plan: "))
        self.assertIn("/nonexistent/plan.json", r.stderr)

    def test_plan_reads_standard_input_for_dash(self):
        r = subprocess.run([PRISMCTL, "plan", "-"], input=json.dumps(BASE), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertEqual(json.loads(r.stdout), EXPECTED)
        r = subprocess.run([PRISMCTL, "plan", "-"], input="{\"blocks\": 1}", capture_output=True, text=True,
                           timeout=TIMEOUT_S)
        self.assertEqual((r.returncode, r.stdout, r.stderr),
                         (2, "", "prismctl plan: <stdin>: blocks: expected an array, got an integer\n"))

    def test_timing_adds_one_line_on_stderr_and_changes_no_output(self):
        """--timing: the same object on stdout, and one line of three phase times on stderr (their
        values are not asserted: they are wall-clock figures)."""
        r = subprocess.run([PRISMCTL, "plan", "--timing", "-"], input=json.dumps(BASE), capture_output=True,
                           text=True, timeout=TIMEOUT_S)
        self.assertEqual(r.returncode, 0)
        self.assertEqual(json.loads(r.stdout), EXPECTED)
        self.assertRegex(r.stderr, r"\Aprismctl plan: timing: read and parse [0-9]+\.[0-9]{3} ms, "
                                   r"plan [0-9]+\.[0-9]{3} ms, output [0-9]+\.[0-9]{3} ms\n\Z")
        # A refused input prints no timing line.
        r = subprocess.run([PRISMCTL, "plan", "--timing", "-"], input="{\"blocks\": 1}", capture_output=True,
                           text=True, timeout=TIMEOUT_S)
        self.assertEqual((r.returncode, r.stdout, r.stderr),
                         (2, "", "prismctl plan: <stdin>: blocks: expected an array, got an integer\n"))

    def test_no_file_or_two_files_or_an_option_exit_2(self):
        for args in ([], ["a.json", "b.json"], ["--bogus"]):
            with self.subTest(args=args):
                r = subprocess.run([PRISMCTL, "plan"] + args, capture_output=True, text=True, timeout=TIMEOUT_S)
                self.assertEqual((r.returncode, r.stdout), (2, ""))
                self.assertTrue(r.stderr.startswith("prismctl plan: "))

    def test_help_lists_the_format_and_every_choice(self):
        r = subprocess.run([PRISMCTL, "plan", "--help"], capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(r.returncode, 0)
        for phrase in ("PLAN.json", "force_bf16_blocks", "fixed_classes", "memory_fraction", "gamma",
                       "low_format", "x_numel", "quantize_cost", "cast_cost", "bytes_per_second", "mantissa bits",
                       "frexp", "T0 * (1 + 1e-9)", "ties by class name", "uniform_low", "uniform_high",
                       "shortest", "does not fit", "W + A added first", "from j = L-1 down to i"):
            self.assertIn(phrase, r.stdout)
        top = subprocess.run([PRISMCTL, "--help"], capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertIn("plan ", top.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
