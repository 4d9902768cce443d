#!/usr/bin/python3
"""prism.torch for hybrid devices (issue 15 item 4; python/prism/torch.py, python/prism/client.py).

Without an agent (a recording stand-in for prism.Client where the plan must be scripted):
  - the cost figures of a known model, worked out by hand: forward FLOPs (2 * in * out per row of
    every nn.Linear call), activation bytes (2 * numel of every Linear input), the default
    state_bytes, block_costs overriding them, all in the layout that register gets (a Linear
    called with the keyword input too);
  - a low Linear's forward equals F.linear on the values kernels.quantize/dequantize give (weight
    per row, input per tensor) bit for bit, and its gradients equal the backward's formulas
    written out (grad_x = g W, grad_W = g^T dequant(Qx), grad_b = sum g) bit for bit, also under
    CPU bf16 autocast (the forward's autocast state is the backward's); its autograd graph saves
    the input's codes and scale, not a float copy of the input;
  - the tensor statistics staged on sampled steps equal torch-computed norms (float64) to the
    statistics kernels' reference tolerance, nothing staged on the other steps;
  - a compute plan switches the Linears of the planned blocks at the step the map is in use, and
    back, with the counters saying which blocks ran low; a plan read again for the same map is
    applied.
With libprism's plan calls (prism_client_get_plan ...; the class skips without them):
  - the client's Hello carries the cost fields and its report the staged statistics (a test that
    plays the agent on the Unix socket), bad entries refused naming the entry;
  - a real prism-agent under a Python grpcio stand-in for prismd: the plans that come with map
    versions reach prism.torch at their effective steps, and the statistics reach "prismd"
    unchanged.
Every wait is bounded."""

import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(BUILD, "python-gen"))
sys.path.insert(0, os.path.join(SOURCE, "python"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "integration"))

import prism  # noqa: E402
import prism.client  # noqa: E402
import prism.torch as pt  # noqa: E402

HAS_PLANS = prism.client.has_plans()
needs_plans = unittest.skipUnless(HAS_PLANS, f"{prism.library_path()} lacks prism_client_get_plan (the compute "
                                  "plans of issue 15 are not in this libprism yet)")


class Twice(torch.nn.Module):
    """One Linear called twice."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


class ByKeyword(torch.nn.Module):
    """A Linear called with nn.Linear's keyword input (lin(input=x))."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(input=x)


def make_blocks(dtype=torch.float32):
    torch.manual_seed(3)
    blocks = torch.nn.ModuleList([
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)),
        Twice(),
        torch.nn.LayerNorm(8),
    ])
    return blocks.to(dtype)


def run(blocks, x):
    for b in blocks:
        x = b(x)
    return x


class RecordingClient:
    """What Attachment needs of prism.Client, recording what it is given; the map and the compute
    plan in use at each step come from `plans`: [(effective_step, map_version, {block: format},
    plan dict or None)], the last one whose effective step has come is in use."""

    def __init__(self, plans=(), has_plans=True):
        self.plans = list(plans)
        self._has_plans = has_plans
        self.layout = None
        self.staged = []  # (step of the next report, entries)
        self.reports = []
        self.step = None
        self.current = (0, 0, {}, None)
        self.n = 0

    def register(self, model_id, layout, low_precision, granularity, block_size):
        self.layout = layout
        self.n = len(layout)
        return b"\0" * 32

    def has_plans(self):
        return self._has_plans

    def begin_step(self, step):
        self.step = step
        for p in self.plans:
            if p[0] <= step:
                self.current = p
        return self.current[1]

    def precisions(self):
        return ["bf16"] * self.n

    def compute_precisions(self):
        return [self.current[2].get(b, "bf16") for b in range(self.n)]

    def plan(self):
        return self.current[3]

    def state(self):
        return {"effective_step": self.current[0], "calibration_needed": False, "run_calibration": False,
                "calibration_samples": 1, "low_precision": "int8", "connected": False}

    def stage_tensor_stats(self, entries):
        self.staged.append((self.step, [dict(e) for e in entries]))

    def report_step(self, step, blocks, loss=None, fractions=None):
        self.reports.append(step)
        return True

    def report_calibration(self, fmt, samples, errors):
        return True

    def counters(self):
        return {"reports_sent": len(self.reports)}

    def close(self):
        pass


def attach(blocks, client, **kw):
    return pt.attach(blocks, client=client, model_id="hybrid-test", **kw)


