#!/usr/bin/python3
"""prismd's wiring of the numerics rules (issue 17, DESIGN 4.7): the real prismd on loopback ports,
two grpcio ranks (test_grpc.py's Prismd and Agent helpers). A NaN or infinite loss is accepted and
left out of the step's loss; a loss spike right after a switch rolls the block back at a decision
of its own that every rank gets with the same effective step; the saturation figures of the
reports reach the policy (the telemetry's block details) and a report with one figure of the two
is refused naming the block. Every wait is bounded; nothing waits on a clock."""

import math
import unittest

import grpc
import test_grpc as g

pb = g.pb
# test_grpc's CONFIG (warmup 2, interval 2, history 2, lag 3, no cooldown) with the spike rule on.
SPIKE = {"loss_spike_factor": 2, "loss_spike_window": 2, "loss_spike_hold_steps": 10}


def report(step, loss, sat=None):
    """Both ranks' norms are 3 and 1: merged rel 1.5 / 0.5, grad scores 0.75 / 0.25 (block 1 low at
    the first decision). sat: (saturated, underflowed) of block 0."""
    blocks = [pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100) for i, n in enumerate((3.0, 1.0))]
    if sat:
        blocks[0].saturated_fraction, blocks[0].underflowed_fraction = sat
    r = pb.StepReport(step=step, blocks=blocks)
    if loss is not None:
        r.loss = loss
    return r


class NumericsPrismdTest(unittest.TestCase):
    def setUp(self):
        self.prismd = g.Prismd(config_extra=SPIKE)
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def ranks(self, job, n):
        out = []
        for rank in range(n):
            a = g.Agent(self.prismd)
            self.agents.append(a)
            a.hello(job, rank, n)
            self.assertEqual(a.next().WhichOneof("kind"), "welcome")
            out.append(a)
        return out

    def test_a_spike_after_a_switch_rolls_back_on_every_rank_at_the_same_effective_step(self):
        r0, r1 = self.ranks("job-s", 2)
        # Steps 1, 2: losses 1 (rank 0) and NaN / +Inf (rank 1): the step's loss is 1, W = [1, 1].
        for step, bad in ((1, math.nan), (2, math.inf)):
            r0.send(step_report=report(step, 1.0))
            r1.send(step_report=report(step, bad))
        for a in (r0, r1):
            u = a.next().update
            self.assertEqual((u.map_version, u.decided_step, u.effective_step), (1, 2, 5))
            self.assertEqual(g.precisions(u.blocks), [(0, pb.BF16), (1, pb.INT8)])
        # Step 3 (not a scheduled decision: n = 3): loss 5 > 2 * median 1, a spike; block 1 went
        # low by score at 2 (3 - 2 <= 2): back to bf16 at a decision of its own, version 2,
        # effective 3 + 3 = 6 on every rank. Block 0 carries saturation figures from both ranks.
        r0.send(step_report=report(3, 5.0, (0.25, 0.5)))
        r1.send(step_report=report(3, 5.0, (0.75, 0.0)))
        updates = [a.next().update for a in (r0, r1)]
        for u in updates:
            self.assertEqual((u.map_version, u.decided_step, u.effective_step), (2, 3, 6))
            self.assertEqual(g.precisions(u.blocks), [(0, pb.BF16), (1, pb.BF16)])
            self.assertEqual(u.blocks[1].reason, pb.REASON_LOSS_SPIKE)
        self.assertEqual(updates[0], updates[1])
        # Step 4, a scheduled decision: block 1 is held (4 < 3 + 10): no change, no update. Block 0's
        # window (steps 3, 4) has one entry with figures: the means over ranks 0.5 and 0.25.
        for a in (r0, r1):
            a.send(step_report=report(4, 1.0))
        doc = self.prismd.json_until("/v1/jobs/job-s/telemetry", lambda d: len(d["records"]) == 3)
        first, spike, fourth = doc["records"]
        self.assertEqual((first["step_id"], first["loss"], first["loss_spike"], first["blocks_int8"]), (2, 1.0, False, 1))
        self.assertEqual((spike["step_id"], spike["loss"], spike["loss_spike"], spike["precision_changes"],
                          spike["map_version"], spike["blocks_by_precision"]["bf16"]), (3, 5.0, True, 1, 2, 2))
        self.assertEqual((fourth["step_id"], fourth["loss_spike"], fourth["precision_changes"], fourth["map_version"]),
                         (4, False, 0, 2))
        self.assertEqual((fourth["block_details"]["0"]["saturated_fraction"],
                          fourth["block_details"]["0"]["underflowed_fraction"]), (0.5, 0.25))
        self.assertNotIn("saturated_fraction", fourth["block_details"]["1"])

    def test_a_report_with_one_saturation_figure_is_refused_naming_the_block(self):
        (a,) = self.ranks("job-h", 1)
        r = report(1, 1.0)
        r.blocks[1].saturated_fraction = 0.5
        a.send(step_report=r)
        e = a.next()
        self.assertEqual(e.WhichOneof("kind"), "error")
        self.assertEqual(e.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("block 1: saturated_fraction and underflowed_fraction come together", e.error.message)
        r.blocks[1].underflowed_fraction = 1.5
        a.send(step_report=r)
        self.assertIn("block 1: underflowed_fraction 1.5 is not in [0, 1]", a.next().error.message)
        # The stream goes on.
        a.send(step_report=report(1, 1.0))
        a.send(step_report=report(2, 1.0))
        self.assertEqual(a.next().update.map_version, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
