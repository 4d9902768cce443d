#!/usr/bin/python3
"""Where users see the numerics state of issue 17 (DESIGN 4.7): REST (GET /v1/jobs and
.../blocks, validated against openapi.json by the Prismd helper), /metrics and `prismctl blocks`
show each block's format, reason, candidate, hold and saturation figures and the job's loss-spike
counters, with exact values; and the store keeps W across a restart, so a spike right after one
still rolls back (the spike's W came from the store).

The real prismd on loopback ports, a grpcio rank (test_grpc's Prismd and Agent). Every wait is
bounded; nothing waits on a clock."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_grpc as g  # noqa: E402
from test_prismd_metrics import Exposition  # noqa: E402

pb = g.pb

# test_grpc's CONFIG (warmup 2, interval 2: decisions at the 2nd, 4th, 6th... step; history 2,
# lag 3, no cooldown) with s = grad_score (error weight 0), a low format per block, pow2 scales,
# spikes over a W of 2 held 10 steps, a saturation threshold of one half and a quantization error
# threshold of 1/16 (an error of 1/64 scores exactly 0.25).
CONFIG = {"low_precision": "auto", "low_formats": ["int4", "fp8_e4m3", "int8"], "grad_weight": 1.0,
          "error_weight": 0.0, "scale_mode": "pow2", "loss_spike_factor": 2, "loss_spike_window": 2,
          "loss_spike_hold_steps": 10, "saturation_threshold": 0.5, "quant_error_threshold": 0.0625}

# Five blocks of 2000 bytes each. The norms add up to 10 at every step (mean 2): rel = norm / 2 and
# grad_score = min(rel / 2, 1) (grad_sensitivity_threshold 2).
#   steps 1-2: (5, 1, 1, 1, 2): scores 1, .25, .25, .25, .5. First decision (step 2): block 0 bf16;
#     1, 2, 3 low (< 0.3), each in its candidate: 1 int4 (error 1/64 <= 1/16), 2 fp8_e4m3 (int4 0.5,
#     fp8 1/64), 3 int8 (no calibration: the last of low_formats); block 4 ambiguous: bf16.
#   steps 3-4: (6.5, 1, 1, 1, .5): block 4's score 0.125 < 0.3 - 0.1: low (int8) by score at 4.
#     Block 3 saturated 0.75 in both steps (> 0.5): bf16 by saturation at 4. Block 1 (0.25, 0.125)
#     twice, block 2 (0, 0.5) then (0.25, 0.25): means (0.25, 0.125) and (0.125, 0.375).
#   step 5 (no scheduled decision): loss 3 > 2 x median(1, 1): a spike. Block 4 went low by score
#     at 4 (5 - 4 <= 2): bf16 (loss_spike), held until 15; blocks 1 and 2 went low at 2 (5 - 2 > 2)
#     and stay. A decision of its own: version 3, effective 8.
NORMS = {1: (5, 1, 1, 1, 2), 2: (5, 1, 1, 1, 2), 3: (6.5, 1, 1, 1, .5), 4: (6.5, 1, 1, 1, .5), 5: (6.5, 1, 1, 1, .5)}
FIGURES = {3: {1: (0.25, 0.125), 2: (0.0, 0.5), 3: (0.75, 0.0)}, 4: {1: (0.25, 0.125), 2: (0.25, 0.25), 3: (0.75, 0.0)}}
LOSS = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 3.0}


def report(step):
    blocks = []
    for i, n in enumerate(NORMS[step]):
        b = pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100)
        if i in FIGURES.get(step, {}):
            b.saturated_fraction, b.underflowed_fraction = FIGURES[step][i]
        blocks.append(b)
    return pb.StepReport(step=step, loss=LOSS[step], blocks=blocks)


def block(i, precision, reason, last, candidate, hold, figures, sens, err, rel):
    """The REST block as the comments above work it out."""
    return {"id": i, "name": "layer.%d" % i, "precision": precision, "sensitivity": sens, "grad_score": sens,
            "error_score": err, "relative_magnitude": rel, "last_switch_step": last, "reason": reason,
            "forced": False, "candidate": candidate, "hold_until": hold,
            "saturated_fraction": figures[0] if figures else None,
            "underflowed_fraction": figures[1] if figures else None}


BLOCKS = [
    block(0, "bf16", "none", None, "int8", None, None, 1.0, None, 3.25),
    block(1, "int4", "score", 2, "int4", None, (0.25, 0.125), 0.25, 0.25, 0.5),
    block(2, "fp8_e4m3", "score", 2, "fp8_e4m3", None, (0.125, 0.375), 0.25, 0.25, 0.5),
    block(3, "bf16", "saturation", 4, "int8", None, (0.75, 0.0), 0.25, None, 0.5),
    block(4, "bf16", "loss_spike", 5, "int8", 15, None, 0.125, None, 0.25),
]
BY_PRECISION = {"bf16": 3, "int8": 0, "fp8_e4m3": 1, "fp8_e5m2": 0, "int4": 1}


def drive_job(prismd):
    """Job job-n of one rank through steps 1 to 5 (the comments above): its layout, its calibration
    for int4 and fp8_e4m3, then the steps; returns the rank's Agent once its three updates came
    (the caller closes it). Also tests/browser/numerics_feed.py's job."""
    layout = pb.ModelLayout(model_id="m", blocks=[
        pb.BlockInfo(id=i, name="layer.%d" % i, param_bytes_bf16=2000) for i in range(5)])
    a = g.Agent(prismd)
    a.send(hello=pb.Hello(job_id="job-n", rank=0, world_size=1, node="node-0", layout=layout))
    kind = a.next().WhichOneof("kind")
    if kind != "welcome":
        raise AssertionError("job-n: %s, not a welcome" % kind)
    a.send(calibration=pb.CalibrationReport(format=pb.INT4, samples=4, errors=[
        pb.BlockError(block_id=1, relative_error=0.015625), pb.BlockError(block_id=2, relative_error=0.5)]))
    a.send(calibration=pb.CalibrationReport(format=pb.FP8_E4M3, samples=4, errors=[
        pb.BlockError(block_id=2, relative_error=0.015625)]))
    for step in range(1, 6):
        a.send(step_report=report(step))
    versions = [a.next_update() for _ in range(3)]
    got = [(u.map_version, u.decided_step, u.effective_step) for u in versions]
    if got != [(1, 2, 5), (2, 4, 7), (3, 5, 8)]:
        raise AssertionError("job-n's updates: %s" % got)
    return a


