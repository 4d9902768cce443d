#!/usr/bin/python3
"""Hybrid devices end to end (issue 15, item 5): prismd, four prism-agents and four trainers
(examples/train_demo.py --hybrid: Python, torch, gloo), every process real, every socket on
loopback or in a scratch directory. Ranks 0 and 1 play a fast training device and ranks 2 and 3 a
slow one with little memory, through `prism-agent --profile-file`. The run checks, in order:

  1. prismd plans: the fast class (the largest 16-bit throughput, so fixed) runs every block high;
     the slow class's plan fits its memory budget, which is too small for every block high
     (uniform_high does not fit) and leaves room for exactly four of the eight blocks;
  2. every rank takes each plan at the same step, the effective step of the map it came with;
     at every step the slow ranks run the same blocks low, the fast ranks none, and the blocks they
     run low are the plan's;
  3. prismd killed (SIGKILL) after training and restarted on the same data dir: the plan it serves
     is the one it had, and every agent gets it again with its Welcome.

The memory figures are exact: the demo's block is a Linear(64, 64) in FP32 (4,160 parameters:
state 4,160 x (2 x 4 + 8) = 66,560 bytes), its probe batch 32 x 64 (activations 2 x 2,048 = 4,096
BF16 bytes). Every wait is bounded; every process is stopped on every path."""

import json
import signal
import unittest

from cluster import Cluster, get_json, metric, read_log
from prismtest import wait_for

WORLD = 4
BLOCKS = 8
STEPS = 160
STEP_MS = 40
JOB = "hybrid-test"
CONFIG = {"warmup_steps": 5, "update_interval_steps": 5, "history_window": 3, "apply_lag_steps": 4,
          "min_steps_between_switches": 5, "step_timeout_ms": 400, "run_calibration": False, "hybrid": True}
STATE = 4160 * (2 * 4 + 8)
ACTIVATIONS = 2 * 32 * 64
# 0.9 x this is 557,100 bytes: all eight blocks low need 8 x (66,560 + 2,048) = 548,864, each block
# raised to fp16 adds 2,048, so four fit (557,056) and a fifth does not (559,104).
SLOW_MEMORY = 619000
FAST = {"device_class": "fast", "device_name": "a fast training device (test)", "memory_bytes": 80 * 10 ** 9,
        "bf16_ops_per_second": 1e11, "fp16_ops_per_second": 1e11, "int8_ops_per_second": 2e11,
        "fp8_ops_per_second": 0, "quantize_cost": {"fixed_seconds": 1e-4, "seconds_per_byte": 1e-9},
        "cast_cost": {"fixed_seconds": 1e-5, "seconds_per_byte": 1e-10}, "h2d_bytes_per_second": 2e10}
# No BF16 (its high format is fp16), INT8 fast but quantizing costs more than it saves on a block
# this small: every raise makes it faster, so only memory stops the raises.
SLOW = {"device_class": "slow", "device_name": "a slow inference device (test)", "memory_bytes": SLOW_MEMORY,
        "bf16_ops_per_second": 0, "fp16_ops_per_second": 4e9, "int8_ops_per_second": 8e9,
        "fp8_ops_per_second": 0, "quantize_cost": {"fixed_seconds": 1e-4, "seconds_per_byte": 1e-9},
        "cast_cost": {"fixed_seconds": 1e-5, "seconds_per_byte": 1e-10}, "h2d_bytes_per_second": 5e9}
CLASS_OF = ["fast", "fast", "slow", "slow"]


TRAINER_OPTIONS = ["--blocks", str(BLOCKS), "--width", "64", "--hybrid", "--tensor-stats-every", "5"]


def start_cluster():
    """The cluster, with a profile file a device class for its agents."""
    c = Cluster("prism-hybrid-test-", WORLD, CONFIG)
    c.profiles = {p["device_class"]: c.write_json(p["device_class"] + ".profile.json", p) for p in (FAST, SLOW)}
    return c


