#!/usr/bin/python3
"""The training-quality experiment's smoke test (issue 16 item 2): bench/train_quality/run.py
--smoke runs every configuration for a handful of steps with a tiny model, each with 2 real
ranks (torch DDP over gloo on loopback) and, where the configuration has Prism, a real prismd and
one real prism-agent per rank. Then results.json is checked: every configuration ran every step
on both ranks with finite losses and ended with the same parameters on both; the uniform ones
had every block low in prismd's map and in the trainers'; the Prism ones got maps from prismd
(and the dynamic ones calibrated when prismd asked); the static ones forced the blocks the
experiment says, from prism-int8's first low step; the hook ones counted their wire bytes, the
others DDP's FP32 figure; step 0's training loss is the same everywhere; low_share is what the
per-step precisions give; the corpus splits are disjoint, non-empty and without the excluded
files; the sweep over prism-int8's recorded trace is there and its live row decides as prismd
did; and the plot and the README section were written from it (the rest of the README left as it
was). StaticPlanTest checks the fixed plans' block choice without processes."""

import json
import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
BENCH = os.path.join(SOURCE, "bench", "train_quality")
sys.path.insert(0, BENCH)

import report  # noqa: E402
import run  # noqa: E402

STEPS = run.SMOKE["steps"]
LAYERS = run.SMOKE["layers"]
RUN_TIMEOUT_S = 240  # below ctest's TIMEOUT (tests/train_quality.cmake: 300)
PRISM_CONFIGS = [c["name"] for c in run.CONFIGS if c["prism"]]


