#!/usr/bin/python3
"""prism.torch's DDP communication hook (issue 16 item 1; python/prism/ddp.py) on P gloo ranks
(P = --ranks, 2 or 4 in ctest), against the C collectives.

The test writes every rank's inputs (random with a fixed seed: 1-D tensors, odd sizes, a row of
zeros, an empty tensor, a tensor that spans slices, NaN/Inf, float32/bfloat16/float16, several
row widths) to files, runs the C collectives' MPI all-reduce on them (coll_allreduce_files under
mpirun: prism_coll_allreduce, the MPI backend), then starts P Python processes that form a gloo
group on loopback (a FileStore for the rendezvous, GLOO_SOCKET_IFNAME=lo) and run the same cases
through prism.torch.quantized_allreduce, the map mode through the hook, and a real DDP model.
Checks:
  (a) every case's results equal the C collectives' byte for byte, on every rank, and are the
      same bytes on every rank;
  (b) the mean normwise relative error against an FP64 all-reduce of the inputs (NaN/Inf as 0)
      within the bounds of tests/unit/test_collectives_mpi.c (FP32 scales: int8 0.015, fp8_e4m3
      0.06, fp8_e5m2 0.10, int4 0.28); a tensor whose reference is zero (and the row of zeros)
      comes back exactly zero;
  (c) "map" mode through quantized_allreduce_hook with a prism.torch.Attachment (a stand-in client
      giving the map): the int8 block's and the fp8 block's parameters equal the C all-reduce of
      those parameters in that format, byte for byte; the bf16 block's and the parameter in no
      block are the FP32 all-reduce (the same bytes on every rank, within float32 rounding of
      FP64);
  (d) wire byte counts exact: the call's bytes_sent equals the C call's and the formula
      2 (P-1) ceil(rows / P) (code bytes of a row + 4); the state's wire_bytes, bf16_bytes and
      calls after a map bucket and after a DDP run equal the sums worked out here;
  (e) a real DistributedDataParallel model (several buckets) trains 12 steps with the FP8 hook:
      every rank's parameters bit-identical after each step, the loss falls, each bucket's result
      equals quantized_allreduce of its inputs, and the gradients DDP leaves equal the hook's
      results; the same model with wire="map" and an Attachment trains bit-identical too;
  and bad arguments raise ValueError naming the argument; ranks passing different sizes get a
  ValueError on every rank (no hang) and the group works after it.
Every wait is bounded (the group's timeout, the subprocesses' timeouts)."""

import argparse
import datetime
import math
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "python"))

import prism  # noqa: E402
import prism.torch as pt  # noqa: E402

SEED = 20261126
WIRE_CODE = {"int8": 1, "fp8_e4m3": 2, "fp8_e5m2": 3, "int4": 4}
OP_CODE = {"sum": 0, "avg": 1}
DTYPE_CODE = {"float32": 0, "bfloat16": 1, "float16": 2}
TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BOUND = {"int8": 0.015, "fp8_e4m3": 0.06, "fp8_e5m2": 0.10, "int4": 0.28}  # test_collectives_mpi.c per_case
TIMEOUT_S = 420

# The list most cases use: (shape, input magnitude, special). 37 x 300 spans slices; (3, 256) has
# a row of zeros on every rank (its middle row); (0,) is empty; 1-D tensors of 1000, 5, 513, 1.
BASE = [((37, 300), 1.0, None), ((1000,), 1e-3, None), ((5,), 10.0, None), ((3, 256), 1.0, "zero_row"),
        ((513,), 1e3, None), ((0,), 1.0, None), ((1,), 1.0, None), ((7, 9), 0.1, None)]

# The map test's parameters in bucket order: (name, shape, block); block None: in no block.
MAP_BLOCKS = ["bf16", "int8", "fp8_e4m3"]
MAP_PARAMS = [("b1.a", (300,), 1), ("b0.a", (20, 30), 0), ("b2.a", (50, 50), 2), ("b1.b", (17, 40), 1),
              ("none", (3,), None), ("b0.b", (20,), 0)]


def rank_values(case_index, tensor_index, rank, shape, magnitude, special):
    """One rank's float32 values of a tensor (deterministic)."""
    rng = np.random.default_rng([SEED, case_index, tensor_index, rank])
    x = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    if special == "zero_row" and x.ndim == 2:
        x[1, :] = 0.0
    if special == "nonfinite" and x.size > 7:
        flat = x.reshape(-1)
        if rank == 0:
            flat[3] = np.nan
        if rank == 1:
            flat[7] = np.inf
            flat[5] = -np.inf
    return x