class NumericsSurfacesTest(unittest.TestCase):
    def setUp(self):
        self.prismd = g.Prismd(config_extra=CONFIG)
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def rank(self, job, layout=None):
        a = g.Agent(self.prismd)
        self.agents.append(a)
        a.send(hello=pb.Hello(job_id=job, rank=0, world_size=1, node="node-0", layout=layout))
        self.assertEqual(a.next().WhichOneof("kind"), "welcome")
        return a

    def prismctl(self, *args):
        env = dict(os.environ, PRISM_SERVER="http://" + self.prismd.http_addr)
        env.pop("PRISM_TOKEN", None)
        import subprocess
        p = subprocess.run([os.path.join(g.BUILD, "service", "prismctl"), *args], capture_output=True, text=True,
                           timeout=g.WAIT_S, env=env)
        return p.returncode, p.stdout, p.stderr

    def test_rest_metrics_and_prismctl_show_formats_reasons_holds_and_figures(self):
        self.agents.append(drive_job(self.prismd))
        doc = self.prismd.json_until("/v1/jobs/job-n/blocks", lambda d: d["map_version"] == 3)
        self.assertEqual(doc["blocks"], BLOCKS)
        self.assertEqual((doc["loss_spikes"], doc["loss_spike_decisions"], doc["blocks_rolled_back"]), (1, 1, 1))
        t = doc["telemetry"]
        # The spike's decision: 3 bf16, 2 low (int4 2000 x 75% + fp8 2000 x 50% of 10000 bytes: 25%).
        self.assertEqual((t["step_id"], t["blocks_bf16"], t["blocks_int8"], t["low_precision"], t["loss_spike"],
                          t["estimated_bandwidth_saving_pct"], t["blocks_by_precision"]),
                         (5, 3, 2, "auto", True, 25.0, BY_PRECISION))
        jobs = self.prismd.json_until("/v1/jobs", lambda d: d["jobs"][0]["map_version"] == 3)["jobs"]
        j = jobs[0]
        self.assertEqual((j["loss_spikes"], j["loss_spike_decisions"], j["blocks_rolled_back"]), (1, 1, 1))
        self.assertEqual(j["blocks_by_precision"], BY_PRECISION)
        self.assertEqual(j["precisions"], BY_PRECISION)
        one = self.prismd.json_until("/v1/jobs/job-n/blocks/4", lambda d: True)
        self.assertEqual((one["candidate"], one["hold_until"], one["saturated_fraction"]), ("int8", 15, None))
        self.assertEqual([(h["step"], h["from"], h["to"], h["reason"]) for h in one["history"]],
                         [(5, "int8", "bf16", "loss_spike"), (4, "bf16", "int8", "score")])

        # /metrics: the counters, blocks per precision and the means over the low blocks with
        # figures (blocks 1 and 2): saturated (0.25 + 0.125) / 2, underflowed (0.125 + 0.375) / 2.
        status, text = self.prismd.http("/metrics")
        self.assertEqual(status, 200)
        m = Exposition(text)
        job = (("job", "job-n"),)
        for name, kind in (("prism_loss_spikes_total", "counter"), ("prism_loss_spike_rollbacks_total", "counter"),
                           ("prism_saturated_fraction", "gauge"), ("prism_underflowed_fraction", "gauge"),
                           ("prism_blocks", "gauge")):
            self.assertEqual(m.families[name][0], kind)
        self.assertEqual(m.samples[("prism_loss_spikes_total", job)], 1)
        self.assertEqual(m.samples[("prism_loss_spike_rollbacks_total", job)], 1)
        self.assertEqual(m.samples[("prism_saturated_fraction", job)], 0.1875)
        self.assertEqual(m.samples[("prism_underflowed_fraction", job)], 0.25)
        for p, n in BY_PRECISION.items():
            self.assertEqual(m.samples[("prism_blocks", (("job", "job-n"), ("precision", p)))], n)
        self.assertEqual(m.samples[("prism_precision_switches_total", (("job", "job-n"), ("reason", "saturation")))], 1)
        # Per block: its precision and last reason (a 1 each), and its fractions where it has figures.
        for name in ("prism_block_precision", "prism_block_saturated_fraction", "prism_block_underflowed_fraction"):
            self.assertEqual(m.families[name][0], "gauge")
        self.assertEqual({k[1]: v for k, v in m.samples.items() if k[0] == "prism_block_precision"},
                         {(("block", str(b["id"])), ("job", "job-n"), ("precision", b["precision"]),
                           ("reason", b["reason"])): 1 for b in BLOCKS})
        for name, at in (("prism_block_saturated_fraction", 0), ("prism_block_underflowed_fraction", 1)):
            self.assertEqual({k[1]: v for k, v in m.samples.items() if k[0] == name},
                             {(("block", str(b["id"])), ("job", "job-n")): (b["saturated_fraction"],
                                                                            b["underflowed_fraction"])[at]
                              for b in BLOCKS if b["saturated_fraction"] is not None})

        # prismctl blocks: the reasons (the column widens), SAT and UNDER, blocks per format.
        code, out, err = self.prismctl("blocks", "job-n")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines(), [
            "BLOCK    PRECISION SENSITIVITY       GRAD       ERROR       REL LAST_SWITCH REASON           SAT     UNDER FORCED",
            "0        bf16           1.0000     1.0000           -    3.2500           - none               -         - no",
            "1        int4           0.2500     0.2500      0.2500    0.5000           2 score       25.0000%  12.5000% no",
            "2        fp8_e4m3       0.2500     0.2500      0.2500    0.5000           2 score       12.5000%  37.5000% no",
            "3        bf16           0.2500     0.2500           -    0.5000           4 saturation  75.0000%   0.0000% no",
            "4        bf16           0.1250     0.1250           -    0.2500           5 loss_spike         -         - no",
            "map_version 3, step 5, last decision at step 5: 3 bf16, 1 int4, 1 fp8_e4m3 (auto), saving 25.0%, "
            "1 loss spike (1 block rolled back)"])

    def test_prismctl_shows_sat_and_under_before_any_figures_under_a_scale_mode(self):
        # pow2 scales and no figures yet: REST carries the fractions as null, so prismctl blocks
        # has its SAT and UNDER columns, "-" in each (the dashboard keeps the same rule). Steps 1, 2
        # with norms (3, 1): rel 1.5, 0.5, scores 0.75, 0.25; block 1 goes low at 2 in int8 (no
        # calibration: the last of low_formats). Under current scales (test_grpc) there are no
        # such columns.
        a = self.rank("job-z")
        for step in (1, 2):
            a.send(step_report=pb.StepReport(step=step, loss=1.0, blocks=[
                pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100) for i, n in enumerate((3.0, 1.0))]))
        self.assertEqual(a.next().update.map_version, 1)
        doc = self.prismd.json_until("/v1/jobs/job-z/blocks", lambda d: d["map_version"] == 1)
        self.assertEqual([(x["saturated_fraction"], x["underflowed_fraction"]) for x in doc["blocks"]],
                         [(None, None), (None, None)])
        code, out, err = self.prismctl("blocks", "job-z")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines()[:3], [
            "BLOCK    PRECISION SENSITIVITY       GRAD       ERROR       REL LAST_SWITCH REASON          SAT     UNDER FORCED",
            "0        bf16           0.7500     0.7500           -    1.5000           - none              -         - no",
            "1        int8           0.2500     0.2500           -    0.5000           2 score             -         - no"])

    def test_a_spike_after_a_restart_rolls_back_with_w_from_the_store(self):
        a = self.rank("job-r")
        # Steps 1, 2 (loss 1): the first decision at 2 puts block 1 in int8 (its score 0.25; no
        # calibration: the last of low_formats) and W = [1, 1], saved with the decision.
        for step in (1, 2):
            a.send(step_report=pb.StepReport(step=step, loss=1.0, blocks=[
                pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100) for i, n in enumerate((3.0, 1.0))]))
        u = a.next().update
        self.assertEqual((u.map_version, u.decided_step), (1, 2))
        self.assertEqual(g.precisions(u.blocks), [(0, pb.BF16), (1, pb.INT8)])
        a.close()
        self.agents.remove(a)
        self.prismd.kill()
        self.prismd = g.Prismd(reuse=self.prismd)
        # Step 3 (loss 5 > 2 x median(1, 1)): a spike only with W from the store (a fresh W would not
        # be full). Block 1 went low by score at 2 (3 - 2 <= 2): bf16, a decision of its own.
        b = self.rank("job-r")
        b.send(step_report=pb.StepReport(step=3, loss=5.0, blocks=[
            pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100) for i, n in enumerate((3.0, 1.0))]))
        u = b.next().update
        self.assertEqual((u.map_version, u.decided_step, u.effective_step), (2, 3, 6))
        self.assertEqual(g.precisions(u.blocks), [(0, pb.BF16), (1, pb.BF16)])
        self.assertEqual(u.blocks[1].reason, pb.REASON_LOSS_SPIKE)
        b.close()
        self.agents.remove(b)
        # Once more across a restart: the counters and the hold came back with the job.
        self.prismd.kill()
        self.prismd = g.Prismd(reuse=self.prismd)
        doc = self.prismd.json_until("/v1/jobs/job-r/blocks", lambda d: d["map_version"] == 2)
        self.assertEqual((doc["loss_spikes"], doc["loss_spike_decisions"], doc["blocks_rolled_back"]), (1, 1, 1))
        self.assertEqual([(x["precision"], x["reason"], x["hold_until"], x["candidate"]) for x in doc["blocks"]],
                         [("bf16", "none", None, "int8"), ("bf16", "loss_spike", 13, "int8")])
        self.assertTrue(doc["telemetry"]["loss_spike"])
        self.assertEqual(doc["telemetry"]["blocks_by_precision"]["bf16"], 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
