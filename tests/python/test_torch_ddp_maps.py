#!/usr/bin/python3
"""prism.torch's DDP hook in wire="map" mode when the ranks' maps disagree (python/prism/ddp.py,
QuantizedAllReduceState._agree), on P gloo ranks (P = --ranks, 2 and 4 in ctest).

Maps reach the ranks through their own agents, so one rank may take a map a step after another.
Each map-mode bucket starts with one all-gather of every rank's per-parameter format codes; a
parameter whose format differs between ranks goes unquantized for that bucket on every rank and
counts in state.map_disagreements. Checks:
  (a) one bucket whose blocks' formats differ between ranks (rank 1: an int8 block at bf16 and
      another int8 block at fp8_e4m3; with 4 ranks also rank 2: an int4 block at int8, rank 3:
      a bf16 block at int8), in float32 and in bfloat16: the call returns (no hang, no
      exception), the result is the same bytes on every rank and the bytes of the same bucket
      sent with the agreed map (the disagreeing blocks at bf16) on every rank;
      map_disagreements is the number of parameters of the disagreeing blocks (worked out by
      hand), the agreed run's is 0; wire_bytes, collectives, plain_allreduces, elements_high
      equal the agreed run's and the formulas; the agreement's all-gather counted apart
      (map_exchanges 1, map_exchange_bytes (P-1) x the parameters);
  (b) a rank whose map cannot be read (precisions() raising): counted in its map_errors, the
      bucket goes as if that rank's map were all bf16, the same bytes everywhere;
  (c) a real DDP model trained 10 steps with wire="map" where the odd ranks take a new map one
      step after the even ones: every rank's parameters bit-identical after every step, and
      equal, bit for bit, to a run where the hook reads the agreed map (the late step's
      disagreeing blocks at bf16) while every rank's forward runs on its own map as before;
      map_disagreements is exactly the parameters of the blocks that changed, on every rank.
Every wait is bounded (the group's timeout, the subprocesses' timeouts)."""

import argparse
import datetime
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_torch_ddp as base  # noqa: E402  (prism on sys.path, MapClient, Bucket, Net, byte formulas)
import prism  # noqa: E402
import prism.torch as pt  # noqa: E402

SEED = 20261127
TIMEOUT_S = 420
AGREED = ["int8", "bf16", "fp8_e4m3", "int4", "int8"]
# Per rank, the blocks whose format differs from AGREED's: rank 1 an int8 block at bf16 and
# another int8 block at fp8_e4m3, rank 2 an int4 block at int8, rank 3 a bf16 block at int8;
# rank 0 holds AGREED.
DIVERGE = {1: {0: "bf16", 4: "fp8_e4m3"}, 2: {3: "int8"}, 3: {1: "int8"}}
# The parameters of the blocks that differ somewhere (worked out by hand from DIVERGE and PARAMS).
DISAGREEING_PARAMS = {2: 5, 3: 7, 4: 8}
# The bucket's parameters in bucket order: (name, shape, block); block None: in no block.
PARAMS = [("b0.w", (20, 30), 0), ("b2.w", (41, 13), 2), ("b1.w", (300,), 1), ("b3.w", (9, 70), 3),
          ("b0.b", (20,), 0), ("none", (5,), None), ("b2.b", (41,), 2), ("b3.b", (9,), 3),
          ("b0.c", (1,), 0), ("b4.w", (7, 33), 4), ("b4.b", (7,), 4)]
# The DDP run: Net's 3 blocks; before step SWITCH every rank holds OLD, from SWITCH on NEW; odd
# ranks take NEW one step late (at SWITCH + 1), so at step SWITCH blocks 0 and 1 disagree.
OLD = ["int8", "bf16", "fp8_e4m3"]
NEW = ["fp8_e4m3", "int8", "fp8_e4m3"]
SWITCH = 4
STEPS = 10


def rank_map(rank):
    m = list(AGREED)
    for b, f in DIVERGE.get(rank, {}).items():
        m[b] = f
    return m


def disagreeing_blocks(world):
    maps = [rank_map(r) for r in range(world)]
    return [b for b in range(len(AGREED)) if any(m[b] != maps[0][b] for m in maps)]


def agreed_map(world):
    """The map every rank sends the bucket with: a block whose format differs anywhere at bf16."""
    return ["bf16" if b in disagreeing_blocks(world) else f for b, f in enumerate(AGREED)]


def grad(rank, i):
    rng = np.random.default_rng([SEED, i, rank])
    return rng.standard_normal(PARAMS[i][1]).astype(np.float32)


class Raising(base.MapClient):
    """A client whose map cannot be read."""

    def precisions(self):
        raise RuntimeError("no map")


class StagedClient(base.MapClient):
    """A client that takes NEW at step `switch` (OLD before)."""

    def __init__(self, switch):
        super().__init__(OLD)
        self.switch, self.step = switch, 0

    def begin_step(self, step):
        self.step = step
        return 2 if step >= self.switch else 1

    def precisions(self):
        return list(NEW if self.step >= self.switch else OLD)