def png_size(path):
    """(width, height) of a PNG file, after checking its signature, its chunks' CRCs and that its
    image data inflates to the size 8-bit RGB rows need."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    at, idat, size = 8, b"", None
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        (crc,) = struct.unpack(">I", data[at + 8 + n:at + 12 + n])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in chunk {kind}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    w, h = size
    assert len(zlib.decompress(idat)) == h * (1 + 3 * w), "image data of the wrong size"
    return size


class TrainQualitySmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="prism-train-quality-")
        # A README with hand-written text around the results section, to see it kept.
        cls.readme = os.path.join(cls.dir, "README.md")
        with open(cls.readme, "w") as f:
            f.write(f"# before\n\n{report.RESULTS_BEGIN}\nold table\n{report.RESULTS_END}\n\n## after\n")
        # run.py in a process group of its own; prismd, the agents and the trainers each in
        # theirs (run.py stops them on SIGTERM). Past RUN_TIMEOUT_S (below ctest's TIMEOUT, so that
        # this test, not ctest, ends it), run.py gets SIGTERM, then its group SIGKILL.
        proc = subprocess.Popen([sys.executable, os.path.join(BENCH, "run.py"), "--smoke", "--build-dir", BUILD,
                                 "--out", cls.dir, "--readme", cls.readme], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                _, stderr = proc.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                _, stderr = proc.communicate()
            stderr += f"\n(test: run.py --smoke ran past {RUN_TIMEOUT_S} s and was stopped)"
            proc.returncode = proc.returncode or 1
        cls.stderr = stderr
        if proc.returncode != 0:
            for name in sorted(os.listdir(os.path.join(cls.dir, "runs"))) if os.path.isdir(
                    os.path.join(cls.dir, "runs")) else []:
                for log in ("prismd.log", "trainer0.log", "trainer1.log", "agent0.log"):
                    path = os.path.join(cls.dir, "runs", name, log)
                    if os.path.exists(path):
                        with open(path, errors="replace") as f:
                            sys.stderr.write(f"---- {name}/{log} ----\n{f.read()[-3000:]}\n")
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise AssertionError(f"run.py --smoke exited with {proc.returncode}:\n{stderr}")
        with open(os.path.join(cls.dir, "results.json")) as f:
            cls.doc = json.load(f)
        cls.results = cls.doc["configs"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_every_configuration_ran_every_step_with_finite_losses(self):
        self.assertEqual(list(self.results), [c["name"] for c in run.CONFIGS])
        for name, r in self.results.items():
            with self.subTest(name):
                self.assertEqual(r["steps"], STEPS)
                self.assertTrue(r["finite"])
                # Evaluations at step 0, every eval_every steps and after the last.
                self.assertEqual([s for s, _ in r["evals"]], [0, 4, 8])
                self.assertTrue(all(math.isfinite(v) for _, v in r["evals"]))
                self.assertTrue(math.isfinite(r["held_out_loss"]))
                self.assertEqual(r["held_out_loss"], sum(v for _, v in r["evals"][-2:]) / 2)
                self.assertTrue(r["params_identical"], "the ranks' parameters differ at the end")
                for rank in (0, 1):
                    with open(os.path.join(self.dir, "runs", name, f"steps{rank}.jsonl")) as f:
                        rows = [json.loads(line) for line in f]
                    self.assertEqual([row["step"] for row in rows], list(range(STEPS)))
                    self.assertTrue(all(math.isfinite(row["loss"]) for row in rows))

    def test_the_loss_of_the_same_model_is_the_same_before_training(self):
        # Same seed, same initial weights, same held-out windows: every configuration's step-0
        # evaluation is the same number.
        self.assertEqual(len({r["evals"][0][1] for r in self.results.values()}), 1)

    def steps_log(self, name, rank=0):
        with open(os.path.join(self.dir, "runs", name, f"steps{rank}.jsonl")) as f:
            return [json.loads(line) for line in f]

    def test_the_first_training_step_is_the_same_everywhere(self):
        # Same weights, same first batch, no map before the first decision, hook or not (the
        # loss comes before the all-reduce): step 0's training loss is one number on each rank.
        for rank in (0, 1):
            with self.subTest(rank=rank):
                losses = {name: self.steps_log(name, rank)[0]["loss"] for name in self.results}
                self.assertEqual(len(set(losses.values())), 1, losses)

    def test_low_share_is_what_the_steps_ran_with(self):
        # The reported share of block bytes low, recomputed from each step's precisions (what the
        # trainer applied, BF16 before --low-from) and the blocks' BF16 bytes, in train.py's order.
        for name, r in self.results.items():
            with self.subTest(name):
                block_bytes = [2 * n for n in r["model"]["block_params"]]
                total = 0.0
                rows = self.steps_log(name)
                for row in rows:
                    total += sum(block_bytes[i] for i, p in enumerate(row["precisions"]) if p != "bf16") / sum(
                        block_bytes)
                self.assertEqual(total / len(rows), r["low_share"])
                if r.get("low_from_step"):
                    self.assertTrue(all(p == "bf16" for row in rows[:r["low_from_step"]] for p in row["precisions"]))

    def test_the_splits_are_disjoint_and_not_empty(self):
        import corpus
        info = self.results["bf16"]["corpus"]
        for max_files in (run.SMOKE["max_files"], None):
            with self.subTest(max_files=max_files):
                splits = corpus.splits(max_files)
                self.assertTrue(splits["train"] and splits["held_out"])
                self.assertFalse(set(splits["train"]) & set(splits["held_out"]))
                self.assertFalse({os.path.relpath(f, corpus.ROOT) for f in splits["train"] + splits["held_out"]}
                                 & set(info["excluded"]))
                if max_files == run.SMOKE["max_files"]:  # what the smoke run trained and evaluated on
                    self.assertEqual([info["train"]["files"], info["held_out"]["files"]],
                                     [len(splits["train"]), len(splits["held_out"])])
        self.assertIn("pydoc_data/topics.py", info["excluded"])
        self.assertIn("encodings/cp1252.py", info["excluded"])
        self.assertEqual(self.doc["settings"]["corpus"]["train"], info["train"])

    def test_uniform_configurations_had_every_block_low(self):
        for name, fmt in (("uniform-int8", "int8"), ("uniform-fp8", "fp8_e4m3"), ("uniform-int4", "int4")):
            with self.subTest(name):
                r = self.results[name]
                self.assertEqual(r["forced_low"], list(range(LAYERS)))
                self.assertEqual(r["final_precisions"], [fmt] * LAYERS)
                self.assertEqual(r["prismd"]["precisions"], [fmt] * LAYERS)
                self.assertEqual(r["final_low_blocks"], LAYERS)
                # Low from the step the map came in effect, at the latest the wait step.
                self.assertGreaterEqual(r["low_share"], (STEPS - run.SMOKE_WAIT_AT) / STEPS)
                self.assertLess(r["low_share"], 1.0)

    def test_prism_configurations_got_maps_from_prismd(self):
        for name in PRISM_CONFIGS:
            with self.subTest(name):
                r = self.results[name]
                self.assertGreaterEqual(r["map_version"], 1)
                self.assertIsNotNone(r["map_wait_s"], "no map came within the wait")
                self.assertEqual(r["prismd"]["map_version"], r["map_version"])
                self.assertEqual(r["prismd"]["precisions"], r["final_precisions"])
                self.assertTrue(r["switches"], "the trainers never switched to a map")
                self.assertEqual(r["switches"][-1][1], r["map_version"])
                self.assertTrue(os.path.exists(os.path.join(self.dir, r["prismd"]["telemetry"])))
                if r["prism"] == "dynamic":
                    # prismd asked for calibration (a fresh store) of the job's low format, and the
                    # trainers measured every block in it (errors by format, then block).
                    self.assertIsNotNone(r["calibration"])
                    self.assertEqual(list(r["calibration"]["errors"]), [r["low"]])
                    self.assertEqual(sorted(r["calibration"]["errors"][r["low"]]), [str(b) for b in range(LAYERS)])
                    self.assertGreater(r["low_share"], 0)

    def test_static_plans_force_as_many_blocks_as_prism_int8_ended_with(self):
        k = self.results["prism-int8"]["final_low_blocks"]
        first, rnd = self.results["static-first"], self.results["static-random"]
        self.assertEqual(first["forced_low"], list(range(k)))
        self.assertEqual(rnd["forced_low"], sorted(random.Random(run.STATIC_RANDOM_SEED).sample(range(LAYERS), k)))
        for r in (first, rnd):
            self.assertEqual(r["static_low_from"], [k, "prism-int8"])
            # Low from prism-int8's first step with a block low, as prism-int8 was.
            self.assertEqual(r["low_from_step"], self.results["prism-int8"]["first_low_step"])
            self.assertEqual(r["final_low_blocks"], k)
            self.assertEqual([b for b, p in enumerate(r["prismd"]["precisions"]) if p == "int8"], r["forced_low"])

    def test_no_prism_means_no_block_low(self):
        for name in ("bf16", "fp8hook"):
            self.assertEqual(self.results[name]["low_share"], 0.0)
            self.assertEqual(self.results[name]["final_precisions"], ["bf16"] * LAYERS)

    def test_hook_configurations_counted_wire_bytes(self):
        for name, r in self.results.items():
            with self.subTest(name):
                wire = r["wire"]
                if r["hook"]:
                    self.assertEqual(r["hook"], "fp8_e4m3")
                    self.assertGreaterEqual(wire["calls"], STEPS)
                    self.assertGreater(wire["wire_bytes"], 0)
                    self.assertLess(wire["wire_bytes"], wire["bf16_bytes"])
                else:
                    # DDP's FP32 ring all-reduce on 2 ranks: 4 bytes a parameter a step; BF16 half.
                    params = r["model"]["params"]
                    self.assertEqual(wire["wire_bytes"], 4 * params * STEPS)
                    self.assertEqual(wire["bf16_bytes"], 2 * params * STEPS)
        # The same gradients' BF16 figure whichever way they went.
        self.assertEqual(self.results["fp8hook"]["wire"]["bf16_bytes"], self.results["bf16"]["wire"]["bf16_bytes"])

    def test_sweep_over_the_recorded_run(self):
        # prismd records the job's trace and prismctl replays it with --sweep: the sweep is there.
        sw = self.doc["sweep"]
        self.assertIsNotNone(sw, f"no sweep: {self.doc.get('no_sweep')}")
        self.assertIsNone(self.doc["no_sweep"])
        self.assertEqual(sw["trace"], os.path.join("runs", "prism-int8", "trace.ptrace"))
        grid = [[float(v) for v in values.split(",")] for _, values in run.SMOKE_SWEEP]
        self.assertEqual(len(sw["rows"]), len(grid[0]) * len(grid[1]))
        self.assertEqual([[float(r["config"][k]) for k, _ in run.SMOKE_SWEEP] for r in sw["rows"]],
                         [[a, b] for a in grid[0] for b in grid[1]])
        # The live config replayed offline decides as prismd did live: its last saving and its
        # switches are those of prismd's telemetry of the run.
        with open(os.path.join(self.dir, "runs", "prism-int8", "telemetry.jsonl")) as f:
            telemetry = [json.loads(line) for line in f]
        live = [r for r in sw["rows"] if all(float(r["config"][k]) == float(run.SMOKE_POLICY[k])
                                             for k, _ in run.SMOKE_SWEEP)]
        self.assertEqual(len(live), 1)
        self.assertEqual(live[0]["saving_end_pct"], telemetry[-1]["estimated_bandwidth_saving_pct"])
        self.assertEqual(live[0]["switches"], sum(t["precision_changes"] for t in telemetry))
        self.assertEqual(live[0]["first_decision_step"], telemetry[0]["step_id"])

    def test_plot_and_readme_section_written(self):
        self.assertEqual(png_size(os.path.join(self.dir, "loss.png")), (1500, 760))
        with open(self.readme) as f:
            text = f.read()
        self.assertTrue(text.startswith(f"# before\n\n{report.RESULTS_BEGIN}\n"))
        self.assertTrue(text.endswith(f"{report.RESULTS_END}\n\n## after\n"))
        self.assertNotIn("old table", text)
        for name in self.results:
            self.assertIn(f"\n| {name} | ", text)


    def test_replicates_of_another_seed_in_the_report(self):
        """run.py --report-only --replicate DIR: another seed's results go into results.json and a
        table by seed (each against its own seed's bf16); they stay when the report is made again
        without --replicate; a DIR of other settings, of the same seed, or without results.json is
        refused by name, and nothing is written (by a run that would train, before it trains)."""
        work = tempfile.mkdtemp(prefix="prism-train-quality-rep-")
        try:
            main, other, bad = (os.path.join(work, n) for n in ("main", "seed7", "bad"))
            for d in (main, other, bad):
                os.makedirs(d)
            shutil.copy(os.path.join(self.dir, "results.json"), main)
            rep = json.loads(json.dumps(self.doc))
            rep["settings"]["seed"] = 7
            rep["configs"] = {n: rep["configs"][n] for n in ("bf16", "prism-int8")}
            rep["configs"]["bf16"]["held_out_loss"] = 2.0
            rep["configs"]["prism-int8"]["held_out_loss"] = 2.01
            with open(os.path.join(other, "results.json"), "w") as f:
                json.dump(rep, f)

            def make_report(*extra):
                return subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--report-only", "--build-dir",
                                       BUILD, "--out", main, *extra], capture_output=True, text=True, timeout=120)

            def written():
                with open(os.path.join(main, "results.json")) as f:
                    return f.read()

            before = written()
            bad_seed = json.loads(json.dumps(rep))
            bad_seed["settings"]["seed"] = self.doc["settings"]["seed"]
            bad_steps = json.loads(json.dumps(rep))
            bad_steps["settings"]["steps"] += 1
            for doc, message in ((bad_seed, f"seed {self.doc['settings']['seed']} is this results.json's own seed"),
                                 (bad_steps, "made with other settings (they differ in: steps)"),
                                 (None, f"no {os.path.join(bad, 'results.json')}")):
                if doc is None:
                    os.remove(os.path.join(bad, "results.json"))
                else:
                    with open(os.path.join(bad, "results.json"), "w") as f:
                        json.dump(doc, f)
                proc = make_report("--replicate", bad)
                self.assertEqual(proc.returncode, 1, proc.stderr)
                self.assertEqual(proc.stderr.strip().splitlines()[-1], f"run.py: --replicate {bad}: {message}")
                self.assertEqual(written(), before)
            # A run that would train checks --replicate before anything runs: nothing written.
            with open(os.path.join(bad, "results.json"), "w") as f:
                json.dump(bad_steps, f)
            proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--smoke", "--configs", "bf16",
                                   "--build-dir", BUILD, "--out", main, "--replicate", bad],
                                  capture_output=True, text=True, timeout=120)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertEqual(proc.stderr.strip().splitlines()[-1],
                             f"run.py: --replicate {bad}: made with other settings (they differ in: steps)")
            self.assertEqual(written(), before)
            self.assertEqual(os.listdir(main), ["results.json"])

            proc = make_report("--replicate", other)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            for again in (False, True):
                if again:
                    self.assertEqual(make_report().returncode, 0)
                with open(os.path.join(main, "results.json")) as f:
                    doc = json.load(f)
                self.assertEqual(doc["replicates"], {"7": {
                    "generated": rep["generated"],
                    "configs": {n: {"held_out_loss": r["held_out_loss"], "low_share": r["low_share"],
                                    "final_low_blocks": r["final_low_blocks"]} for n, r in rep["configs"].items()}}})
                with open(os.path.join(main, "results.md")) as f:
                    text = f.read()
                seed = self.doc["settings"]["seed"]
                b, p = self.results["bf16"]["held_out_loss"], self.results["prism-int8"]["held_out_loss"]
                d = report.pct_vs(p, b)
                self.assertIn(f"| configuration | seed {seed} | seed 7 |\n| --- | ---: | ---: |\n"
                              f"| bf16 | {b:.4f} | 2.0000 |\n| prism-int8 | {p:.4f} ({d:+.2f}%) | 2.0100 (+0.50%) |\n",
                              text)
                self.assertIn(f"- prism-int8 against bf16: {d:+.2f}% (seed {seed}), +0.50% (seed 7); the seeds "
                              f"differ by {abs(0.5 - d):.2f} points.", text)
        finally:
            shutil.rmtree(work, ignore_errors=True)


class StaticPlanTest(unittest.TestCase):
    """The fixed plans' blocks, without processes."""

    def test_forced_blocks(self):
        self.assertEqual(run.forced_blocks("static-first", 8, 3), [0, 1, 2])
        self.assertEqual(run.forced_blocks("static-random", 8, 3), [3, 5, 6])  # random.Random(16)
        self.assertEqual(run.forced_blocks("uniform", 8, None), list(range(8)))
        with self.assertRaises(ValueError):
            run.forced_blocks("dynamic", 8, 3)

    def test_first_low_step(self):
        self.assertEqual(run.first_low_step({"switches": [[2, 1, ["bf16", "bf16"]], [5, 2, ["bf16", "int8"]]]}), 5)
        self.assertIsNone(run.first_low_step({"switches": [[2, 1, ["bf16", "bf16"]]]}))

    def test_stale_static_results(self):
        p = {"final_low_blocks": 2, "switches": [[4, 1, ["int8", "int8", "bf16"]]]}
        ok = {"forced_low": [0, 1], "low_from_step": 4}
        results = {"prism-int8": p, "static-first": ok, "static-random": {"forced_low": [0], "low_from_step": 4}}
        self.assertEqual(run.stale_statics(results), ["static-random"])
        results["static-random"] = {"forced_low": [1, 2], "low_from_step": 0}
        self.assertEqual(run.stale_statics(results), ["static-random"])
        self.assertEqual(run.stale_statics({"static-first": ok}), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