def to_bytes(x, dtype):
    """The raw bytes of float32 values x in dtype (bfloat16 and float16 rounded to nearest even)."""
    if x.size == 0:
        return b""
    return torch.from_numpy(np.ascontiguousarray(x).reshape(-1)).to(TORCH_DTYPE[dtype]).view(torch.uint8) \
        .numpy().tobytes()


def from_bytes(raw, dtype, shape):
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return t.view(TORCH_DTYPE[dtype]).reshape(shape)


def build_cases(world):
    """[{name, wire, op, row_width, dtypes, shapes, specials, inputs: [rank][tensor] raw bytes}]"""
    specs = []
    for wire in WIRE_CODE:
        for op in ("avg", "sum"):
            specs.append((f"{wire} {op} float32", wire, op, 256, BASE, ["float32"] * len(BASE)))
    specs.append(("fp8_e4m3 avg bfloat16", "fp8_e4m3", "avg", 256, BASE, ["bfloat16"] * len(BASE)))
    specs.append(("int8 sum float16", "int8", "sum", 256, BASE, ["float16"] * len(BASE)))
    specs.append(("int4 avg mixed dtypes", "int4", "avg", 256, BASE,
                  [("float32", "bfloat16", "float16")[i % 3] for i in range(len(BASE))]))
    small = [((100,), 1.0, None), ((9, 7), 2.0, "zero_row"), ((33,), 0.5, None)]
    specs.append(("fp8_e5m2 avg row_width 64", "fp8_e5m2", "avg", 64, small, ["float32"] * 3))
    specs.append(("int8 avg row_width 8", "int8", "avg", 8, small, ["float32"] * 3))
    specs.append(("int4 sum row_width 8", "int4", "sum", 8, small, ["float32"] * 3))
    nonfinite = [((40, 30), 1.0, "nonfinite"), ((77,), 1.0, None)]
    specs.append(("fp8_e4m3 sum with NaN/Inf", "fp8_e4m3", "sum", 256, nonfinite, ["float32"] * 2))
    specs.append(("empty list", "int8", "avg", 256, [], []))
    # The map test's low groups, as the hook must send them (bucket order within a format).
    for b, fmt in ((1, "int8"), (2, "fp8_e4m3")):
        group = [(shape, 1.0, None) for _, shape, blk in MAP_PARAMS if blk == b]
        specs.append((f"map {fmt} group", fmt, "avg", 256, group, ["float32"] * len(group)))
    cases = []
    for ci, (name, wire, op, width, tensors, dtypes) in enumerate(specs):
        if name.startswith("map "):
            names = [n for n, _, blk in MAP_PARAMS if blk == (1 if "int8" in name else 2)]
            f32 = [[map_grad(r, n) for n in names] for r in range(world)]
        else:
            f32 = [[rank_values(ci, ti, r, shape, mag, sp) for ti, (shape, mag, sp) in enumerate(tensors)]
                   for r in range(world)]
        inputs = [[to_bytes(x, d) for x, d in zip(f32[r], dtypes)] for r in range(world)]
        cases.append(dict(name=name, wire=wire, op=op, row_width=width, dtypes=dtypes,
                          shapes=[s for s, _, _ in tensors], specials=[sp for _, _, sp in tensors], inputs=inputs))
    return cases


def map_grad(rank, name):
    """The map test's gradient of parameter `name` on `rank` (float32)."""
    i = [n for n, _, _ in MAP_PARAMS].index(name)
    shape = MAP_PARAMS[i][1]
    rng = np.random.default_rng([SEED, 999, i, rank])
    return rng.standard_normal(shape).astype(np.float32)


def u64(*values):
    return b"".join(struct.pack("<Q", v) for v in values)


def write_c_inputs(cases, world, folder):
    for r in range(world):
        with open(os.path.join(folder, f"in.{r}"), "wb") as f:
            f.write(u64(len(cases)))
            for c in cases:
                f.write(u64(WIRE_CODE[c["wire"]], OP_CODE[c["op"]], c["row_width"], len(c["shapes"])))
                for shape, d in zip(c["shapes"], c["dtypes"]):
                    f.write(u64(DTYPE_CODE[d], int(np.prod(shape, dtype=np.int64))))
                for raw in c["inputs"][r]:
                    f.write(raw)


