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
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_grpc as tg  # noqa: E402  (Prismd, Agent; BUILD and the generated messages)

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


def scaled(stats, x=None, w=None):
    """Block stats with the x half's figures times x and the w half's times w (None: the half
    left out, its numel 0)."""
    out = dict(stats)
    if x is None:
        out.update(x_l2=0.0, x_max_abs=0.0, x_numel=0, y_numel=0)
    else:
        out.update(x_l2=stats["x_l2"] * x, x_max_abs=stats["x_max_abs"] * x)
    if w is None:
        out.update(w_l2=0.0, w_max_abs=0.0, w_numel=0)
    else:
        out.update(w_l2=stats["w_l2"] * w, w_max_abs=stats["w_max_abs"] * w)
    return out


def tensor_stats(stats_list):
    return [pb.BlockTensorStats(block_id=b["id"], x_l2=s["x_l2"], x_max_abs=s["x_max_abs"], x_numel=int(s["x_numel"]),
                                w_l2=s["w_l2"], w_max_abs=s["w_max_abs"], w_numel=int(s["w_numel"]),
                                y_numel=int(s["y_numel"]))
            for b, s in zip(BLOCKS, stats_list)]


def grads_of(step, rank):
    """Gradients varying by step (l2: the mean over ranks is then exact whatever the order the
    ranks arrive in) and by rank (max_abs: their maximum)."""
    return [(g * (1 + 0.5 * (step % 2)), m * (1 + 0.25 * rank)) for g, m in GRADS]