class AgreedView:
    """What the hook reads in the reference run: the model's blocks and, at the step the client
    is at, the map the ranks agree on (at SWITCH: OLD with the blocks that change at bf16)."""

    def __init__(self, blocks, client):
        self.blocks, self.client = blocks, client

    def precisions(self):
        s = self.client.step
        if s < SWITCH:
            return list(OLD)
        if s > SWITCH:
            return list(NEW)
        return [o if o == n else "bf16" for o, n in zip(OLD, NEW)]


def counters(state):
    return {k: getattr(state, k) for k in ("wire_bytes", "bf16_bytes", "calls", "collectives", "plain_allreduces",
                                           "elements_low", "elements_high", "map_disagreements", "map_exchanges",
                                           "map_exchange_bytes", "map_errors")}


def run_bucket(rank, precisions_client, dtype):
    """The PARAMS bucket through the hook with a map from `precisions_client`: its bytes, the
    counters."""
    blocks = torch.nn.ModuleList([torch.nn.Module() for _ in AGREED])
    order = []
    for name, shape, blk in PARAMS:
        p = torch.nn.Parameter(torch.zeros(shape))
        order.append(p)
        if blk is not None:
            blocks[blk].register_parameter(name.replace(".", "_"), p)
    att = pt.Attachment(blocks, client=precisions_client)
    state = pt.QuantizedAllReduceState(wire="map", attachment=att)
    buffer = torch.cat([torch.from_numpy(grad(rank, i)).reshape(-1) for i in range(len(PARAMS))]).to(dtype)
    out = pt.quantized_allreduce_hook(state, base.Bucket(buffer, order)).value()
    return {"bytes": out.view(torch.uint8).numpy().tobytes(), "counters": counters(state)}


