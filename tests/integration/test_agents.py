#!/usr/bin/python3
"""prismd, 4 prism-agents and 4 trainers (examples/train_demo.py: Python, torch, gloo) training
one model together on this machine, every process real, every socket on loopback or in a scratch
directory. The run goes through, in order:

  1. a first map: every rank starts using each map version at the same step, its effective step;
  2. an override sent over REST mid-run: a second version, again switched at the same step by all;
  3. prismd killed (SIGKILL): training goes on, every rank keeps the last map;
  4. prismd restarted on the same data dir: every agent reconnects (a second Welcome) and the job's
     steps move on in prismd;
  5. the agent of rank 3 killed: trainer 3 goes on to its last step, its reports dropped and
     counted.
Every wait is bounded (by time and by polling count); every process is stopped on every path."""

import json
import signal
import unittest
import urllib.request

import openapi_check
from cluster import Cluster, get_json, metric, read_log
from prismtest import wait_for

WORLD = 4
STEPS = 420
STEP_MS = 40
JOB = "agents-test"
CONFIG = {"warmup_steps": 5, "update_interval_steps": 5, "history_window": 3, "apply_lag_steps": 4,
          "min_steps_between_switches": 5, "step_timeout_ms": 400, "run_calibration": True,
          "calibration_samples": 2}


AGENT_OPTIONS = ["--device", "cpu", "--profile-budget-ms", "100"]


def min_step(c):
    """The last step every trainer has logged (-1 before each has one)."""
    return min((rows[-1]["step"] if rows else -1) for rows in map(read_log, c.logs))