class HybridClusterTest(unittest.TestCase):
    def test_two_classes_plan_switch_and_restart(self):
        start_cluster().run(self.run_scenario)

    def check_plan(self, answer):
        """The plan prismd serves: fast all high, slow within budget with exactly four blocks low."""
        self.assertEqual(answer["status"], "planned", answer)
        plan = answer["plan"]
        classes = {k["name"]: k for k in plan["classes"]}
        self.assertEqual(sorted(classes), ["fast", "slow"])
        fast, slow = classes["fast"], classes["slow"]
        self.assertTrue(fast["fixed"])
        self.assertEqual((fast["high_format"], fast["plan"]), ("bf16", ["bf16"] * BLOCKS))
        self.assertFalse(slow["fixed"])
        self.assertEqual((slow["high_format"], slow["low_format"]), ("fp16", "int8"))
        self.assertEqual(sorted(slow["plan"]), ["fp16"] * 4 + ["int8"] * 4, slow["plan"])
        self.assertEqual(slow["budget_bytes"], 0.9 * SLOW_MEMORY)
        self.assertEqual(slow["memory_bytes"], BLOCKS * STATE + 4 * ACTIVATIONS + 4 * ACTIVATIONS * 8 / 16)
        self.assertLessEqual(slow["memory_bytes"], slow["budget_bytes"])
        self.assertFalse(plan["baselines"]["uniform_high"]["fits"])
        self.assertTrue(plan["baselines"]["uniform_low"]["fits"])
        self.assertEqual(sum(1 for r in plan["raises"] if r["accepted"]), 4)
        self.assertEqual({r["reason"] for r in plan["raises"] if not r["accepted"]}, {"memory"})
        return [i for i, p in enumerate(slow["plan"]) if p == "int8"]

    def run_scenario(self, c):
        c.start_prismd()
        for r in range(WORLD):
            c.start_agent(r, ["--profile-file", c.profiles[CLASS_OF[r]]])
        c.start_trainers(JOB, STEPS, STEP_MS, TRAINER_OPTIONS)

        # 1. A plan, taken by every rank.
        wait_for("every rank past a first compute plan", lambda: all(
            any(row["plan_map_version"] >= 1 and row["step"] >= row["effective_step"] + 3 for row in read_log(p))
            for p in c.logs), timeout_s=90)
        low = self.check_plan(get_json(c.http, f"/v1/jobs/{JOB}/plan"))
        self.assertEqual(len(low), 4)

        for r in range(WORLD):
            out, _ = c.trainers[r].communicate(timeout=STEPS * STEP_MS / 1000 + 120)
            self.assertEqual(c.trainers[r].returncode, 0, f"trainer {r} failed")
            summary = json.loads(out.strip().splitlines()[-1])
            self.assertEqual(summary["late_switches"], 0, f"rank {r} applied a map after its effective step")
        logs = [read_log(p) for p in c.logs]
        for r in range(WORLD):
            self.assertEqual([row["step"] for row in logs[r]], list(range(STEPS)), f"trainer {r} skipped steps")

        # 2. The same plan at the same step everywhere: per step, the maps agree across ranks, the
        # fast ranks run nothing low, the slow ranks the same blocks.
        versions = set()
        for s in range(STEPS):
            rows = [logs[r][s] for r in range(WORLD)]
            self.assertEqual(len({row["map_version"] for row in rows}), 1, f"step {s}: ranks on different maps")
            self.assertEqual(len({row["plan_map_version"] for row in rows}), 1, f"step {s}: ranks on different plans")
            self.assertEqual([rows[0]["compute_low"], rows[1]["compute_low"]], [[], []], f"step {s}: a fast rank ran low")
            self.assertEqual(rows[2]["compute_low"], rows[3]["compute_low"], f"step {s}: the slow ranks differ")
            if rows[0]["plan_map_version"]:
                versions.add(rows[0]["plan_map_version"])
                self.assertEqual(len(rows[2]["compute_low"]), 4, f"step {s}: {rows[2]['compute_low']}")
            else:
                self.assertEqual(rows[2]["compute_low"], [], f"step {s}: ran low before any plan")
        self.assertTrue(versions, "no rank ever took a plan")
        for v in versions:
            first = min(s for s in range(STEPS) if logs[0][s]["plan_map_version"] == v)
            self.assertEqual(logs[0][first]["map_version"], v)
            self.assertEqual(first, logs[0][first]["effective_step"],
                             f"plan of map {v} first used at step {first}, not its effective step")
        # The plan in force at the end is the one the slow ranks ran last, unless a later one was
        # decided with an effective step past the run's end.
        final = get_json(c.http, f"/v1/jobs/{JOB}/plan")
        final_low = self.check_plan(final)
        self.assertGreaterEqual(final["map_version"], logs[2][-1]["plan_map_version"])
        if final["effective_step"] < STEPS:
            self.assertEqual(logs[2][-1]["plan_map_version"], final["map_version"])
            self.assertEqual(logs[2][-1]["compute_low"], final_low)

        # 3. A restart keeps the plan: prismd serves the same one, and every agent is welcomed with it.
        welcomes = [metric(c.agent_metrics(r), "prism_agent_upstream_welcomes_total") for r in range(WORLD)]
        c.prismd.send_signal(signal.SIGKILL)
        c.prismd.wait(timeout=10)
        c.start_prismd()
        after = get_json(c.http, f"/v1/jobs/{JOB}/plan")
        for key in ("status", "map_version", "decided_step", "effective_step", "plan"):
            self.assertEqual(after[key], final[key], f"the plan's {key} changed over prismd's restart")
        wait_for("every agent welcomed again", lambda: all(
            (metric(c.agent_metrics(r), "prism_agent_upstream_welcomes_total") or 0) > welcomes[r] and
            metric(c.agent_metrics(r), "prism_agent_upstream_connected") == 1 for r in range(WORLD)), timeout_s=30)
        for r in range(WORLD):
            text = c.agent_metrics(r)
            self.assertEqual(metric(text, "prism_agent_plan_map_version"), final["map_version"], f"agent {r}")
            self.assertEqual(metric(text, "prism_agent_plan_low_blocks"), 4 if CLASS_OF[r] == "slow" else 0,
                             f"agent {r}")
        for r in range(WORLD):
            c.agents[r].send_signal(signal.SIGTERM)
            self.assertEqual(c.agents[r].wait(timeout=10), 0, f"agent {r} did not exit 0 on SIGTERM")


if __name__ == "__main__":
    unittest.main()
