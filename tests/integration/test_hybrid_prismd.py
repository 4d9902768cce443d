#!/usr/bin/python3
"""Hybrid-device compute plans in prismd (issue 15 item 3, DESIGN 11), end to end: the real prismd
on loopback, four Python grpcio agents in two device classes (the V100-32GB and T4-16GB profiles
and the GPT-like 48-block layout of examples/hybrid/), step reports with gradient and tensor
statistics. The plan prismd makes at a decision is compared, as text, with what `prismctl plan`
prints for the same inputs written as PLAN.json; each agent's map update carries its class's plan
with the map's version and effective step; a decision with the same ranking keeps the plan, a
changed ranking re-plans, a start that does not fit and an unknown fixed class are refused (the plan
in force stays), a restart keeps the plan (REST and Welcome), /metrics shows it, and bad
tensor_stats entries are refused and counted. Every wait is bounded; prismd is stopped in every
path; every HTTP answer is validated against the OpenAPI document (test_grpc's Prismd.http)."""

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_grpc as tg  # noqa: E402  (Prismd, Agent; BUILD and the generated messages)
import test_grpc_hardening as hardening  # noqa: E402  (Base: prismd per test; its tests are not collected here)

pb = tg.pb
SOURCE = os.environ.get("PRISM_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
EXAMPLES = os.path.join(SOURCE, "examples", "hybrid")
PRISMCTL = os.path.join(tg.BUILD, "service", "prismctl")
JOB = "job-h"
LINK = {"bytes_per_second": 1600000000.0, "latency_seconds": 3e-05}
HYBRID = {"hybrid": True, "hybrid_link_bytes_per_second": LINK["bytes_per_second"],
          "hybrid_link_latency_seconds": LINK["latency_seconds"], "force_bf16_blocks": [0]}
CLASSES = ("v100-32gb", "v100-32gb", "t4-16gb", "t4-16gb")  # rank -> device class


def load(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return json.load(f)


GPT = load("gpt48.plan.json")
PROFILES = {"v100-32gb": load("v100-32gb.profile.json"), "t4-16gb": load("t4-16gb.profile.json")}
BLOCKS = sorted(GPT["blocks"], key=lambda b: b["id"])


def device(cls):
    p = PROFILES[cls]
    return pb.DeviceProfile(
        device_class=p["device_class"], device_name=p["device_name"], memory_bytes=p["memory_bytes"],
        bf16_ops_per_second=p["bf16_ops_per_second"], fp16_ops_per_second=p["fp16_ops_per_second"],
        int8_ops_per_second=p["int8_ops_per_second"], fp8_ops_per_second=p["fp8_ops_per_second"],
        quantize_cost=pb.LinearCost(**p["quantize_cost"]), cast_cost=pb.LinearCost(**p["cast_cost"]),
        h2d_bytes_per_second=p["h2d_bytes_per_second"])


def layout():
    return pb.ModelLayout(blocks=[
        pb.BlockInfo(id=b["id"], name=b["name"], param_bytes_bf16=int(b["param_bytes_bf16"]), flops=int(b["flops"]),
                     activation_bytes_bf16=int(b["activation_bytes_bf16"]), state_bytes=int(b["state_bytes"]))
        for b in BLOCKS])


def report(step, grads, tensors=True, extra=(), stats_of=None):
    """A StepReport: every block's gradient figures from grads [(g_l2, g_max_abs)], and (tensors)
    both halves of every block's tensor statistics (stats_of, by block index; default: the GPT
    example's)."""
    stats = []
    if tensors:
        for i, b in enumerate(BLOCKS):
            s = (stats_of or STATS)[i]
            stats.append(pb.BlockTensorStats(block_id=b["id"], x_l2=s["x_l2"], x_max_abs=s["x_max_abs"],
                                             x_numel=int(s["x_numel"]), w_l2=s["w_l2"], w_max_abs=s["w_max_abs"],
                                             w_numel=int(s["w_numel"]), y_numel=int(s["y_numel"])))
    stats.extend(extra)
    return pb.StepReport(step=step, blocks=[
        pb.BlockGradStats(block_id=b["id"], l2_norm=g[0], max_abs=g[1], numel=int(b["stats"]["w_numel"]))
        for b, g in zip(BLOCKS, grads)], tensor_stats=stats)


GRADS = [(b["stats"]["g_l2"], b["stats"]["g_max_abs"]) for b in BLOCKS]
STATS = [b["stats"] for b in BLOCKS]
# Other activation statistics (the blocks' input norms in reverse order): another raise ranking.
STATS2 = [dict(s, x_l2=r["x_l2"], x_max_abs=r["x_max_abs"]) for s, r in zip(STATS, reversed(STATS))]


def plan_json(grads, config_extra=None, stats_of=None):
    """The PLAN.json of the job's inputs: blocks with the layout's cost figures, the tensor
    statistics sent and the gradients of the decision; the classes in name order with the profile
    of their lowest rank; the link and the hybrid config keys."""
    blocks = []
    for i, (b, g) in enumerate(zip(BLOCKS, grads)):
        stats = dict((stats_of or STATS)[i], g_l2=g[0], g_max_abs=g[1])
        blocks.append({"id": b["id"], "name": b["name"], "flops": int(b["flops"]),
                       "param_bytes_bf16": int(b["param_bytes_bf16"]),
                       "activation_bytes_bf16": int(b["activation_bytes_bf16"]),
                       "state_bytes": int(b["state_bytes"]), "stats": stats})
    config = {"memory_fraction": 0.9, "gamma": 4, "low_format": "auto", "force_bf16_blocks": [0]}
    config.update(config_extra or {})
    return {"blocks": blocks,
            "classes": [{"name": c, "ranks": 2, "profile": PROFILES[c]} for c in sorted(PROFILES)],
            "link": LINK, "config": config}


def prismctl_plan(plan):
    """(exit status, stdout, stderr) of `prismctl plan` on plan written as a file."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
        path = f.name
    try:
        r = subprocess.run([PRISMCTL, "plan", path], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    return r.returncode, r.stdout, r.stderr


def metrics(prismd):
    """{(name, frozenset(labels)): value} of prismd's /metrics."""
    status, body = prismd.http("/metrics")
    out = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if "{" in name_labels:
            name, labels = name_labels[:-1].split("{", 1)
            pairs = frozenset(tuple(kv.split("=", 1)) for kv in labels.split(",")) if labels else frozenset()
            pairs = frozenset((k, v.strip('"')) for k, v in pairs)
        else:
            name, pairs = name_labels, frozenset()
        out[(name, pairs)] = float(value)
    return out


def low_blocks(plan_object, cls):
    c = [c for c in plan_object["classes"] if c["name"] == cls][0]
    return [i for i, f in enumerate(c["plan"]) if f != c["high_format"]]


class HybridPrismdTest(hardening.Base):
    """prismd with HYBRID on, started and stopped (exit 0) around each test, with its agents
    closed, as test_grpc_hardening's Base does."""

    config_extra = HYBRID

    def connect(self, rank):
        """An agent of rank (its class's profile, the layout); returns (agent, welcome)."""
        a = tg.Agent(self.prismd)
        self.agents.append(a)
        a.send(hello=pb.Hello(job_id=JOB, rank=rank, world_size=4, node="node-%d" % rank,
                              device=device(CLASSES[rank]), layout=layout()))
        m = a.next()
        self.assertEqual(m.WhichOneof("kind"), "welcome")
        return a, m.welcome

    def all_connect(self):
        return [self.connect(r)[0] for r in range(4)]

    def steps(self, agents, steps, grads, tensors=True, stats_of=None):
        for step in steps:
            for a in agents:
                a.send(step_report=report(step, grads, tensors, stats_of=stats_of))

    def next_update(self, agent):
        """The agent's next PrecisionUpdate (other messages skipped; bounded)."""
        for _ in range(100):
            m = agent.next()
            if m.WhichOneof("kind") == "update":
                return m.update
        raise AssertionError("no update")

    def wait_decisions(self, n):
        """Until the job has made n decisions (/metrics; bounded)."""
        key = ("prism_job_decisions_total", frozenset([("job", JOB)]))
        for _ in range(400):
            if metrics(self.prismd).get(key) == n:
                return
            time.sleep(0.025)
        raise AssertionError("the job never made %d decisions" % n)

    def plan(self, ready=lambda d: True):
        return self.prismd.json_until("/v1/jobs/%s/plan" % JOB, ready)

    def raw_plan_body(self):
        status, body = self.prismd.http("/v1/jobs/%s/plan" % JOB)
        self.assertEqual(status, 200)
        return body

    def first_plan(self):
        """Four agents, two steps: the decision at step 2 plans. Returns (agents, updates, REST)."""
        agents = self.all_connect()
        self.steps(agents, (1, 2), GRADS)
        updates = [self.next_update(a) for a in agents]
        doc = self.plan(lambda d: d["status"] == "planned")
        return agents, updates, doc

    def test_the_plan_equals_prismctl_plan_and_goes_with_the_map_to_each_class(self):
        agents, updates, doc = self.first_plan()
        code, out, err = prismctl_plan(plan_json(GRADS))
        self.assertEqual(code, 0, err)
        # The plan object is the one prismctl prints, byte for byte.
        body = self.raw_plan_body()
        self.assertTrue(body.endswith(',"plan":' + out.strip() + "}"), body[-300:])
        expected = json.loads(out)
        self.assertEqual(doc["plan"], expected)
        self.assertEqual(doc["job"], JOB)
        self.assertTrue(doc["hybrid"])
        self.assertEqual(doc["message"], "")
        self.assertEqual(doc["classes_seen"], ["t4-16gb", "v100-32gb"])
        self.assertEqual(doc["blocks_missing_statistics"], 0)
        self.assertEqual((doc["decided_step"], doc["effective_step"]), (2, 5))
        self.assertEqual((doc["replans"], doc["plans_kept"]), (1, 0))
        version = doc["map_version"]
        self.assertGreaterEqual(version, 1)
        # The example's plan: the T4s run 22 blocks low (memory-bound), the V100s (fixed) none.
        t4_low = low_blocks(expected, "t4-16gb")
        self.assertEqual(len(t4_low), 22)
        self.assertEqual(low_blocks(expected, "v100-32gb"), [])
        for rank, u in enumerate(updates):
            self.assertEqual((u.map_version, u.decided_step, u.effective_step), (version, 2, 5))
            self.assertTrue(u.HasField("compute_plan"))
            cp = u.compute_plan
            cls = CLASSES[rank]
            self.assertEqual(cp.device_class, cls)
            self.assertEqual(cp.low_format, pb.INT8)
            self.assertEqual(cp.high_format, "fp16")
            self.assertEqual(list(cp.low_blocks), low_blocks(expected, cls))
            self.assertEqual(cp.predicted_iteration_seconds, expected["iteration_seconds"])
            c = [c for c in expected["classes"] if c["name"] == cls][0]
            self.assertEqual(cp.compute_seconds, c["compute_seconds"])
        # Same class, same message; the map part is the same for every rank.
        self.assertEqual(updates[0], updates[1])
        self.assertEqual(updates[2], updates[3])
        self.assertEqual(updates[0].blocks, updates[2].blocks)
        # Metrics of the plan in force.
        m = metrics(self.prismd)
        job = ("job", JOB)
        self.assertEqual(m[("prism_job_plan_iteration_seconds", frozenset([job]))], expected["iteration_seconds"])
        for c in expected["classes"]:
            labels = frozenset([job, ("device_class", c["name"])])
            self.assertEqual(m[("prism_job_plan_compute_seconds", labels)], c["compute_seconds"])
            self.assertEqual(m[("prism_job_plan_low_blocks", labels)], len(low_blocks(expected, c["name"])))
        for outcome, n in (("planned", 1), ("kept", 0), ("refused", 0)):
            self.assertEqual(m[("prism_job_plans_total", frozenset([job, ("outcome", outcome)]))], n)

    def test_watch_streams_never_carry_the_plan(self):
        watch = self.prismd.channel.unary_stream("/prism.v1.PolicyService/Watch",
                                                 request_serializer=pb.WatchRequest.SerializeToString,
                                                 response_deserializer=pb.PrecisionUpdate.FromString)
        agents = self.all_connect()
        stream = watch(pb.WatchRequest(job_id=JOB), timeout=tg.WAIT_S)
        self.steps(agents, (1, 2), GRADS)
        u = next(stream)
        self.assertFalse(u.HasField("compute_plan"))
        stream.cancel()
        doc = self.plan(lambda d: d["status"] == "planned")
        self.assertEqual(u.map_version, doc["map_version"])

    def test_same_ranking_keeps_the_plan_and_a_changed_ranking_replans(self):
        agents, updates, doc = self.first_plan()
        version = doc["map_version"]
        # Steps 3 and 4: the same statistics, the decision at 4 keeps the plan.
        self.steps(agents, (3, 4), GRADS)
        kept = self.plan(lambda d: d["plans_kept"] == 1)
        self.assertEqual((kept["replans"], kept["map_version"], kept["decided_step"]), (1, version, 2))
        self.assertEqual(kept["plan"], doc["plan"])
        # Steps 5 and 6: other activation statistics, another ranking: a new plan at 6.
        self.steps(agents, (5, 6), GRADS, stats_of=STATS2)
        new = self.plan(lambda d: d["replans"] == 2)
        code, out, err = prismctl_plan(plan_json(GRADS, stats_of=STATS2))
        self.assertEqual(code, 0, err)
        expected = json.loads(out)
        self.assertEqual(new["plan"], expected)
        self.assertTrue(self.raw_plan_body().endswith(',"plan":' + out.strip() + "}"))
        self.assertEqual(new["plans_kept"], 1)
        # Its low sets differ from the first plan's: it went out with a map of its own at step 6.
        self.assertNotEqual(low_blocks(expected, "t4-16gb"), low_blocks(doc["plan"], "t4-16gb"))
        self.assertGreater(new["map_version"], version)
        self.assertEqual((new["decided_step"], new["effective_step"]), (6, 9))
        for rank, a in enumerate(agents):
            for _ in range(10):
                u = self.next_update(a)
                if u.map_version == new["map_version"]:
                    break
            self.assertEqual((u.map_version, u.decided_step, u.effective_step), (new["map_version"], 6, 9))
            self.assertEqual(list(u.compute_plan.low_blocks), low_blocks(expected, CLASSES[rank]))
        m = metrics(self.prismd)
        for outcome, n in (("planned", 2), ("kept", 1), ("refused", 0)):
            self.assertEqual(m[("prism_job_plans_total", frozenset([("job", JOB), ("outcome", outcome)]))], n)

    def test_a_start_that_does_not_fit_is_refused_and_the_plan_in_force_stays(self):
        agents, updates, doc = self.first_plan()
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid_memory_fraction": 0.25}))
        self.assertEqual(status, 200, body)
        self.steps(agents, (3, 4), GRADS)
        refused = self.plan(lambda d: d["status"] == "refused")
        code, out, err = prismctl_plan(plan_json(GRADS, {"memory_fraction": 0.25}))
        self.assertEqual((code, out), (1, ""))
        self.assertTrue(err.startswith("prismctl plan: class \"t4-16gb\" does not fit"), err)
        self.assertEqual(refused["message"], err[len("prismctl plan: "):].strip())
        self.assertEqual(refused["plan"], doc["plan"])  # the plan in force stays, with its map
        self.assertEqual((refused["map_version"], refused["decided_step"], refused["replans"]),
                         (doc["map_version"], 2, 1))
        # A fixed class that no rank reports is refused at planning time, not at PATCH time.
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH",
                                        json.dumps({"hybrid_memory_fraction": 0.9, "hybrid_fixed_classes": ["a100"]}))
        self.assertEqual(status, 200, body)
        self.steps(agents, (5, 6), GRADS)
        fixed = self.plan(lambda d: "a100" in d["message"])
        self.assertEqual(fixed["status"], "refused")
        self.assertEqual(fixed["message"], 'hybrid_fixed_classes[0]: no rank reports device class "a100"')
        m = metrics(self.prismd)
        for outcome, n in (("planned", 1), ("kept", 0), ("refused", 2)):
            self.assertEqual(m[("prism_job_plans_total", frozenset([("job", JOB), ("outcome", outcome)]))], n)
        # Back to the automatic rule: planned again (the same plan as the first).
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid_fixed_classes": None}))
        self.assertEqual(status, 200, body)
        self.steps(agents, (7, 8), GRADS)
        again = self.plan(lambda d: d["status"] == "planned")
        self.assertEqual(again["plan"], doc["plan"])
        self.assertEqual(again["replans"], 2)
        # The same low sets as the plan in force: no new map for it.
        self.assertEqual(again["map_version"], doc["map_version"])

    def test_turning_hybrid_off_withdraws_the_plan_with_a_new_map(self):
        agents, updates, doc = self.first_plan()
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid": False}))
        self.assertEqual(status, 200, body)
        self.steps(agents, (3, 4), GRADS)
        for a in agents:
            u = self.next_update(a)
            self.assertEqual((u.map_version, u.decided_step, u.effective_step), (doc["map_version"] + 1, 4, 7))
            self.assertFalse(u.HasField("compute_plan"))
        off = self.plan(lambda d: d["status"] == "disabled")
        self.assertIsNone(off["plan"])
        self.assertEqual((off["map_version"], off["decided_step"], off["effective_step"]), (None, None, None))
        m = metrics(self.prismd)
        self.assertNotIn(("prism_job_plan_iteration_seconds", frozenset([("job", JOB)])), m)

    def test_a_restart_keeps_the_plan_for_rest_and_welcome(self):
        agents, updates, doc = self.first_plan()
        body = self.raw_plan_body()
        for a in agents:
            a.close()
        self.agents = []
        self.prismd.kill()
        self.prismd = tg.Prismd(reuse=self.prismd)
        after = self.plan()
        self.assertEqual(after["status"], "planned")
        for key in ("plan", "map_version", "decided_step", "effective_step"):
            self.assertEqual(after[key], doc[key], key)
        self.assertTrue(self.raw_plan_body().endswith(body[body.index(',"plan":'):]))
        m = metrics(self.prismd)
        self.assertEqual(m[("prism_job_plan_iteration_seconds", frozenset([("job", JOB)]))],
                         doc["plan"]["iteration_seconds"])
        for rank in (0, 2):
            a, welcome = self.connect(rank)
            self.assertEqual(welcome.map.map_version, doc["map_version"])
            self.assertTrue(welcome.map.HasField("compute_plan"))
            self.assertEqual(welcome.map.compute_plan.device_class, CLASSES[rank])
            self.assertEqual(list(welcome.map.compute_plan.low_blocks), low_blocks(doc["plan"], CLASSES[rank]))
            self.assertEqual(welcome.map.compute_plan.predicted_iteration_seconds, doc["plan"]["iteration_seconds"])

    def test_status_before_planning_and_without_hybrid(self):
        # One class only: single_class; nothing planned.
        a, welcome = self.connect(0)
        self.assertFalse(welcome.map.HasField("compute_plan"))
        doc = self.plan(lambda d: d["classes_seen"] == ["v100-32gb"])
        self.assertEqual(doc["status"], "single_class")
        self.assertIsNone(doc["plan"])
        self.assertEqual((doc["map_version"], doc["decided_step"], doc["effective_step"]), (None, None, None))
        self.assertEqual(doc["blocks_missing_statistics"], 48)  # the layout names 48 blocks, none has statistics
        # Two classes, statistics missing: waiting.
        b, _ = self.connect(2)
        doc = self.plan(lambda d: len(d["classes_seen"]) == 2)
        self.assertEqual(doc["status"], "waiting_for_statistics")
        # Gradients only (no tensor_stats): still waiting after a decision.
        c, _ = self.connect(1)
        d, _ = self.connect(3)
        self.steps([a, c, b, d], (1, 2), GRADS, tensors=False)
        self.wait_decisions(1)
        doc = self.plan()
        self.assertEqual(doc["blocks_missing_statistics"], 48)
        self.assertEqual(doc["status"], "waiting_for_statistics")
        # hybrid false: disabled.
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid": False}))
        self.assertEqual(status, 200, body)
        self.steps([a, c, b, d], (3, 4), GRADS)
        self.wait_decisions(2)
        doc = self.plan()
        self.assertEqual(doc["status"], "disabled")
        self.assertFalse(doc["hybrid"])
        self.assertIsNone(doc["plan"])
        self.assertEqual(doc["blocks_missing_statistics"], 0)
        status, body = self.prismd.http("/v1/jobs/nope/plan")
        self.assertEqual(status, 404)

    def test_bad_tensor_stats_are_refused_and_counted_the_rest_kept(self):
        a, _ = self.connect(0)
        bad = [pb.BlockTensorStats(block_id=999, x_l2=1.0, x_max_abs=1.0, x_numel=4),     # unknown block
               pb.BlockTensorStats(block_id=1, x_l2=-1.0, x_max_abs=1.0, x_numel=4),      # negative
               pb.BlockTensorStats(block_id=2, w_l2=math.nan, w_max_abs=1.0, w_numel=4),  # non-finite
               pb.BlockTensorStats(block_id=3, w_l2=1.0, w_max_abs=math.inf, w_numel=4)]  # non-finite
        a.send(step_report=report(1, GRADS, tensors=True, extra=bad))
        m = None
        for _ in range(200):
            m = metrics(self.prismd)
            if m.get(("prism_tensor_stats_total", frozenset([("outcome", "refused")]))) == 4:
                break
            time.sleep(0.025)
        self.assertEqual(m[("prism_tensor_stats_total", frozenset([("outcome", "refused")]))], 4)
        self.assertEqual(m[("prism_tensor_stats_total", frozenset([("outcome", "accepted")]))], 48)
        # The report's other parts were kept: its step reached the job, and every block has both
        # halves of its tensor statistics (only gradients at a decision are missing).
        ranks = self.prismd.json_until("/v1/jobs/%s/ranks" % JOB, lambda d: d["ranks"][0]["last_step"] == 1)
        self.assertEqual(ranks["ranks"][0]["last_step"], 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