class Costs(unittest.TestCase):
    def test_flops_activation_and_state_bytes_of_a_known_model(self):
        blocks = make_blocks()
        x = torch.randn(2, 3, 8)  # 6 rows of 8
        c = RecordingClient()
        a = attach(blocks, c, profile_forward=lambda: run(blocks, x))
        # block 0: Linear(8, 16) and Linear(16, 8) on 6 rows: 2*8*16*6 + 2*16*8*6 FLOPs; inputs of
        # 48 and 96 elements. Parameters 8*16 + 16 + 16*8 + 8 = 280 FP32: 280 * (2*4 + 8) bytes.
        # block 1: Linear(8, 8) called twice: 2 * 2*8*8*6; inputs 48 + 48; 72 parameters.
        # block 2: LayerNorm, no Linear: 0 and 0; 16 parameters.
        want = [{"flops": 3072, "activation_bytes_bf16": 288, "state_bytes": 4480},
                {"flops": 1536, "activation_bytes_bf16": 192, "state_bytes": 1152},
                {"flops": 0, "activation_bytes_bf16": 0, "state_bytes": 256}]
        self.assertEqual(a.costs, want)
        self.assertEqual([{k: e[k] for k in want[0]} for e in c.layout], want)
        self.assertEqual([e["name"] for e in c.layout], ["blocks.0", "blocks.1", "blocks.2"])
        self.assertEqual([e["param_bytes_bf16"] for e in c.layout], [560, 144, 32])
        self.assertEqual(c.layout[0]["shapes"], [(16, 8), (16,), (8, 16), (8,)])
        # the hooks are gone, and profiling trained nothing
        self.assertTrue(all(not m._forward_hooks for m in blocks.modules()))
        self.assertTrue(all(p.grad is None for p in blocks.parameters()))
        a.close()

    def test_a_linear_called_with_a_keyword_input_counts(self):
        torch.manual_seed(3)
        blocks = torch.nn.ModuleList([ByKeyword(), torch.nn.Linear(4, 2)])
        x = torch.randn(2, 3, 8)  # 6 rows of 8
        costs = pt.measure_costs(blocks, lambda: blocks[1](input=blocks[0](x)))
        # 2*8*4*6 FLOPs and 48 inputs; 2*4*2*6 and 24
        self.assertEqual(costs, [{"flops": 384, "activation_bytes_bf16": 96},
                                 {"flops": 96, "activation_bytes_bf16": 48}])
        self.assertTrue(all("forward" not in m.__dict__ for m in blocks.modules()))  # put back
        self.assertTrue(all(p.grad is None for p in blocks.parameters()))

    def test_bf16_model_optimizer_bytes_and_given_costs(self):
        blocks = make_blocks(torch.bfloat16)
        c = RecordingClient()
        a = attach(blocks, c, optimizer_state_bytes_per_param=4,
                   block_costs=[{"flops": 7}, {}, {"activation_bytes_bf16": 5, "state_bytes": 9}])
        # no profile_forward: flops and activations 0 unless given; state 280 * (2*2 + 4)
        self.assertEqual(a.costs, [{"flops": 7, "activation_bytes_bf16": 0, "state_bytes": 2240},
                                   {"flops": 0, "activation_bytes_bf16": 0, "state_bytes": 576},
                                   {"flops": 0, "activation_bytes_bf16": 5, "state_bytes": 9}])
        a.close()
        with self.assertRaisesRegex(ValueError, r"block_costs\[1\]: unknown key 'flop'"):
            attach(blocks, RecordingClient(), block_costs=[{}, {"flop": 1}, {}])
        with self.assertRaisesRegex(ValueError, "2 block_costs for 3 blocks"):
            attach(blocks, RecordingClient(), block_costs=[{}, {}])
        with self.assertRaisesRegex(ValueError, "tensor_stats_every"):
            attach(blocks, RecordingClient(), tensor_stats_every=-1)

    def test_layout_dicts_reach_the_c_layout(self):
        blocks = [{"name": "a", "shapes": [(4, 4)], "flops": 2 ** 63, "activation_bytes_bf16": 3, "state_bytes": 5},
                  ("b", [(2,)])]
        lay = prism.client._Layout("m", blocks, "int8", "block", 128)
        got = [(e.name, e.param_bytes_bf16, e.shape_len, e.flops, e.activation_bytes_bf16, e.state_bytes)
               for e in lay.array[:2]]
        self.assertEqual(got, [(b"a", 32, 3, 2 ** 63, 3, 5), (b"b", 4, 2, 0, 0, 0)])
        # the cost figures are not part of the fingerprint
        self.assertEqual(prism.fingerprint("m", blocks), prism.fingerprint("m", [("a", [(4, 4)]), ("b", [(2,)])]))
        for bad, msg in (({"name": "a", "shapes": [], "flops": -1}, r"blocks\[0\]\.flops: -1 is not an integer"),
                         ({"name": "a", "shapes": [], "flops": 1.5}, r"blocks\[0\]\.flops: 1\.5"),
                         ({"name": "a", "shapes": [], "state_bytes": 2 ** 64}, r"blocks\[0\]\.state_bytes"),
                         ({"name": "a"}, r"blocks\[0\]: 'shapes' is missing"),
                         ({"name": "a", "shapes": [], "flopz": 1}, r"blocks\[0\]: unknown key 'flopz'")):
            with self.assertRaisesRegex(prism.PrismInvalidError, msg):
                prism.fingerprint("m", [bad])