class HybridPrismdTest(unittest.TestCase):
    PRISMD_FLAGS = ()

    def setUp(self):
        self.prismd = tg.Prismd(*self.PRISMD_FLAGS, config_extra=HYBRID)
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def connect(self, rank, profile=None, blocks=None):
        """An agent of rank (its class's profile or profile, the layout or one of blocks); returns
        (agent, welcome)."""
        a = tg.Agent(self.prismd)
        self.agents.append(a)
        lay = layout()
        if blocks is not None:
            lay = pb.ModelLayout(blocks=blocks)
        a.send(hello=pb.Hello(job_id=JOB, rank=rank, world_size=4, node="node-%d" % rank,
                              device=profile or device(CLASSES[rank]), layout=lay))
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
        self.assertEqual(version, 1)  # the decision at step 2 commits the first map, which carries the plan
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

    # ---- review fixes: durability, limits, withdrawal, repeated refusals, the planner's inputs ----

    def restart_with(self, *flags):
        """prismd again on a fresh directory, with flags."""
        self.assertEqual(self.prismd.stop(), 0, self.prismd.logs())
        self.prismd = tg.Prismd(*flags, config_extra=HYBRID)

    def wait_metric(self, name, labels, ready):
        """/metrics until ready(value of name{labels}) holds (bounded: 800 x 25 ms)."""
        key = (name, frozenset(labels))
        for _ in range(800):
            v = metrics(self.prismd).get(key)
            if v is not None and ready(v):
                return v
            time.sleep(0.025)
        raise AssertionError("%s%s never became ready" % (name, sorted(labels)))

    def plans_total(self):
        m = metrics(self.prismd)
        return tuple(m[("prism_job_plans_total", frozenset([("job", JOB), ("outcome", o)]))]
                     for o in ("planned", "kept", "refused"))

    def update_of_version(self, agent, version):
        """The agent's update of map version (earlier ones skipped; bounded)."""
        for _ in range(10):
            u = self.next_update(agent)
            if u.map_version == version:
                return u
        raise AssertionError("no update of map version %d" % version)

    def test_a_restart_keeps_the_plan_while_ranks_reconnect_of_one_class(self):
        agents, updates, doc = self.first_plan()
        for a in agents:
            a.close()
        self.agents = []
        self.prismd.kill()
        self.prismd = tg.Prismd(reuse=self.prismd)
        # Only the V100s (ranks 0 and 1: one class) are back, and a decision happens (steps merged
        # at the step timeout without ranks 2 and 3): the ranks not yet back do not withdraw the plan.
        agents = [self.connect(r)[0] for r in (0, 1)]
        self.steps(agents, (3, 4), GRADS)
        self.wait_decisions(1)
        after = self.plan()
        self.assertEqual((after["status"], after["map_version"], after["plan"]),
                         ("planned", doc["map_version"], doc["plan"]))
        self.assertEqual(after["classes_seen"], ["v100-32gb"])
        self.assertEqual(self.plans_total(), (0, 0, 0))
        # The T4s come back: their Welcome carries their class's plan with the same map.
        for rank in (2, 3):
            a, welcome = self.connect(rank)
            self.assertEqual(welcome.map.map_version, doc["map_version"])
            self.assertEqual(welcome.map.compute_plan.device_class, "t4-16gb")
            self.assertEqual(list(welcome.map.compute_plan.low_blocks), low_blocks(doc["plan"], "t4-16gb"))

    def test_more_classes_times_blocks_than_the_flags_allow_are_refused_before_planning(self):
        # 2 classes x 48 blocks = 96 > 2 x 47: refused before anything is allocated (the pairs of
        # the non-fixed class alone, 48, would be refused by --hybrid-max-pairs only afterwards).
        self.restart_with("--hybrid-max-classes", "2", "--hybrid-max-pairs", "47")
        agents = self.all_connect()
        self.steps(agents, (1, 2), GRADS)
        doc = self.plan(lambda d: d["status"] == "refused")
        self.assertEqual(doc["message"],
                         "2 device classes x 48 blocks: more than 94 (prismd --hybrid-max-classes x --hybrid-max-pairs)")
        self.assertIsNone(doc["plan"])

    def test_the_class_profile_the_tensor_halves_and_the_gradients_follow_their_rules(self):
        # Rank 3's profile differs from rank 2's (memory): the class's profile is its lowest rank's.
        other = device("t4-16gb")
        other.memory_bytes = PROFILES["t4-16gb"]["memory_bytes"] // 2
        agents = [self.connect(r, profile=other if r == 3 else None)[0] for r in range(4)]

        def stats_for(step, rank):
            # Step 1: both halves from every rank, each its own figures. Step 2: the x half from
            # ranks 2 and 3, the w half from ranks 0 and 1.
            if step == 1:
                return [scaled(s, x=1 + 0.125 * rank, w=1 + 0.0625 * rank) for s in STATS]
            if rank >= 2:
                return [scaled(s, x=1.5 + 0.125 * rank) for s in STATS]
            return [scaled(s, w=0.75 + 0.125 * rank) for s in STATS]

        for step in (1, 2):
            for rank, a in enumerate(agents):
                a.send(step_report=pb.StepReport(step=step, blocks=[
                    pb.BlockGradStats(block_id=b["id"], l2_norm=g[0], max_abs=g[1], numel=int(b["stats"]["w_numel"]))
                    for b, g in zip(BLOCKS, grads_of(step, rank))], tensor_stats=tensor_stats(stats_for(step, rank))))
        doc = self.plan(lambda d: d["status"] == "planned")
        # The later step wins (step 2 over step 1's rank 0), the same step the lower rank (x: rank 2
        # over 3; w: rank 0 over 1); g is the merged step 2's: the l2 mean and the max_abs maximum.
        x = [scaled(s, x=1.5 + 0.125 * 2) for s in STATS]
        w = [scaled(s, w=0.75) for s in STATS]
        stats = [dict(s, x_l2=xs["x_l2"], x_max_abs=xs["x_max_abs"], w_l2=ws["w_l2"], w_max_abs=ws["w_max_abs"])
                 for s, xs, ws in zip(STATS, x, w)]
        merged = [(g, m) for (g, _), (_, m) in zip(grads_of(2, 0), grads_of(2, 3))]
        code, out, err = prismctl_plan(plan_json(merged, stats_of=stats))
        self.assertEqual(code, 0, err)
        self.assertEqual(doc["plan"], json.loads(out))
        self.assertTrue(self.raw_plan_body().endswith(',"plan":' + out.strip() + "}"))
        # Other rules would have planned otherwise: rank 3's profile, step 1's halves, step 1's g.
        for wrong in (dict(plan_json(merged, stats_of=stats), classes=[
                          {"name": "t4-16gb", "ranks": 2, "profile": dict(PROFILES["t4-16gb"],
                                                                          memory_bytes=other.memory_bytes)},
                          {"name": "v100-32gb", "ranks": 2, "profile": PROFILES["v100-32gb"]}]),
                      plan_json(merged, stats_of=[scaled(s, x=1, w=1) for s in STATS]),
                      plan_json([(g, m) for (g, _), (_, m) in zip(grads_of(1, 0), grads_of(1, 3))], stats_of=stats)):
            wcode, wout, werr = prismctl_plan(wrong)
            self.assertNotEqual((wcode, wout), (0, out))

    def test_a_plan_is_durable_before_it_goes_out_and_an_unsaved_map_is_sent_once_saved(self):
        agents, updates, doc = self.first_plan()
        version = doc["map_version"]
        code, out, err = prismctl_plan(plan_json(GRADS, stats_of=STATS2))
        self.assertEqual(code, 0, err)
        second = json.loads(out)
        self.assertNotEqual(low_blocks(second, "t4-16gb"), low_blocks(doc["plan"], "t4-16gb"))
        # Another process holds the store's write lock during the decision at step 4 (a re-plan):
        # its save fails after prismd's busy timeout (5 s).
        lock = sqlite3.connect(os.path.join(self.prismd.dir, "data", "prism.db"), timeout=10, isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            self.steps(agents, (3, 4), GRADS, stats_of=STATS2)
            self.wait_metric("prism_store_errors_total", (), lambda v: v >= 1)
            self.assertIn("cannot save a decision", self.prismd.logs())
            # The new map and plan are not durable: no Welcome carries them, nor the new map with the
            # old plan. The Hello tries the save first; the store still refuses it, so the stream
            # ends UNAVAILABLE (the agent reconnects later). (The policy thread waits out the busy
            # timeout at each save it tries meanwhile: a longer bound here.)
            a3 = tg.Agent(self.prismd)
            self.agents.append(a3)
            a3.send(hello=pb.Hello(job_id=JOB, rank=3, world_size=4, node="node-3", device=device(CLASSES[3]),
                                   layout=layout()))
            m = a3.inbox.get(timeout=60)
            self.assertIsNone(m, m)
            self.assertEqual(a3.done.code(), tg.grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(a3.done.details(), "prismd cannot save the job's state; retry")
            self.wait_metric("prism_store_retries_total", (), lambda v: v >= 1)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # Released: the map and its plan are saved, then sent, without another decision. The
        # stream refused above did not replace rank 3's agent.
        for rank, a in enumerate(agents):
            u = self.update_of_version(a, version + 1)
            self.assertEqual((u.decided_step, u.effective_step), (4, 7))
            self.assertEqual(list(u.compute_plan.low_blocks), low_blocks(second, CLASSES[rank]))
        sent = self.plan(lambda d: d["map_version"] == version + 1)
        self.assertEqual(sent["plan"], second)
        # A Hello now gets the saved pair.
        agents[3], welcome = self.connect(3)
        self.assertEqual(welcome.map.map_version, version + 1)
        self.assertEqual(list(welcome.map.compute_plan.low_blocks), low_blocks(second, "t4-16gb"))
        # One failed decision save is one store error (ERROR); each failed retry of it counts
        # apart, with one WARN line naming its backoff (1 s after the failure, then doubling).
        m = metrics(self.prismd)
        self.assertEqual(m[("prism_store_errors_total", frozenset())], 1)
        retries = m[("prism_store_retries_total", frozenset())]
        logs = self.prismd.logs()
        self.assertEqual(logs.count("cannot save a decision"), 1)
        warns = [ln for ln in logs.splitlines() if "still cannot save the job's state" in ln]
        self.assertEqual(len(warns), retries)
        self.assertTrue(all("retry_in_ms=%d" % min(60000, 2000 << i) in ln for i, ln in enumerate(warns)), warns)
        # kill -9 and restart: the store has what the agents were sent.
        for a in agents:
            a.close()
        self.agents = []
        self.prismd.kill()
        self.prismd = tg.Prismd(reuse=self.prismd)
        after = self.plan()
        self.assertEqual((after["status"], after["map_version"], after["decided_step"], after["effective_step"]),
                         ("planned", version + 1, 4, 7))
        self.assertEqual(after["plan"], second)
        for rank in (0, 2):
            a, welcome = self.connect(rank)
            self.assertEqual(welcome.map.map_version, version + 1)
            self.assertEqual(list(welcome.map.compute_plan.low_blocks), low_blocks(second, CLASSES[rank]))

    def test_more_pairs_than_the_flag_allows_are_refused_and_a_repeated_refusal_counts_as_refused(self):
        self.restart_with("--hybrid-max-pairs", "47")
        agents = self.all_connect()
        self.steps(agents, (1, 2), GRADS)
        doc = self.plan(lambda d: d["status"] == "refused")
        # The automatic rule fixes the V100s: 48 blocks of the T4s' class to plan.
        self.assertEqual(doc["message"],
                         "48 (class, block) pairs of non-fixed classes to plan: more than 47 (prismd --hybrid-max-pairs)")
        self.assertIsNone(doc["plan"])
        self.steps(agents, (3, 4), GRADS)
        self.wait_decisions(2)
        self.assertEqual(self.plans_total(), (0, 0, 2))
        self.assertEqual(self.prismd.logs().count("hybrid plan refused"), 1)  # the repeat is not logged again
        # 48 allowed: planned.
        self.restart_with("--hybrid-max-pairs", "48")
        self.agents = []
        agents, updates, doc = self.first_plan()
        self.assertEqual(self.plans_total(), (1, 0, 0))

    def test_the_same_refusal_again_counts_as_refused_and_is_logged_once(self):
        agents, updates, doc = self.first_plan()
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid_memory_fraction": 0.25}))
        self.assertEqual(status, 200, body)
        self.steps(agents, (3, 4, 5, 6), GRADS)
        self.wait_decisions(3)
        self.assertEqual(self.plans_total(), (1, 0, 2))
        self.assertEqual(self.prismd.logs().count("hybrid plan refused"), 1)
        self.assertEqual(self.plan()["map_version"], doc["map_version"])

    def test_more_classes_than_the_flag_allows_are_refused_until_a_hello_changes_a_class(self):
        self.restart_with("--hybrid-max-classes", "2")
        third = device("t4-16gb")
        third.device_class = "t4-16gb-b"
        agents = [self.connect(r, profile=third if r == 3 else None)[0] for r in range(4)]
        self.steps(agents, (1, 2), GRADS)
        doc = self.plan(lambda d: d["status"] == "refused")
        self.assertEqual(doc["message"], "3 device classes: more than 2 to plan (prismd --hybrid-max-classes)")
        self.assertEqual(doc["classes_seen"], ["t4-16gb", "t4-16gb-b", "v100-32gb"])
        # Rank 3 comes back in the T4s' class: two classes, planned.
        agents[3], _ = self.connect(3)
        self.assertEqual(self.plan(lambda d: len(d["classes_seen"]) == 2)["classes_seen"], ["t4-16gb", "v100-32gb"])
        self.steps(agents, (3, 4), GRADS)
        doc = self.plan(lambda d: d["status"] == "planned")
        code, out, err = prismctl_plan(plan_json(GRADS))
        self.assertEqual(code, 0, err)
        self.assertEqual(doc["plan"], json.loads(out))
        self.assertEqual(self.plans_total(), (1, 0, 1))

    def assert_withdrawn(self, agents, version, decided, status):
        for a in agents:
            u = self.update_of_version(a, version + 1)
            self.assertEqual((u.decided_step, u.effective_step), (decided, decided + 3))
            self.assertFalse(u.HasField("compute_plan"))
        doc = self.plan(lambda d: d["plan"] is None)
        self.assertEqual(doc["status"], status)
        self.assertEqual((doc["map_version"], doc["decided_step"], doc["effective_step"]), (None, None, None))
        self.assertNotIn(("prism_job_plan_iteration_seconds", frozenset([("job", JOB)])), metrics(self.prismd))
        return doc

    def test_the_plan_is_withdrawn_when_fewer_than_two_classes_remain(self):
        agents, updates, doc = self.first_plan()
        for rank in (2, 3):
            agents[rank], welcome = self.connect(rank, profile=device("v100-32gb"))
            # Until the next decision the plan in force stands: its V100 class's (all high).
            self.assertEqual(welcome.map.compute_plan.device_class, "v100-32gb")
            self.assertEqual(list(welcome.map.compute_plan.low_blocks), [])
        self.steps(agents, (3, 4), GRADS)
        self.assert_withdrawn(agents, doc["map_version"], 4, "single_class")

    def test_a_withdrawal_after_a_refusal_reads_single_class(self):
        agents, updates, doc = self.first_plan()
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid_memory_fraction": 0.25}))
        self.assertEqual(status, 200, body)
        self.steps(agents, (3, 4), GRADS)
        self.plan(lambda d: d["status"] == "refused")
        for rank in (2, 3):
            agents[rank], _ = self.connect(rank, profile=device("v100-32gb"))
        self.steps(agents, (5, 6), GRADS)
        after = self.assert_withdrawn(agents, doc["map_version"], 6, "single_class")
        self.assertEqual(after["message"], "the job's ranks report fewer than two device classes")

    def test_the_plan_is_withdrawn_when_the_layout_block_count_changes(self):
        agents, updates, doc = self.first_plan()
        extra = pb.BlockInfo(id=48, name="extra", param_bytes_bf16=1024, flops=1024, activation_bytes_bf16=1024,
                             state_bytes=1024)
        agents[0], _ = self.connect(0, blocks=list(layout().blocks) + [extra])
        self.steps(agents, (3, 4), GRADS)
        after = self.assert_withdrawn(agents, doc["map_version"], 4, "waiting_for_statistics")
        self.assertEqual(after["blocks_missing_statistics"], 1)

    def test_a_restart_with_hybrid_off_puts_no_stored_plan_in_force_and_withdraws_it(self):
        agents, updates, doc = self.first_plan()
        status, body = self.prismd.http("/v1/jobs/%s/config" % JOB, "PATCH", json.dumps({"hybrid": False}))
        self.assertEqual(status, 200, body)
        for a in agents:
            a.close()
        self.agents = []
        self.prismd.kill()
        self.prismd = tg.Prismd(reuse=self.prismd)
        after = self.plan()
        self.assertEqual(after["status"], "disabled")
        self.assertIsNone(after["plan"])
        agents = []
        for rank in range(4):
            a, welcome = self.connect(rank)
            self.assertEqual(welcome.map.map_version, doc["map_version"])
            self.assertFalse(welcome.map.HasField("compute_plan"))
            agents.append(a)
        # Agents may hold the plan from before the restart: the next decision sends a map without it.
        self.steps(agents, (3, 4), GRADS)
        self.assert_withdrawn(agents, doc["map_version"], 4, "disabled")


if __name__ == "__main__":
    unittest.main(verbosity=2)