def run_ddp(rank, world, reference):
    """Net trained STEPS steps by DDP with the map hook; odd ranks take NEW a step late. With
    `reference` the hook reads the agreed map instead (the forward is the same)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(7)
    model = base.Net()
    client = StagedClient(SWITCH + rank % 2)
    att = pt.Attachment(model.blocks, client=client)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 8192
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = pt.QuantizedAllReduceState(wire="map", attachment=AgreedView(model.blocks, client) if reference else att)
    ddp.register_comm_hook(state, pt.quantized_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    w_true = torch.randn(24, 1, generator=torch.Generator().manual_seed(5))
    x = torch.randn(64, 24, generator=torch.Generator().manual_seed(1000 + rank))
    y = x @ w_true
    losses, params = [], []
    for step in range(STEPS):
        att.begin_step(step)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        att.end_step(step, loss=loss.item())
        opt.step()
        losses.append(loss.item())
        params.append(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    dist.barrier()
    return {"losses": losses, "params": params, "counters": counters(state),
            "block_params": [len(list(b.parameters())) for b in model.blocks]}


def worker(rank, world, folder):
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    result = {}
    for dtype in (torch.float32, torch.bfloat16):
        key = str(dtype).replace("torch.", "")
        result[f"diverge_{key}"] = run_bucket(rank, base.MapClient(rank_map(rank)), dtype)
        result[f"agreed_{key}"] = run_bucket(rank, base.MapClient(agreed_map(world)), dtype)
    result["raising"] = run_bucket(rank, Raising(AGREED) if rank == 1 else base.MapClient(AGREED), torch.float32)
    result["all_bf16"] = run_bucket(rank, base.MapClient(["bf16"] * len(AGREED)), torch.float32)
    result["ddp"] = run_ddp(rank, world, reference=False)
    result["ddp_ref"] = run_ddp(rank, world, reference=True)
    dist.destroy_process_group()
    with open(os.path.join(folder, f"py.{rank}.tmp"), "wb") as f:
        pickle.dump(result, f)
    os.rename(os.path.join(folder, f"py.{rank}.tmp"), os.path.join(folder, f"py.{rank}"))


class MapDisagreement(unittest.TestCase):
    world = 2
    folder = None

    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="prism-ddp-maps-")
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

    def want_bytes(self, formats_of_block):
        """wire_bytes of the PARAMS bucket (float32) sent with this map, from the formulas."""
        total = 0
        numel = [int(np.prod(s)) for _, s, _ in PARAMS]
        fmt = [formats_of_block[b] if b is not None else "bf16" for _, _, b in PARAMS]
        for f in ("int8", "fp8_e4m3", "fp8_e5m2", "int4"):  # the hook's order
            part = [n for n, g in zip(numel, fmt) if g == f]
            if part:
                total += base.prism_bytes(part, f, 256, self.world)
        high = sum(n for n, g in zip(numel, fmt) if g == "bf16")
        return total + 2 * (self.world - 1) * high * 4 // self.world

    def test_agreed_map(self):
        want = (["bf16", "bf16", "fp8_e4m3", "int4", "bf16"] if self.world == 2
                else ["bf16", "bf16", "fp8_e4m3", "bf16", "bf16"])
        self.assertEqual(agreed_map(self.world), want)

    def check_bucket(self, key, ref, disagreeing_params):
        for r in range(self.world):
            got, want = self.py[r][key], self.py[r][ref]
            self.assertTrue(got["bytes"] == self.py[0][key]["bytes"], f"{key}: rank {r} differs from rank 0")
            self.assertTrue(got["bytes"] == want["bytes"], f"{key}: rank {r} differs from the agreed map's result")
            c, w = dict(got["counters"]), dict(want["counters"])
            self.assertEqual(c.pop("map_disagreements"), disagreeing_params, f"{key}: rank {r}")
            self.assertEqual(w.pop("map_disagreements"), 0, f"{ref}: rank {r}")
            c.pop("map_errors")
            w.pop("map_errors")
            self.assertEqual(c, w, f"{key}: rank {r}'s counters against the agreed map's")
            self.assertEqual((c["calls"], c["map_exchanges"], c["map_exchange_bytes"]),
                             (1, 1, (self.world - 1) * len(PARAMS)))

    def test_diverging_maps_float32(self):
        agreed = agreed_map(self.world)
        n = sum(1 for _, _, b in PARAMS if b in disagreeing_blocks(self.world))
        self.assertEqual(n, DISAGREEING_PARAMS[self.world])
        self.check_bucket("diverge_float32", "agreed_float32", n)
        low = sum(1 for f in agreed if f != "bf16")
        for r in range(self.world):
            c = self.py[r]["diverge_float32"]["counters"]
            self.assertEqual(c["wire_bytes"], self.want_bytes(agreed))
            self.assertEqual((c["collectives"], c["plain_allreduces"]), (low, 1))
            self.assertEqual(c["map_errors"], 0)
            numel = [int(np.prod(s)) for _, s, _ in PARAMS]
            self.assertEqual(c["elements_high"], sum(k for k, (_, _, b) in zip(numel, PARAMS)
                                                     if b is None or agreed[b] == "bf16"))
            self.assertEqual(c["bf16_bytes"], base.bf16_ring_bytes(sum(numel), self.world))

    def test_diverging_maps_bfloat16(self):
        n = DISAGREEING_PARAMS[self.world]
        self.check_bucket("diverge_bfloat16", "agreed_bfloat16", n)

    def test_agreed_low_parts_are_quantized(self):
        # The agreed map's result differs from the all-bf16 one: its low blocks really went low.
        self.assertNotEqual(self.py[0]["agreed_float32"]["bytes"], self.py[0]["all_bf16"]["bytes"])

    def test_unreadable_map(self):
        low_params = sum(1 for _, _, b in PARAMS if b is not None and AGREED[b] != "bf16")
        self.check_bucket("raising", "all_bf16", low_params)
        for r in range(self.world):
            self.assertEqual(self.py[r]["raising"]["counters"]["map_errors"], 1 if r == 1 else 0)

    def test_ddp_late_map_bit_identical(self):
        runs = [self.py[r]["ddp"] for r in range(self.world)]
        refs = [self.py[r]["ddp_ref"] for r in range(self.world)]
        changed = [b for b, (o, n) in enumerate(zip(OLD, NEW)) if o != n]
        self.assertEqual(changed, [0, 1])
        want = sum(runs[0]["block_params"][b] for b in changed)
        self.assertEqual(want, 4)
        for r in range(self.world):
            for step in range(STEPS):
                self.assertEqual(runs[r]["params"][step], runs[0]["params"][step],
                                 f"rank {r}'s parameters differ from rank 0's after step {step}")
                self.assertEqual(runs[r]["params"][step], refs[r]["params"][step],
                                 f"rank {r}, step {step}: differs from the run on the agreed map")
            c, w = dict(runs[r]["counters"]), dict(refs[r]["counters"])
            self.assertEqual(c.pop("map_disagreements"), want, f"rank {r}")
            self.assertEqual(w.pop("map_disagreements"), 0, f"rank {r}")
            self.assertEqual(c, w, f"rank {r}: counters against the agreed map's run")
            self.assertEqual(c["map_exchanges"], c["calls"])
            self.assertEqual(c["map_errors"], 0)
            self.assertTrue(all(np.isfinite(runs[r]["losses"])))
            self.assertLess(runs[r]["losses"][-1], runs[r]["losses"][0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--worker", type=int)
    ap.add_argument("--dir")
    args, rest = ap.parse_known_args()
    if args.worker is not None:
        worker(args.worker, args.ranks, args.dir)
        return
    MapDisagreement.world = args.ranks
    print(f"libprism: {prism.library_path()}; {args.ranks} gloo ranks", flush=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