class ClientWithoutAgent(unittest.TestCase):
    def test_stage_tensor_stats_checks_entries_and_the_getters_answer_without_a_plan(self):
        d = tempfile.mkdtemp(prefix="prism-torch-hybrid-client-")
        try:
            c = prism.Client(job_id="j", dir=d, reconnect_interval_ms=60000)
            c.register("m", [("a", [(2,)]), ("b", [(2,)])])
            for bad, msg in (([{"x_l2": 1.0}], r"stats\[0\]: 'block_id' is missing"),
                             ([{"block_id": 0}, {"block_id": -1}], r"stats\[1\]\.block_id: -1 is not a block id"),
                             ([{"block_id": 0, "y_numel": 2 ** 64}], r"stats\[0\]\.y_numel"),
                             ([{"block_id": 0, "w_numel": 1.0}], r"stats\[0\]\.w_numel: 1\.0"),
                             ([{"block_id": 1, "x_l3": 1}], r"stats\[0\]: unknown key 'x_l3'")):
                with self.assertRaisesRegex(prism.PrismInvalidError, msg):
                    c.stage_tensor_stats(bad)
            c.begin_step(0)
            self.assertIsNone(c.plan())  # no map, no plan
            self.assertEqual(c.compute_precisions(), ["bf16", "bf16"])
            self.assertEqual(c.compute_precision(7), "bf16")
            if not HAS_PLANS:
                with self.assertRaisesRegex(prism.PrismError, "lacks|has no prism_client_stage_tensor_stats"):
                    c.stage_tensor_stats([{"block_id": 0}])
            else:
                c.stage_tensor_stats([{"block_id": 0, "x_l2": 1.0, "x_max_abs": 1.0, "x_numel": 2}])
                c.stage_tensor_stats([])
            n = c.counters()
            self.assertEqual((n["tensor_stats_sent"], n["plans_applied"]), (0, 0))
            c.close()
        finally:
            shutil.rmtree(d, ignore_errors=True)