def read_c_outputs(cases, world, folder):
    """[rank][case] = (status, bytes_sent, bytes_received, nonfinite, [raw bytes per tensor])"""
    out = []
    for r in range(world):
        with open(os.path.join(folder, f"out.{r}"), "rb") as f:
            data = f.read()
        pos, mine = 0, []
        for c in cases:
            st, sent, recv, nonfinite = struct.unpack_from("<4Q", data, pos)
            pos += 32
            raws = []
            for shape, d in zip(c["shapes"], c["dtypes"]):
                n = int(np.prod(shape, dtype=np.int64)) * (4 if d == "float32" else 2)
                raws.append(data[pos:pos + n])
                pos += n
            mine.append((st, sent, recv, nonfinite, raws))
        if pos != len(data):
            raise AssertionError(f"out.{r}: {len(data) - pos} bytes left over")
        out.append(mine)
    return out


def prism_bytes(numels, wire, width, world):
    """What one rank sends in a Prism all-reduce, worked out from collectives.h's formula."""
    rows = sum(-(-n // width) for n in numels)
    per_rank = -(-rows // world)
    code_row = width // 2 if wire == "int4" else width
    return 2 * (world - 1) * per_rank * (code_row + 4)


def bf16_ring_bytes(numel, world):
    return 4 * numel * (world - 1) // world


# ---- the stand-in client of the map mode ---------------------------------------------------------


class MapClient:
    """What prism.torch.Attachment needs of prism.Client, with a fixed map."""

    def __init__(self, precisions):
        self._precisions = list(precisions)

    def register(self, model_id, layout, low_precision, granularity, block_size):
        return b"\0" * 32

    def has_plans(self):
        return False

    def begin_step(self, step):
        return 1

    def precisions(self):
        return list(self._precisions)

    def state(self):
        return {"effective_step": 0, "calibration_needed": False, "run_calibration": False,
                "calibration_samples": 1, "low_precision": "int8", "connected": False}

    def report_step(self, step, grads, loss=None, fractions=None):
        return True

    def counters(self):
        return {}

    def close(self):
        pass


class Bucket:
    """A stand-in for torch.distributed.GradBucket: what the hook reads (buffer, parameters)."""

    def __init__(self, buffer, params):
        self._buffer, self._params = buffer, params

    def buffer(self):
        return self._buffer

    def parameters(self):
        return list(self._params)


# ---- a rank --------------------------------------------------------------------------------------


def worker(rank, world, folder):
    """One gloo rank: every case, the map bucket, the DDP runs; results pickled to py.<rank>."""
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    with open(os.path.join(folder, "cases.pkl"), "rb") as f:
        cases = pickle.load(f)
    result = {"cases": [], "errors": {}}

    # (a), (b), (d): every case through quantized_allreduce.
    for c in cases:
        ts = [from_bytes(raw, d, s).clone() for raw, d, s in zip(c["inputs"][rank], c["dtypes"], c["shapes"])]
        st = pt.quantized_allreduce(ts, c["wire"], op=c["op"], row_width=c["row_width"])
        result["cases"].append((st, [t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
                                     for t in ts]))

    # (c): map mode through the hook, with an Attachment on a stand-in client.
    blocks = torch.nn.ModuleList([torch.nn.Module() for _ in MAP_BLOCKS])
    params = {}
    for name, shape, blk in MAP_PARAMS:
        p = torch.nn.Parameter(torch.zeros(shape))
        params[name] = p
        if blk is not None:
            blocks[blk].register_parameter(name.replace(".", "_"), p)
    att = pt.Attachment(blocks, client=MapClient(MAP_BLOCKS))
    state = pt.QuantizedAllReduceState(wire="map", attachment=att)
    order = [params[n] for n, _, _ in MAP_PARAMS]
    buffer = torch.cat([torch.from_numpy(map_grad(rank, n)).reshape(-1) for n, _, _ in MAP_PARAMS])
    fut = pt.quantized_allreduce_hook(state, Bucket(buffer, order))
    out = fut.value()
    result["map"] = {"same_buffer": out is buffer, "bytes": out.numpy().tobytes(), "wire_bytes": state.wire_bytes,
                     "bf16_bytes": state.bf16_bytes, "calls": state.calls, "collectives": state.collectives,
                     "plain_allreduces": state.plain_allreduces, "elements_low": state.elements_low,
                     "elements_high": state.elements_high}

    # The same bucket in bfloat16 (a bf16 model's bucket): gloo sums the unquantized part in float32.
    state16 = pt.QuantizedAllReduceState(wire="map", attachment=att)
    buffer16 = torch.cat([torch.from_numpy(map_grad(rank, n)).reshape(-1) for n, _, _ in MAP_PARAMS]).bfloat16()
    out16 = pt.quantized_allreduce_hook(state16, Bucket(buffer16, order)).value()
    result["map_bf16"] = {"dtype": str(out16.dtype), "bytes": out16.view(torch.uint8).numpy().tobytes(),
                          "wire_bytes": state16.wire_bytes}

    # Sizes that differ between ranks: a ValueError on every rank, and the group works after it.
    try:
        pt.quantized_allreduce([torch.ones(10 + (rank == world - 1) * 300)], "int8")
        result["errors"]["mismatch"] = None
    except ValueError as e:
        result["errors"]["mismatch"] = str(e)
    t = torch.full((10,), float(rank + 1))
    pt.quantized_allreduce([t], "int8", op="sum")
    result["errors"]["after"] = t.tolist()

    result["ddp"] = run_ddp(rank, world, "fp8_e4m3")
    result["ddp_map"] = run_ddp(rank, world, "map")
    dist.destroy_process_group()
    with open(os.path.join(folder, f"py.{rank}.tmp"), "wb") as f:
        pickle.dump(result, f)
    os.rename(os.path.join(folder, f"py.{rank}.tmp"), os.path.join(folder, f"py.{rank}"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(24, 300), torch.nn.Linear(300, 37),
                                           torch.nn.Linear(37, 1)])

    def forward(self, x):
        x = torch.tanh(self.blocks[0](x))
        x = torch.tanh(self.blocks[1](x))
        return self.blocks[2](x)


def run_ddp(rank, world, wire):
    """A regression trained 12 steps by DDP with the hook (several buckets): the loss, every
    step's parameters, each bucket's inputs and results, the last gradients, the counters."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(7)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = Net()
    att = pt.Attachment(model.blocks, client=MapClient(["int8", "bf16", "fp8_e4m3"])) if wire == "map" else None
    dist._DEFAULT_FIRST_BUCKET_BYTES = 8192  # (DDP's own knob) else the first bucket holds 1 MiB: all of it
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = pt.QuantizedAllReduceState(wire=wire, attachment=att)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    records = []
    step_now = [0]

    def hook(st, bucket):
        params = [index[id(p)] for p in bucket.parameters()]
        before = bucket.buffer().clone()
        fut = pt.quantized_allreduce_hook(st, bucket)
        records.append((step_now[0], params, before, fut.value().clone()))
        return fut

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 + rank)
    w_true = torch.randn(24, 1, generator=torch.Generator().manual_seed(5))
    x = torch.randn(64, 24, generator=g)
    y = x @ w_true
    losses, params_by_step = [], []
    for step in range(12):
        step_now[0] = step
        if att is not None:
            att.begin_step(step)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if att is not None:
            att.end_step(step, loss=loss.item())
        opt.step()
        losses.append(loss.item())
        params_by_step.append(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    plist = list(model.parameters())
    last = [r for r in records if r[0] == 11]
    grads_match = all(torch.equal(plist[i].grad.reshape(-1), out[off:off + plist[i].numel()])
                      for _, idx, _, out in last
                      for i, off in zip(idx, np.cumsum([0] + [plist[i].numel() for i in idx])[:-1].tolist()))
    # Each bucket's result against quantized_allreduce of its inputs (every rank replays the same
    # buckets in the same order: a collective sequence). Fixed format only.
    replay_match = True
    if wire != "map":
        for _, idx, before, out in records:
            parts = list(before.clone().split([plist[i].numel() for i in idx]))
            pt.quantized_allreduce(parts, wire)
            replay_match = replay_match and torch.equal(torch.cat(parts), out)
    dist.barrier()
    return {"losses": losses, "params": params_by_step, "grads_match": grads_match, "replay_match": replay_match,
            "buckets": [[plist[i].numel() for i in idx] for _, idx, _, _ in records],
            "wire_bytes": state.wire_bytes, "bf16_bytes": state.bf16_bytes, "calls": state.calls,
            "collectives": state.collectives, "plain_allreduces": state.plain_allreduces}


# ---- the checks ----------------------------------------------------------------------------------


class TorchDDP(unittest.TestCase):
    world = 2
    folder = None

    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="prism-ddp-")
        cls.cases = build_cases(cls.world)
        with open(os.path.join(cls.folder, "cases.pkl"), "wb") as f:
            pickle.dump(cls.cases, f)
        write_c_inputs(cls.cases, cls.world, cls.folder)
        mpiexec = os.environ.get("MPIEXEC", "mpirun")
        tool = os.environ.get("PRISM_COLL_FILES", os.path.join(SOURCE, "build", "tests", "coll_allreduce_files"))
        env = dict(os.environ)
        # The tool links its own sanitizer runtime when it has one; mpirun must not preload it.
        env.pop("LD_PRELOAD", None)
        env.pop("ASAN_OPTIONS", None)
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "OMPI_MCA_rmaps_base_oversubscribe": "1"})
        env.setdefault("OMPI_MCA_btl", "self,vader,tcp")
        env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        run = subprocess.run([mpiexec, "-np", str(cls.world), tool, cls.folder], env=env, timeout=TIMEOUT_S,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            raise AssertionError(f"{tool} under {mpiexec}: exit {run.returncode}\n{run.stdout}")
        cls.c_out = read_c_outputs(cls.cases, cls.world, cls.folder)
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), "--ranks",
                                   str(cls.world), "--dir", cls.folder],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(cls.world)]
        logs = []
        try:
            for p in procs:
                out, _ = p.communicate(timeout=TIMEOUT_S)
                logs.append((p.returncode, out))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for r, (rc, out) in enumerate(logs):
            if rc != 0:
                raise AssertionError(f"rank {r}: exit {rc}\n{out}")
        cls.py = []
        for r in range(cls.world):
            with open(os.path.join(cls.folder, f"py.{r}"), "rb") as f:
                cls.py.append(pickle.load(f))

    @classmethod
    def tearDownClass(cls):
        if cls.folder:
            shutil.rmtree(cls.folder, ignore_errors=True)

    def test_c_collectives_succeeded(self):
        for r in range(self.world):
            for c, out in zip(self.cases, self.c_out[r]):
                self.assertEqual(out[0], 0, f"rank {r}, case {c['name']}: the C all-reduce failed")

    def test_results_equal_the_c_collectives_byte_for_byte(self):
        for r in range(self.world):
            for c, (_, raws), cout in zip(self.cases, self.py[r]["cases"], self.c_out[r]):
                for t, (mine, theirs) in enumerate(zip(raws, cout[4])):
                    self.assertEqual(len(mine), len(theirs))
                    if mine != theirs:
                        a = np.frombuffer(mine, np.uint8)
                        b = np.frombuffer(theirs, np.uint8)
                        first = int(np.nonzero(a != b)[0][0])
                        self.fail(f"rank {r}, case {c['name']}, tensor {t}: byte {first} differs from C's")

    def test_results_identical_on_every_rank(self):
        for r in range(1, self.world):
            for c, (_, mine), (_, first) in zip(self.cases, self.py[r]["cases"], self.py[0]["cases"]):
                self.assertEqual(mine, first, f"case {c['name']}: rank {r} differs from rank 0")

    def test_error_against_fp64_within_the_c_bounds(self):
        checked = 0
        for c, (_, raws) in zip(self.cases, self.py[0]["cases"]):
            errs = []
            for t, (shape, d, special) in enumerate(zip(c["shapes"], c["dtypes"], c["specials"])):
                if not int(np.prod(shape, dtype=np.int64)):
                    continue
                # The inputs as sent: the dtype's values, NaN/Inf as 0.
                held = [from_bytes(c["inputs"][r][t], d, shape).double().numpy() for r in range(self.world)]
                ref = sum(np.where(np.isfinite(h), h, 0.0) for h in held)
                if c["op"] == "avg":
                    ref = ref / self.world
                y = from_bytes(raws[t], d, shape).double().numpy()
                den = float(np.sum(ref * ref))
                num = float(np.sum((y - ref) ** 2))
                if den == 0.0:
                    self.assertEqual(num, 0.0, f"case {c['name']}, tensor {t}: zero reference, nonzero result")
                    continue
                errs.append(math.sqrt(num / den))
                if special == "zero_row":
                    self.assertTrue(np.all(y[1] == 0.0), f"case {c['name']}, tensor {t}: the row of zeros is not 0")
            if errs:
                e = sum(errs) / len(errs)
                self.assertLessEqual(e, BOUND[c["wire"]], f"case {c['name']}: mean normwise error {e:.4f}")
                checked += 1
        self.assertGreaterEqual(checked, 15)

    def test_wire_bytes_exact(self):
        for r in range(self.world):
            for c, (st, _), cout in zip(self.cases, self.py[r]["cases"], self.c_out[r]):
                numels = [int(np.prod(s, dtype=np.int64)) for s in c["shapes"]]
                want = prism_bytes(numels, c["wire"], c["row_width"], self.world)
                self.assertEqual(cout[1], want, f"case {c['name']}: the C call sent {cout[1]}")
                self.assertEqual(st["bytes_sent"], want, f"case {c['name']}: rank {r}")
                self.assertEqual(st["bf16_bytes"], bf16_ring_bytes(sum(numels), self.world))
                self.assertEqual(st["nonfinite"], cout[3], f"case {c['name']}: NaN/Inf count")
        nf = [c for c in self.cases if "NaN" in c["name"]][0]
        self.assertEqual(self.py[0]["cases"][self.cases.index(nf)][0]["nonfinite"], 3)

    def test_map_mode_low_blocks_equal_c_and_bf16_blocks_plain(self):
        sizes = {n: int(np.prod(s)) for n, s, _ in MAP_PARAMS}
        offsets = dict(zip([n for n, _, _ in MAP_PARAMS], np.cumsum([0] + list(sizes.values()))[:-1].tolist()))
        for r in range(self.world):
            m = self.py[r]["map"]
            self.assertTrue(m["same_buffer"], "the hook's Future holds the bucket's buffer")
            out = np.frombuffer(m["bytes"], np.float32)
            self.assertEqual(m["bytes"], self.py[0]["map"]["bytes"], f"rank {r} differs from rank 0")
            for fmt, blk in (("int8", 1), ("fp8_e4m3", 2)):
                ci = [c["name"] for c in self.cases].index(f"map {fmt} group")
                names = [n for n, _, b in MAP_PARAMS if b == blk]
                for n, theirs in zip(names, self.c_out[r][ci][4]):
                    mine = out[offsets[n]:offsets[n] + sizes[n]].tobytes()
                    self.assertTrue(mine == theirs, f"rank {r}: {n} ({fmt}) differs from the C all-reduce")
            for n in [n for n, _, b in MAP_PARAMS if b in (0, None)]:
                ref = sum(map_grad(q, n).astype(np.float64).reshape(-1) for q in range(self.world)) / self.world
                got = out[offsets[n]:offsets[n] + sizes[n]].astype(np.float64)
                self.assertLessEqual(float(np.max(np.abs(got - ref))), 1e-6 * float(np.max(np.abs(ref))) + 1e-30,
                                     f"{n}: the unquantized all-reduce")
            low = {1: [sizes[n] for n, _, b in MAP_PARAMS if b == 1], 2: [sizes[n] for n, _, b in MAP_PARAMS if b == 2]}
            high = sum(sizes[n] for n, _, b in MAP_PARAMS if b in (0, None))
            want = (prism_bytes(low[1], "int8", 256, self.world) + prism_bytes(low[2], "fp8_e4m3", 256, self.world)
                    + 2 * (self.world - 1) * high * 4 // self.world)
            self.assertEqual(m["wire_bytes"], want)
            self.assertEqual(m["bf16_bytes"], bf16_ring_bytes(sum(sizes.values()), self.world))
            self.assertEqual((m["calls"], m["collectives"], m["plain_allreduces"]), (1, 2, 1))
            self.assertEqual((m["elements_low"], m["elements_high"]), (sum(low[1]) + sum(low[2]), high))

    def test_map_mode_bfloat16_bucket(self):
        sizes = {n: int(np.prod(s)) for n, s, _ in MAP_PARAMS}
        high = sum(sizes[n] for n, _, b in MAP_PARAMS if b in (0, None))
        want = (prism_bytes([sizes[n] for n, _, b in MAP_PARAMS if b == 1], "int8", 256, self.world)
                + prism_bytes([sizes[n] for n, _, b in MAP_PARAMS if b == 2], "fp8_e4m3", 256, self.world)
                + 2 * (self.world - 1) * high * 4 // self.world)  # gloo: the bf16 part goes as float32
        for r in range(self.world):
            m = self.py[r]["map_bf16"]
            self.assertEqual(m["dtype"], "torch.bfloat16")
            self.assertTrue(m["bytes"] == self.py[0]["map_bf16"]["bytes"], f"rank {r} differs from rank 0")
            self.assertEqual(m["wire_bytes"], want)

    def test_ranks_that_disagree_get_an_error_everywhere(self):
        for r in range(self.world):
            e = self.py[r]["errors"]
            self.assertIsNotNone(e["mismatch"], f"rank {r}: no error")
            self.assertIn("tensors: rank 0", e["mismatch"])
            self.assertEqual(e["after"], [float(sum(range(1, self.world + 1)))] * 10)

    def test_ddp_trains_with_the_fp8_hook_ranks_bit_identical(self):
        self.check_ddp("ddp", "fp8_e4m3")

    def test_ddp_trains_with_the_map_ranks_bit_identical(self):
        self.check_ddp("ddp_map", "map")

    def check_ddp(self, key, wire):
        runs = [self.py[r][key] for r in range(self.world)]
        for r in range(1, self.world):
            for step, (a, b) in enumerate(zip(runs[0]["params"], runs[r]["params"])):
                self.assertEqual(a, b, f"{key}: rank {r}'s parameters differ from rank 0's after step {step}")
        for r, run in enumerate(runs):
            self.assertTrue(run["grads_match"], f"{key}, rank {r}: DDP's gradients are not the hook's results")
            self.assertTrue(run["replay_match"], f"{key}, rank {r}: a bucket differs from quantized_allreduce")
            self.assertLess(run["losses"][-1], 0.8 * run["losses"][0], f"{key}, rank {r}: {run['losses']}")
            self.assertEqual(run["calls"], len(run["buckets"]))
            self.assertGreater(len(run["buckets"]), 12, "several buckets per step")
            self.assertEqual(run["bf16_bytes"], sum(bf16_ring_bytes(sum(b), self.world) for b in run["buckets"]))
            if wire != "map":
                want = sum(prism_bytes(b, wire, 256, self.world) for b in run["buckets"])
                self.assertEqual(run["wire_bytes"], want)
            else:
                self.assertGreater(run["collectives"], 0)
                self.assertGreater(run["plain_allreduces"], 0)
                self.assertLess(run["wire_bytes"], sum(2 * (self.world - 1) * sum(b) * 4 // self.world
                                                       for b in run["buckets"]))


class Arguments(unittest.TestCase):
    """Bad arguments: ValueError naming the argument (no process group needed)."""

    def check(self, name, call):
        with self.assertRaises(ValueError) as cm:
            call()
        self.assertTrue(str(cm.exception).startswith(name + ":"), str(cm.exception))

    def test_bad_arguments(self):
        self.check("wire", lambda: pt.QuantizedAllReduceState(wire="fp9"))
        self.check("wire", lambda: pt.QuantizedAllReduceState(wire="bf16"))
        self.check("op", lambda: pt.QuantizedAllReduceState(op="mean"))
        self.check("row_width", lambda: pt.QuantizedAllReduceState(row_width=12))
        self.check("row_width", lambda: pt.QuantizedAllReduceState(row_width=65544))
        self.check("attachment", lambda: pt.QuantizedAllReduceState(wire="map"))
        self.check("attachment", lambda: pt.QuantizedAllReduceState(wire="map", attachment=object()))
        self.check("wire", lambda: pt.quantized_allreduce([torch.ones(3)], "map"))
        self.check("op", lambda: pt.quantized_allreduce([torch.ones(3)], "int8", op="max"))
        self.check("row_width", lambda: pt.quantized_allreduce([torch.ones(3)], "int8", row_width=0.5))

    def test_defaults(self):
        s = pt.QuantizedAllReduceState()
        self.assertEqual((s.wire, s.op, s.row_width, s.process_group, s.attachment),
                         ("fp8_e4m3", "avg", 256, None, None))
        self.assertEqual((s.wire_bytes, s.bf16_bytes, s.calls), (0, 0, 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--worker", type=int)
    ap.add_argument("--dir")
    args, rest = ap.parse_known_args()
    if args.worker is not None:
        worker(args.worker, args.ranks, args.dir)
        return
    TorchDDP.world = args.ranks
    print(f"libprism: {prism.library_path()}; {args.ranks} gloo ranks", flush=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