class AgentsTest(unittest.TestCase):
    def test_four_ranks_with_prismd_and_agents_failing(self):
        Cluster("prism-agents-test-", WORLD, CONFIG).run(self.run_scenario)

    def first_use(self, c, ranks):
        """{map_version: {rank: first step that used it}} from the trainers' logs."""
        seen = {}
        for r in ranks:
            for row in read_log(c.logs[r]):
                seen.setdefault(row["map_version"], {}).setdefault(r, row["step"])
        return seen

    def check_same_switch_step(self, c, ranks, versions):
        seen = self.first_use(c, ranks)
        for v in versions:
            steps = seen.get(v, {})
            self.assertEqual(sorted(steps), sorted(ranks), f"map version {v} was not used by every rank: {steps}")
            self.assertEqual(len(set(steps.values())), 1, f"ranks switched to map version {v} at different steps: "
                             f"{steps}")
            rows = [row for row in read_log(c.logs[ranks[0]]) if row["map_version"] == v]
            self.assertEqual(rows[0]["step"], rows[0]["effective_step"],
                             f"map version {v} was first used at step {rows[0]['step']}, not its effective step")

    def run_scenario(self, c):
        c.start_prismd()
        for r in range(WORLD):
            c.start_agent(r, AGENT_OPTIONS)
        c.start_trainers(JOB, STEPS, STEP_MS)

        # 1. A first map, used by every rank from its effective step.
        wait_for("every rank past a first map", lambda: all(
            any(row["map_version"] >= 1 and row["step"] >= row["effective_step"] + 3 for row in read_log(p))
            for p in c.logs), timeout_s=60)
        blocks = get_json(c.http, f"/v1/jobs/{JOB}/blocks")
        v1 = blocks["map_version"]
        self.assertGreaterEqual(v1, 1)
        low = [b["id"] for b in blocks["blocks"] if b["precision"] != "bf16"]
        self.assertTrue(low, f"the first map put no block at a low precision: {blocks['blocks']}")

        # 2. An override changes the map mid-run: a new version, switched by all at one step.
        req = urllib.request.Request(f"http://{c.http}/v1/jobs/{JOB}/overrides", method="PUT",
                                     data=json.dumps({"force_bf16_blocks": [low[0]]}).encode(),
                                     headers={"Content-Type": "application/json"})
        openapi_check.urlopen(req, timeout=5).read()
        wait_for("every rank on a second map", lambda: all(
            any(row["map_version"] > v1 for row in read_log(p)) for p in c.logs), timeout_s=30)
        v2 = max(row["map_version"] for row in read_log(c.logs[0]))
        for r in range(WORLD):
            rows = [row for row in read_log(c.logs[r]) if row["map_version"] == v2]
            self.assertEqual(rows[0]["precisions"][low[0]], "bf16", f"rank {r}: the override is not in version {v2}")
        self.check_same_switch_step(c, list(range(WORLD)), range(1, v2 + 1))

        # 3. prismd killed: training goes on with the last map.
        c.prismd.send_signal(signal.SIGKILL)
        c.prismd.wait(timeout=10)
        killed_at = min_step(c)
        wait_for("training to go on without prismd", lambda: min_step(c) >= killed_at + 25, timeout_s=30)
        for r in range(WORLD):
            after = [row for row in read_log(c.logs[r]) if row["step"] > killed_at + 2]
            self.assertTrue(after)
            self.assertEqual({row["map_version"] for row in after}, {v2}, f"rank {r} changed its map without prismd")
            self.assertFalse(after[-1]["upstream"], f"rank {r}: the hint table still says prismd is connected")

        # 4. prismd restarted: every agent reconnects, and the job's steps move on in prismd.
        c.start_prismd()
        wait_for("every agent welcomed again", lambda: all(
            (metric(c.agent_metrics(r), "prism_agent_upstream_welcomes_total") or 0) >= 2 and
            metric(c.agent_metrics(r), "prism_agent_upstream_connected") == 1 for r in range(WORLD)), timeout_s=30)
        restarted_step = get_json(c.http, "/v1/jobs")
        job = [j for j in restarted_step["jobs"] if j["job_id"] == JOB][0]
        self.assertEqual(job["map_version"], v2, "prismd lost the map over its restart")
        wait_for("prismd's step to move on after the restart", lambda: [
            j for j in get_json(c.http, "/v1/jobs")["jobs"]
            if j["job_id"] == JOB and j["step"] >= job["step"] + 10], timeout_s=30)

        # 5. The agent of rank 3 killed: trainer 3 goes on.
        c.agents[3].send_signal(signal.SIGKILL)
        c.agents[3].wait(timeout=10)
        agent_killed_at = min_step(c)
        for r in range(WORLD):
            out, _ = c.trainers[r].communicate(timeout=STEPS * STEP_MS / 1000 + 60)
            self.assertEqual(c.trainers[r].returncode, 0, f"trainer {r} failed")
            summary = json.loads(out.strip().splitlines()[-1])
            self.assertEqual(summary["late_switches"], 0, f"rank {r} applied a map after its effective step")
            rows = read_log(c.logs[r])
            self.assertEqual([row["step"] for row in rows], list(range(STEPS)), f"trainer {r} skipped steps")
            if r == 3:
                self.assertGreater(summary["counters"]["reports_dropped"], 0)
                self.assertFalse(rows[-1]["connected"], "trainer 3 still thinks its agent is there")
                self.assertLess(agent_killed_at, STEPS - 10, "the agent was killed too late to show anything")
            self.assertEqual(summary["calibrations"], 1, f"rank {r}: prismd asked for calibration once")
        self.check_same_switch_step(c, [0, 1, 2], sorted(self.first_use(c, [0, 1, 2])))
        # The calibration errors reached the policy: every block's score has an error part.
        blocks = get_json(c.http, f"/v1/jobs/{JOB}/blocks")["blocks"]
        self.assertEqual([b["error_score"] is not None for b in blocks], [True] * len(blocks))

        # SIGTERM ends the agents cleanly.
        for r in range(3):
            c.agents[r].send_signal(signal.SIGTERM)
            self.assertEqual(c.agents[r].wait(timeout=10), 0, f"agent {r} did not exit 0 on SIGTERM")


if __name__ == "__main__":
    unittest.main()