class LowLinear(unittest.TestCase):
    @staticmethod
    def by_kernels(t, fmt, granularity):
        """t quantized and dequantized by the kernels, written out here."""
        codes, scales = prism.quantize(t.detach().contiguous(), fmt, granularity)
        return prism.dequantize(codes, scales, fmt, numel=tuple(t.shape), granularity=granularity, dtype=t.dtype)

    @staticmethod
    def inputs(fmt, dtype, bias=True):
        torch.manual_seed(11)
        lin = torch.nn.Linear(24, 10, bias=bias).to(dtype)
        x = (torch.randn(3, 5, 24) * 3).to(dtype)
        x[0, 0, 0] = 40  # one large input: the per-tensor scale is its
        with torch.no_grad():
            lin.weight[2] *= 100  # one row of large weights: per row, the other rows keep theirs
        return lin, x

    @staticmethod
    def grads(x, lin):
        return [x.grad] + [None if p.grad is None else p.grad.clone() for p in (lin.weight, lin.bias)
                           if p is not None] + ([None] if lin.bias is None else [])

    def case(self, fmt, dtype, bias=True, x_grad=True, w_grad=True):
        lin, x = self.inputs(fmt, dtype, bias)
        lin.weight.requires_grad_(w_grad)
        xl = x.clone().requires_grad_(x_grad)
        y = pt.low_linear(xl, lin.weight, lin.bias, fmt)
        xq = self.by_kernels(x, fmt, "tensor")
        want = F.linear(xq, self.by_kernels(lin.weight, fmt, "row"), lin.bias)
        self.assertEqual(y.dtype, dtype)
        self.assertTrue(torch.equal(y, want), (fmt, dtype))
        self.assertFalse(torch.equal(y, F.linear(x, lin.weight, lin.bias)), "nothing was quantized")
        g = torch.randn(y.shape).to(dtype)
        y.backward(g)
        got = self.grads(xl, lin)
        # the backward's formulas, written out: g as rows [15, 10]; grad_x = g W with the
        # full-precision W, grad_W = g^T dequant(Qx) (the input values the forward used),
        # grad_b = the rows' sum, all in the model's dtype
        g2 = g.reshape(-1, 10)
        want = [torch.mm(g2, lin.weight.detach()).reshape(x.shape) if x_grad else None,
                torch.mm(g2.t(), xq.reshape(-1, 24)) if w_grad else None,
                g2.sum(0) if bias else None]
        for name, a, b in zip(("x", "w", "b"), got, want):
            if b is None:
                self.assertIsNone(a, name)
            else:
                self.assertEqual(a.dtype, dtype)
                self.assertTrue(torch.equal(a, b), (name, fmt, dtype, bias, x_grad, w_grad))
        if w_grad:  # not the high op's weight gradient: that one has the unquantized input
            self.assertFalse(torch.equal(got[1], torch.mm(g2.t(), x.reshape(-1, 24))))

    def test_forward_is_f_linear_on_the_kernels_values_and_backward_the_stated_formulas(self):
        for fmt in ("int8", "fp8_e4m3"):
            for dtype in (torch.float32, torch.bfloat16):
                self.case(fmt, dtype)
        self.case("int8", torch.float32, bias=False)
        self.case("fp8_e4m3", torch.float32, x_grad=False)
        self.case("int8", torch.bfloat16, w_grad=False)

    def test_autocast_state_of_the_forward_is_the_backwards(self):
        lin, x = self.inputs("int8", torch.float32)
        xq = self.by_kernels(x, "int8", "tensor")
        wq = self.by_kernels(lin.weight, "int8", "row")
        g = torch.randn(3, 5, 10)
        g2 = g.reshape(-1, 10)
        bf = torch.bfloat16
        # forward under CPU bf16 autocast, backward called outside it: the backward runs in bf16
        xl = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=bf):
            y = pt.low_linear(xl, lin.weight, lin.bias, "int8")
        self.assertEqual(y.dtype, bf)
        self.assertTrue(torch.equal(y, F.linear(xq.to(bf), wq.to(bf), lin.bias.to(bf))))
        y.backward(g.to(bf))
        got = self.grads(xl, lin)
        gb = g2.to(bf)
        want = [torch.mm(gb, lin.weight.detach().to(bf)).float().reshape(x.shape),
                torch.mm(gb.t(), xq.reshape(-1, 24).to(bf)).float(), gb.sum(0).float()]
        for name, a, b in zip(("x", "w", "b"), got, want):
            self.assertEqual(a.dtype, torch.float32)
            self.assertTrue(torch.equal(a, b), name)
        # (autocast off in backward, the old fault, gives other values)
        self.assertFalse(torch.equal(got[0], torch.mm(gb.float(), lin.weight.detach()).reshape(x.shape)))
        self.assertFalse(torch.equal(got[1], torch.mm(gb.float().t(), xq.reshape(-1, 24))))
        # forward without autocast, backward called inside it: the backward stays in float32
        lin.zero_grad()
        xl = x.clone().requires_grad_(True)
        y = pt.low_linear(xl, lin.weight, lin.bias, "int8")
        with torch.autocast("cpu", dtype=bf):
            y.backward(g)
        got = self.grads(xl, lin)
        want = [torch.mm(g2, lin.weight.detach()).reshape(x.shape), torch.mm(g2.t(), xq.reshape(-1, 24)), g2.sum(0)]
        for name, a, b in zip(("x", "w", "b"), got, want):
            self.assertTrue(torch.equal(a, b), name)

    @staticmethod
    def saved(fn, exclude):
        """(dtype, numel) of every tensor the autograd graph of fn() saves, but views of `exclude`
        (the weight, which the model keeps anyway)."""
        out = []

        def pack(t):
            if t.data_ptr() != exclude.data_ptr():
                out.append((t.dtype, t.numel(), t.numel() * t.element_size()))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = fn()
        return y, out

    def test_the_graph_saves_the_inputs_codes_and_scale_not_a_float_copy(self):
        for fmt in ("int8", "fp8_e4m3"):
            for dtype in (torch.float32, torch.bfloat16):
                lin, x = self.inputs(fmt, dtype)
                xl = x.clone().requires_grad_(True)
                n = x.numel()  # 360
                y, low = self.saved(lambda: pt.low_linear(xl, lin.weight, lin.bias, fmt), lin.weight)
                self.assertEqual(sorted(low, key=str), sorted([(torch.uint8, n, n), (torch.float32, 1, 4)], key=str),
                                 (fmt, dtype))
                _, high = self.saved(lambda: F.linear(xl, lin.weight, lin.bias), lin.weight)
                high_bytes = sum(b for _, _, b in high)
                self.assertEqual(high_bytes, n * x.element_size(), (fmt, dtype, high))
                # codes: a quarter of a float32 input's bytes, half of a bfloat16 one's (+ one scale)
                self.assertEqual(sum(b for _, _, b in low), high_bytes // (x.element_size()) + 4)
                y.sum().backward()  # what was saved is enough
                self.assertIsNotNone(xl.grad)
        # no weight gradient wanted: the codes are not kept at all
        lin, x = self.inputs("int8", torch.float32)
        lin.weight.requires_grad_(False)
        _, low = self.saved(lambda: pt.low_linear(x.clone().requires_grad_(True), lin.weight, lin.bias, "int8"),
                            lin.weight)
        self.assertEqual(low, [])

    def test_weight_per_row_and_input_per_tensor(self):
        w = torch.tensor([[1.0, -2.0, 0.3], [100.0, 50.0, 7.0]])
        got = pt.low_weight(w, "int8")
        self.assertTrue(torch.equal(got, self.by_kernels(w, "int8", "row")))
        # per row: row 0 has its own scale, as if it were alone; per tensor it has row 1's
        self.assertTrue(torch.equal(got[0], pt.low_weight(w[:1], "int8")[0]))
        self.assertTrue(torch.equal(pt.low_input(w, "int8"), self.by_kernels(w, "int8", "tensor")))
        self.assertFalse(torch.equal(pt.low_input(w, "int8")[0], got[0]))


class TensorStats(unittest.TestCase):
    def test_sampled_steps_stage_the_figures_of_inputs_outputs_and_weights(self):
        blocks = make_blocks()
        c = RecordingClient()
        a = attach(blocks, c, tensor_stats_every=3)
        torch.manual_seed(5)
        inputs = {}
        for step in range(7):
            x = torch.randn(2, 3, 8)
            if step == 3:
                x[1, 1, 1] = float("nan")  # left out of the figures, counted in numel
            a.begin_step(step)
            seen = []
            hooks = [b.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0].detach().clone()))
                     for b in blocks]
            run(blocks, x).sum().backward()
            for h in hooks:
                h.remove()
            inputs[step] = seen
            a.end_step(step)
        self.assertEqual([s for s, _ in c.staged], [0, 3, 6])
        self.assertEqual(c.reports, list(range(7)))
        for step, entries in c.staged:
            self.assertEqual([e["block_id"] for e in entries], [0, 1, 2])
            for b, e in enumerate(entries):
                x = inputs[step][b].double().reshape(-1)
                fin = x[torch.isfinite(x)]
                w = torch.cat([p.detach().double().reshape(-1) for p in blocks[b].parameters()])
                self.assertEqual((e["x_numel"], e["y_numel"], e["w_numel"]), (48, 48, w.numel()))
                self.assertEqual(e["x_max_abs"], fin.abs().max().item())
                self.assertEqual(e["w_max_abs"], w.abs().max().item())
                self.assertLessEqual(abs(e["x_l2"] - fin.norm().item()), 1e-12 * fin.norm().item())
                self.assertLessEqual(abs(e["w_l2"] - w.norm().item()), 1e-12 * w.norm().item())
        self.assertTrue(all(math.isfinite(e["x_l2"]) for e in c.staged[1][1]))  # step 3's NaNs left out
        a.close()

    def test_off_by_default_and_without_the_plan_calls(self):
        blocks = make_blocks()
        for kw, has in (({}, True), ({"tensor_stats_every": 1}, False)):
            c = RecordingClient(has_plans=has)
            a = attach(blocks, c, **kw)
            a.begin_step(0)
            run(blocks, torch.randn(2, 8)).sum().backward()
            a.end_step(0)
            self.assertEqual(c.staged, [])
            a.close()


