#!/usr/bin/python3
"""A small data-parallel training job with Prism attached: the trainer of scripts/demo.sh and of
tests/integration/test_agents.py.

Each rank trains the same residual MLP of --blocks blocks on its own synthetic batches, averages
gradients with torch.distributed (gloo over 127.0.0.1), and runs Prism around each step:
begin_step (the map in effect, applied to the weights), end_step (gradient statistics to the
agent), and calibration when prismd asks for it. Block i's branch is scaled by 2^-i, so the
blocks' gradients differ by orders of magnitude and the policy has something to decide; with
--shift-step S the scales turn around at step S (block i gets 2^-(blocks-1-i)), so quiet blocks
become sensitive and the map changes again, both ways, past the policy's hysteresis.

With --hybrid (DESIGN 11) the layout carries each block's forward FLOPs and activation bytes,
measured by one forward pass at attach (prism.torch's profile_forward), and every
--tensor-stats-every steps the reports carry the blocks' weight and input statistics; the blocks
that the compute plan of the map in use puts low run their Linears in the low format.

Every step appends one JSON line to --log: step, loss, map_version, effective_step, the block
precisions, whether the client is connected, and the compute plan's part: compute_low (the ids
of the blocks that ran low in that step) and plan_map_version (the map the plan came with, 0:
none). At the end it prints a summary line (JSON) with the client's counters and the switches
it saw."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import prism.torch  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width, scale):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.scale = scale  # a plain attribute: --shift-step changes it mid-run

    def forward(self, x):
        return x + self.scale * torch.tanh(self.fc(x))


class Model(torch.nn.Module):
    def __init__(self, blocks, width):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(width, 2.0 ** -i) for i in range(blocks))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", default="demo", help="job id (default demo)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1, help="ranks of the job (default 1)")
    ap.add_argument("--dir", default=".", help="the directory shared with this rank's prism-agent")
    ap.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    ap.add_argument("--step-ms", type=float, default=50, help="least time per step, in ms (default 50)")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--dist-port", type=int, default=29500, help="gloo rendezvous port on 127.0.0.1")
    ap.add_argument("--dist-file", default=None,
                    help="rendezvous through this file instead of --dist-port (a path that does not exist "
                         "yet, the same for every rank: no port to pick, none to collide)")
    ap.add_argument("--log", default=None, help="JSON lines, one per step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shift-step", type=int, default=-1, help="turn the blocks' scales around at this step")
    ap.add_argument("--hybrid", action="store_true",
                    help="measure the blocks' FLOPs and activation bytes at attach and send weight and input "
                         "statistics (for prismd's hybrid plans)")
    ap.add_argument("--tensor-stats-every", type=int, default=5,
                    help="with --hybrid: send the statistics every N steps (default 5; use the job's "
                         "update_interval_steps)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    if args.world > 1:
        init = (f"file://{os.path.abspath(args.dist_file)}" if args.dist_file
                else f"tcp://127.0.0.1:{args.dist_port}")
        dist.init_process_group("gloo", init_method=init, rank=args.rank, world_size=args.world)
    model = Model(args.blocks, args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hybrid = {}
    if args.hybrid:
        if args.tensor_stats_every < 1:
            ap.error("--tensor-stats-every: must be at least 1")
        probe = torch.Generator().manual_seed(9)  # its own generator: the training batches stay the same
        hybrid = dict(profile_forward=lambda: model(torch.randn(32, args.width, generator=probe)),
                      tensor_stats_every=args.tensor_stats_every)
    pt = prism.torch.attach(model.layers, job_id=args.job, rank=args.rank, world_size=args.world, dir=args.dir,
                            model_id=f"train_demo-{args.blocks}x{args.width}",
                            names=[f"layers.{i}" for i in range(args.blocks)], reconnect_interval_ms=200, **hybrid)
    gen = torch.Generator().manual_seed(1000 + args.rank)
    target_w = torch.randn(args.width, 1, generator=torch.Generator().manual_seed(7))
    log = open(args.log, "a", buffering=1) if args.log else None
    calibrations = 0
    for step in range(args.steps):
        t0 = time.monotonic()
        if step == args.shift_step:
            for i, layer in enumerate(model.layers):
                layer.scale = 2.0 ** -(args.blocks - 1 - i)
        version = pt.begin_step(step)
        x = torch.randn(32, args.width, generator=gen)
        y = x @ target_w
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if args.world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= args.world
        pt.end_step(step, loss=loss.item())
        opt.step()
        if pt.calibration_wanted() and calibrations == 0:
            calib = torch.Generator().manual_seed(5)
            pt.calibrate(lambda: model(torch.randn(32, args.width, generator=calib)))
            calibrations += 1
        state = pt.client.state()
        if log:
            log.write(json.dumps({"step": step, "loss": loss.item(), "map_version": version,
                                  "effective_step": state["effective_step"], "precisions": pt.precisions(),
                                  "connected": state["connected"], "upstream": state["upstream_connected"],
                                  "compute_low": pt.compute_low_blocks(),
                                  "plan_map_version": pt.plan_map_version}) + "\n")
        left = args.step_ms / 1000 - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
    summary = {"rank": args.rank, "steps": args.steps, "map_version": pt.map_version,
               "late_switches": pt.late_switches, "calibrations": calibrations,
               "switches": [[s, v] for s, v, _ in pt.switches], "counters": pt.counters()}
    print(json.dumps(summary), flush=True)
    pt.close()
    if args.world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