class ComputePlans(unittest.TestCase):
    PLAN = {"map_version": 2, "device_class": "slow", "high_format": "bf16", "low_format": "int8",
            "low_blocks": 1, "predicted_iteration_seconds": 0.5, "compute_seconds": 0.25}

    def test_planned_blocks_run_low_from_the_effective_step_and_switch_back(self):
        blocks = make_blocks()
        plan3 = dict(self.PLAN, map_version=3, low_format="fp8_e4m3")
        c = RecordingClient([(0, 1, {}, None), (4, 2, {1: "int8"}, self.PLAN),
                             (6, 3, {0: "fp8_e4m3", 1: "fp8_e4m3"}, plan3), (8, 4, {}, None)])
        a = attach(blocks, c)
        x = torch.randn(4, 8)
        seen = []
        for step in range(10):
            a.begin_step(step)
            y = run(blocks, x)
            with torch.no_grad():
                fmt = c.compute_precisions()
                want = x
                for b, blk in enumerate(blocks):
                    want = self.block_output(b, blk, want, fmt[b])
            self.assertTrue(torch.equal(y, want), step)
            y.sum().backward()
            a.end_step(step)
            n = a.counters()
            seen.append((step, n["compute_low_blocks"], n["plan_map_version"]))
        self.assertEqual(seen, [(0, [], 0), (1, [], 0), (2, [], 0), (3, [], 0), (4, [1], 2), (5, [1], 2),
                                (6, [0, 1], 3), (7, [0, 1], 3), (8, [], 0), (9, [], 0)])
        self.assertEqual(a.counters()["compute_low_block_steps"], 2 + 4)
        # unpatched: every Linear runs its class's forward again
        self.assertTrue(all("forward" not in m.__dict__ for m in blocks.modules()))
        a.close()

    def test_a_plan_read_again_for_the_same_map_is_applied(self):
        # The client may read the plan of the map in use again (its file mapped late, the layout
        # registered after a begin_step): the Linears follow the plan's content, not its version.
        blocks = make_blocks()
        c = RecordingClient([(0, 1, {}, None)])
        a = attach(blocks, c)
        x = torch.randn(4, 8)
        seen = []
        for step in range(7):
            if step == 2:
                c.plans = [(0, 1, {1: "int8"}, dict(self.PLAN, map_version=1))]
            if step == 4:
                c.plans = [(0, 1, {0: "fp8_e4m3", 1: "fp8_e4m3"}, dict(self.PLAN, map_version=1))]
            if step == 6:
                c.plans = [(0, 1, {}, None)]
            self.assertEqual(a.begin_step(step), 1)
            y = run(blocks, x)
            with torch.no_grad():
                fmt = c.compute_precisions()
                want = x
                for b, blk in enumerate(blocks):
                    want = self.block_output(b, blk, want, fmt[b])
            self.assertTrue(torch.equal(y, want), step)
            a.end_step(step)
            n = a.counters()
            seen.append((step, n["compute_low_blocks"], n["plan_map_version"]))
        self.assertEqual(seen, [(0, [], 0), (1, [], 0), (2, [1], 1), (3, [1], 1), (4, [0, 1], 1), (5, [0, 1], 1),
                                (6, [], 0)])
        self.assertEqual(a.counters()["compute_low_block_steps"], 2 * 1 + 2 * 2)
        a.close()

    def test_a_linear_called_with_a_keyword_input_runs_low(self):
        torch.manual_seed(3)
        blocks = torch.nn.ModuleList([ByKeyword()])
        a = attach(blocks, RecordingClient([(0, 1, {0: "int8"}, self.PLAN)]))
        a.begin_step(0)
        x = torch.randn(5, 8)
        fc = blocks[0].fc
        self.assertTrue(torch.equal(blocks[0](x), pt.low_linear(x, fc.weight, fc.bias, "int8")))
        self.assertFalse(torch.equal(blocks[0](x), F.linear(x, fc.weight, fc.bias)))
        a.close()

    @staticmethod
    def block_output(b, blk, x, fmt):
        if fmt == "bf16":
            return blk(x)
        if b == 0:
            lin0, lin1 = blk[0], blk[2]
            h = torch.tanh(pt.low_linear(x, lin0.weight, lin0.bias, fmt))
            return pt.low_linear(h, lin1.weight, lin1.bias, fmt)
        fc = blk.fc
        return pt.low_linear(torch.relu(pt.low_linear(x, fc.weight, fc.bias, fmt)), fc.weight, fc.bias, fmt)

    def test_calibration_measures_the_weights_alone_and_keeps_the_plan(self):
        blocks = make_blocks()
        x = torch.randn(4, 8)
        plain = attach(blocks, RecordingClient())
        want = plain.calibrate(lambda: run(blocks, x), samples=1, fmt="int8")
        plain.close()
        a = attach(blocks, RecordingClient([(0, 1, {0: "int8"}, self.PLAN)]))
        a.begin_step(0)
        self.assertEqual(a.calibrate(lambda: run(blocks, x), samples=1, fmt="int8"), want)
        self.assertEqual(a.compute_low_blocks(), [0])
        self.assertIn("forward", blocks[0][0].__dict__)
        a.close()
        self.assertNotIn("forward", blocks[0][0].__dict__)


class FakeAgentSocket:
    """Plays the agent on the client's Unix socket: frames of a 4-byte length and an AgentMessage."""

    def __init__(self, directory):
        from prism.v1 import prism_pb2 as pb
        self.pb = pb
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(os.path.join(directory, "prism-agent.sock"))
        self.sock.listen(1)
        self.sock.settimeout(5)
        self.conn = None

    def read(self):
        if self.conn is None:
            self.conn, _ = self.sock.accept()
            self.conn.settimeout(5)

        def exact(n):
            data = b""
            while len(data) < n:
                chunk = self.conn.recv(n - len(data))
                if not chunk:
                    raise AssertionError("the client closed the connection")
                data += chunk
            return data
        (length,) = struct.unpack("<I", exact(4))
        msg = self.pb.AgentMessage()
        msg.ParseFromString(exact(length))
        return msg

    def close(self):
        if self.conn:
            self.conn.close()
        self.sock.close()


@needs_plans
class WithTheClient(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-torch-hybrid-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_hello_carries_the_costs_and_the_report_the_staged_statistics(self):
        agent = FakeAgentSocket(self.dir)
        try:
            blocks = make_blocks()
            x = torch.randn(2, 3, 8)
            a = pt.attach(blocks, job_id="j", dir=self.dir, model_id="m", profile_forward=lambda: run(blocks, x),
                          tensor_stats_every=2)
            hello = agent.read().hello
            self.assertEqual([(b.flops, b.activation_bytes_bf16, b.state_bytes) for b in hello.layout.blocks],
                             [(3072, 288, 4480), (1536, 192, 1152), (0, 0, 256)])
            for step in range(3):
                a.begin_step(step)
                run(blocks, x).sum().backward()
                self.assertTrue(a.end_step(step))
                r = agent.read().step_report
                self.assertEqual(r.step, step)
                if step % 2:
                    self.assertEqual(len(r.tensor_stats), 0)
                    continue
                got = [{f: getattr(t, f) for f in ("block_id", "x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs",
                                                    "w_numel", "y_numel")} for t in r.tensor_stats]
                self.assertEqual(got, a.staged_tensor_stats)
            self.assertEqual(a.counters()["tensor_stats_sent"], 6)
            c = a.client
            for bad in ({"block_id": 9}, {"block_id": 0, "x_l2": -1.0, "x_numel": 1},
                        {"block_id": 0, "w_max_abs": float("inf"), "w_numel": 1}):
                with self.assertRaisesRegex(prism.PrismInvalidError, r"\[1\]"):
                    c.stage_tensor_stats([{"block_id": 1}, bad])
            with self.assertRaisesRegex(prism.PrismInvalidError, r"stats\[0\]: unknown key 'x_l3'"):
                c.stage_tensor_stats([{"block_id": 1, "x_l3": 1}])
            with self.assertRaisesRegex(prism.PrismInvalidError, r"stats\[0\]\.x_numel"):
                c.stage_tensor_stats([{"block_id": 1, "x_numel": -2}])
            self.assertIsNone(c.plan())
            self.assertEqual(c.compute_precisions(), ["bf16"] * 3)
            a.close()
        finally:
            agent.close()


class FakePrismd:
    """A Python grpcio stand-in for prismd's PolicyService.Connect: Welcome with map version 1,
    then the scripted updates, each sent once the agent forwarded the report of its step."""

    def __init__(self, welcome_map, updates):
        import grpc
        from concurrent import futures
        from prism.v1 import prism_pb2 as pb
        self.pb = pb
        self.welcome_map = welcome_map
        self.updates = updates  # [(after the report of this step, PrecisionUpdate)]
        self.hellos = []
        self.reports = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.stream_stream_rpc_method_handler(
            self.connect, request_deserializer=pb.AgentMessage.FromString,
            response_serializer=pb.ServiceMessage.SerializeToString)
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("prism.v1.PolicyService", {"Connect": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def connect(self, requests, context):
        pb = self.pb
        first = next(requests)
        self.hellos.append(first.hello)
        yield pb.ServiceMessage(welcome=pb.Welcome(config=pb.PolicyConfig(low_precision=pb.INT8),
                                                   map=self.welcome_map, calibration_needed=False))
        pending = list(self.updates)
        for m in requests:
            if m.HasField("step_report"):
                self.reports.append(m.step_report)
                while pending and pending[0][0] <= m.step_report.step:
                    yield pb.ServiceMessage(update=pending.pop(0)[1])

    def stop(self):
        self.server.stop(0)


@needs_plans
class WithAnAgent(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-torch-hybrid-agent-")
        self.agent = None
        self.prismd = None

    def tearDown(self):
        if self.agent and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGKILL)
            self.agent.wait(timeout=10)
        if self.prismd:
            self.prismd.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_agent(self, prismd):
        """A prism-agent on self.dir with prismd as its upstream, ready; returns its metrics address.
        Its device class is "t4", the class of the plans these tests send (the agent ignores
        another class's plan)."""
        from prismtest import free_port, http_get, wait_for
        metrics = f"127.0.0.1:{free_port()}"
        log = os.open(os.path.join(self.dir, "agent.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.agent = subprocess.Popen(
                [os.path.join(BUILD, "agent", "prism-agent"), "--prismd", f"127.0.0.1:{prismd.port}", "--dir",
                 self.dir, "--metrics-listen", metrics, "--device", "cpu", "--profile-budget-ms", "100",
                 "--device-class", "t4"],
                stdout=subprocess.DEVNULL, stderr=log)
        finally:
            os.close(log)
        wait_for("the agent's /readyz", lambda: http_get(metrics, "/readyz", openapi=False)[0] == 200)
        return metrics

    def test_train_demo_hybrid_records_the_blocks_run_low(self):
        from prism.v1 import prism_pb2 as pb
        plan = pb.ComputePlan(device_class="t4", low_format=pb.INT8, high_format="bf16", low_blocks=[1, 3],
                              predicted_iteration_seconds=1.0, compute_seconds=0.5)
        first = pb.PrecisionUpdate(job_id="demo", map_version=1, effective_step=0, full=True)
        # sent after the report of step 2, in force from step 60: about 3 s of 50 ms steps to get there
        second = pb.PrecisionUpdate(job_id="demo", map_version=2, decided_step=2, effective_step=60, full=True,
                                    compute_plan=plan)
        self.prismd = FakePrismd(first, [(2, second)])
        self.start_agent(self.prismd)
        log = os.path.join(self.dir, "demo.jsonl")
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"))
        out = subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "train_demo.py"), "--job", "demo",
                              "--dir", self.dir, "--steps", "80", "--step-ms", "50", "--blocks", "4", "--width", "16",
                              "--hybrid", "--tensor-stats-every", "5", "--log", log],
                             capture_output=True, text=True, timeout=240, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(log) as f:
            rows = [json.loads(line) for line in f]
        self.assertEqual([r["step"] for r in rows], list(range(80)))
        for r in rows:  # (version 1 comes with the Welcome, which the demo does not wait for)
            want = ([1, 3], 2, 2) if r["step"] >= 60 else ([], 0, min(r["map_version"], 1))
            self.assertEqual((r["compute_low"], r["plan_map_version"], r["map_version"]), want, r["step"])
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(summary["counters"]["compute_low_block_steps"], 20 * 2)
        self.assertEqual(summary["counters"]["plans_applied"], 1)
        # Linear(16, 16) on batches of 32 rows; 272 FP32 parameters with Adam's 8 bytes
        costs = {(b.flops, b.activation_bytes_bf16, b.state_bytes) for b in self.prismd.hellos[0].layout.blocks}
        self.assertEqual(costs, {(2 * 16 * 16 * 32, 2 * 32 * 16, 272 * 16)})
        # Statistics every 5 steps (a report the client had to drop leaves them for the next one)
        with_stats = [r for r in self.prismd.reports if r.tensor_stats]
        for s in range(10, 80, 5):
            self.assertTrue(any(s <= r.step < s + 5 for r in with_stats), f"no statistics sent for step {s}")
        self.assertEqual([(t.block_id, t.x_numel, t.y_numel, t.w_numel) for t in with_stats[-1].tensor_stats],
                         [(b, 32 * 16, 32 * 16, 272) for b in range(4)])

    def test_plans_reach_the_trainer_at_their_effective_steps(self):
        from prismtest import http_get, wait_for
        from prism.v1 import prism_pb2 as pb

        def update(version, effective, plan=None):
            u = pb.PrecisionUpdate(job_id="hy", map_version=version, decided_step=max(effective - 2, 0),
                                   effective_step=effective, full=True,
                                   blocks=[pb.BlockPrecision(block_id=b, precision=pb.BF16) for b in range(3)])
            if plan:
                u.compute_plan.CopyFrom(plan)
            return u
        fast = pb.ComputePlan(device_class="t4", low_format=pb.FP8_E4M3, high_format="fp16", low_blocks=[0],
                              predicted_iteration_seconds=0.75, compute_seconds=0.5)
        slow = pb.ComputePlan(device_class="t4", low_format=pb.INT8, high_format="bf16", low_blocks=[1, 2],
                              predicted_iteration_seconds=0.625, compute_seconds=0.375)
        # version 1 (Welcome) from step 0: block 0 low; version 2 from step 6: blocks 1, 2;
        # version 3 from step 9 without a plan: every block high.
        self.prismd = FakePrismd(update(1, 0, fast), [(2, update(2, 6, slow)), (6, update(3, 9))])
        metrics = self.start_agent(self.prismd)

        def agent_metric(name):
            status, text = http_get(metrics, "/metrics", openapi=False)
            for line in text.splitlines() if status == 200 else ():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            return None
        blocks = make_blocks()
        x = torch.randn(2, 3, 8)
        a = pt.attach(blocks, job_id="hy", dir=self.dir, model_id="m", reconnect_interval_ms=50,
                      profile_forward=lambda: run(blocks, x), tensor_stats_every=2)
        try:
            wait_for("map version 1", lambda: agent_metric("prism_agent_map_version") == 1)
            rows = []
            for step in range(11):
                if step == 3:  # version 2 was sent after the report of step 2: in the table before step 3
                    wait_for("map version 2", lambda: agent_metric("prism_agent_map_version") == 2)
                if step == 7:
                    wait_for("map version 3", lambda: agent_metric("prism_agent_map_version") == 3)
                version = a.begin_step(step)
                run(blocks, x).sum().backward()
                if not a.end_step(step):  # dropped (the agent behind): the statistics stay staged
                    wait_for(f"a report of step {step}", lambda: a.client.report_stats(step, []), timeout_s=10)
                n = a.counters()
                rows.append((step, version, n["compute_low_blocks"], n["plan_map_version"]))
                if step == 0:
                    self.assertEqual(a.client.plan(), {
                        "map_version": 1, "device_class": "t4", "high_format": "fp16", "low_format": "fp8_e4m3",
                        "low_blocks": 1, "predicted_iteration_seconds": 0.75, "compute_seconds": 0.5})
                if step == 6:
                    self.assertEqual(a.client.compute_precisions(), ["bf16", "int8", "int8"])
            self.assertEqual(rows, [(0, 1, [0], 1), (1, 1, [0], 1), (2, 1, [0], 1), (3, 1, [0], 1), (4, 1, [0], 1),
                                    (5, 1, [0], 1), (6, 2, [1, 2], 2), (7, 2, [1, 2], 2), (8, 2, [1, 2], 2),
                                    (9, 3, [], 0), (10, 3, [], 0)])
            self.assertEqual(a.counters()["compute_low_block_steps"], 6 * 1 + 3 * 2)
            self.assertEqual(a.counters()["plans_applied"], 2)
            hello = self.prismd.hellos[0]
            self.assertEqual([(b.flops, b.activation_bytes_bf16, b.state_bytes) for b in hello.layout.blocks],
                             [(3072, 288, 4480), (1536, 192, 1152), (0, 0, 256)])
            # the statistics reach prismd unchanged (the last sampled step's, step 10)
            wait_for("the report of step 10 upstream", lambda: any(r.step == 10 for r in self.prismd.reports))
            last = [r for r in self.prismd.reports if r.step == 10][0]
            got = [{f: getattr(t, f) for f in ("block_id", "x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs",
                                                "w_numel", "y_numel")} for t in last.tensor_stats]
            self.assertEqual(got, a.staged_tensor_stats)
            self.assertEqual([len(r.tensor_stats) for r in self.prismd.reports if r.step % 2 == 1], [0] * 5)
        finally:
            a.close()


if __name__ == "__main__":
    unittest.main()
