#!/usr/bin/python3
"""One rank of one configuration of the training-quality experiment (run.py starts them; see
README.md). Trains model.GPT data-parallel (torch DistributedDataParallel over gloo on this
machine) on corpus.py's training split, with or without Prism, with or without Prism's quantized
all-reduce hook, and writes what it measured as one JSON object to --out.

Every configuration sees the same thing: the same initial weights (--seed), the same batches in
the same order on each rank (a generator seeded by --seed and the rank), the same learning-rate
schedule, the same held-out windows at the same steps. Compute runs in BF16 (torch.autocast on
the CPU; parameters, gradients and the optimizer in FP32): that is the BF16 baseline. What a
configuration changes:

  --agent-dir DIR  Prism attached (prism.torch.attach) to the transformer blocks through the
                   prism-agent at DIR: at each step the map in effect quantizes the low blocks'
                   weights (Prism's block transfer: BF16 -> the low format -> BF16) for forward
                   and backward; the optimizer updates the full-precision weights (end_step puts
                   them back); gradient statistics go to prismd every step; calibration runs once
                   when prismd asks for it (from step --calibrate-at on). Which blocks are low is
                   prismd's business (its config: dynamic policy, or blocks forced low).
  --hook WIRE      DDP's gradient all-reduce replaced by prism.torch.quantized_allreduce_hook with
                   that wire format ("map": each block's format in the current map).

Held-out loss: the mean cross-entropy (nats per byte) of the model's full-precision weights (the
optimizer's; no block quantized) over --eval-windows fixed windows of the held-out split
(stratified by file: corpus.window_starts), split
between the ranks and summed exactly, at step 0 and every --eval-every steps and after the last.

Figures per step: the share of the blocks' BF16 bytes that the map in effect put low, and the
transfer saving that gives (50% of a low block's BF16 bytes, 75% for int4: prismd's
estimated_bandwidth_saving_pct), averaged over the steps. Wire bytes: the hook's counters, or,
without the hook, what DDP's FP32 ring all-reduce of every gradient sends per rank
(2 (W-1)/W x 4 bytes x parameters, each step) and what a BF16 one would (half)."""

import argparse
import faulthandler
import gc
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import corpus  # noqa: E402
from model import GPT  # noqa: E402

LOW_SAVING = {"int8": 0.5, "fp8_e4m3": 0.5, "fp8_e5m2": 0.5, "int4": 0.75}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the configuration's name (goes into --out)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dist-file", required=True, help="gloo's rendezvous file (a new path, the same for every rank)")
    ap.add_argument("--out", required=True, help="this rank's results (JSON)")
    ap.add_argument("--log", default=None, help="one JSON line per step (optional)")
    ap.add_argument("--agent-dir", default=None, help="attach Prism through the prism-agent of this directory")
    ap.add_argument("--job", default="train-quality", help="Prism's job id")
    ap.add_argument("--low", default="int8", help="the low format the model registers with (prismd's low_precision)")
    ap.add_argument("--hook", default=None, help="all-reduce gradients with Prism's hook in this wire format")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    ap.add_argument("--warmup-frac", type=float, default=0.05, help="linear warm-up, a fraction of --steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=512, help="held-out windows (split between the ranks)")
    ap.add_argument("--eval-batch", type=int, default=32)
    ap.add_argument("--calib-batch", type=int, default=8, help="sequences per calibration forward pass")
    ap.add_argument("--calibrate-at", type=int, default=0,
                    help="calibrate at the first step from this one at which prismd wants it (run.py: 10 steps "
                         "before the policy's first decision; an untrained model's blocks barely change the "
                         "residual stream, and their errors measure ~0)")
    ap.add_argument("--low-from", type=int, default=0,
                    help="blocks stay BF16 before this step whatever the map says (the map's weights are put "
                         "back to full precision before the forward pass; the static plans: prism-int8's first "
                         "step with a block low, so that they save over the same steps)")
    ap.add_argument("--max-files", type=int, default=None, help="only the first N files of each split")
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads per rank")
    ap.add_argument("--wait-map-at", type=int, default=-1,
                    help="at this step, wait (at most --wait-map-s) until a map from prismd is in effect "
                         "(the smoke test: a handful of steps must see one)")
    ap.add_argument("--wait-map-s", type=float, default=120.0,
                    help="the most seconds to wait for a map (--wait-map-at) and, with Prism, before step 0 "
                         "until the agent is connected to prismd (so that the first steps' reports are not "
                         "dropped)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1 or args.eval_windows < args.world:
        ap.error("--steps and --eval-every must be at least 1, --eval-windows at least --world")
    if args.hook is not None and args.world < 2:
        ap.error("--hook needs --world of at least 2")
    return args


def lr_at(args, step):
    """Linear warm-up over warmup_frac of the steps, then a cosine down to 10% of the peak."""
    warm = max(1, int(args.warmup_frac * args.steps))
    if step < warm:
        return args.lr * (step + 1) / warm
    t = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def autocast():
    return torch.autocast(device_type="cpu", dtype=torch.bfloat16)


def evaluate(model, windows, args):
    """The held-out loss: this rank's share of the windows, summed over the ranks exactly."""
    x, y = windows
    mine = range(args.rank, x.shape[0], args.world)
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad(), autocast():
        idx = list(mine)
        for i in range(0, len(idx), args.eval_batch):
            sel = idx[i:i + args.eval_batch]
            loss = model(x[sel], y[sel])
            total[0] += loss.double().item() * len(sel)
            total[1] += len(sel)
    if args.world > 1:
        dist.all_reduce(total)
    return float(total[0] / total[1])


def params_sha256(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def make_hook_state(args, pt):
    """The DDP hook's state (prism.torch.QuantizedAllReduceState), or a clear error when this
    prism.torch has none."""
    import prism.torch
    if not hasattr(prism.torch, "QuantizedAllReduceState"):
        raise SystemExit("train.py: --hook needs prism.torch.QuantizedAllReduceState (the DDP hook), "
                         "which this prism.torch does not have")
    kw = {"wire": args.hook}
    if args.hook == "map":
        if pt is None:
            raise SystemExit("train.py: --hook map needs --agent-dir (the map comes from Prism)")
        kw["attachment"] = pt
    return prism.torch.QuantizedAllReduceState(**kw)


def wait_for_agent(pt, timeout_s):
    """Polls the client until it is connected to its agent and the agent to prismd, at most
    timeout_s, so that the first steps' reports reach prismd (a report the agent cannot forward
    is dropped). Returns the seconds waited, or None."""
    t0 = time.monotonic()
    while True:
        pt.client.begin_step(0)
        st = pt.client.state()
        if st["connected"] and st["upstream_connected"]:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.02)


def hold_bf16(pt):
    """Undoes what begin_step applied: every block's full-precision weights back (--low-from). A
    compute plan (Linears patched low) would need undoing too; these runs have none, and a run
    that had one is refused rather than measured wrongly."""
    if pt.compute_low:
        raise SystemExit("train.py: --low-from with a compute plan in effect is not supported")
    pt._restore_weights()


def wait_for_map(pt, step, timeout_s):
    """Polls the client until a map (version >= 1) is in effect at `step`, at most timeout_s.
    Returns the seconds waited, or None when none came."""
    t0 = time.monotonic()
    while pt.client.begin_step(step) < 1:
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.02)
    return time.monotonic() - t0


def main(argv=None):
    args = parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # run.py asks a rank that overran where it is
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{os.path.abspath(args.dist_file)}", rank=args.rank,
                                world_size=args.world)
    train, held, held_spans, corpus_info = corpus.load(args.max_files)
    model = GPT(args.layers, args.width, args.heads, args.context)
    n_params = sum(p.numel() for p in model.parameters())
    block_numel = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    block_bytes = [2 * n for n in block_numel]  # BF16 bytes, as prism.torch reports them

    pt = None
    if args.agent_dir:
        import prism.torch
        pt = prism.torch.attach(model.blocks, job_id=args.job, rank=args.rank, world_size=args.world,
                                dir=args.agent_dir, model_id=f"train_quality-gpt-{args.layers}x{args.width}",
                                names=[f"blocks.{i}" for i in range(args.layers)], low_precision=args.low,
                                reconnect_interval_ms=200)
    ddp = DistributedDataParallel(model, broadcast_buffers=False) if args.world > 1 else model
    hook_state = None
    if args.hook:
        import prism.torch
        hook_state = make_hook_state(args, pt)
        ddp.register_comm_hook(hook_state, prism.torch.quantized_allreduce_hook)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed * 1000 + args.rank)
    calib_gen = torch.Generator().manual_seed(args.seed * 1000 + 500 + args.rank)
    windows = corpus.eval_windows(held, held_spans, args.eval_windows, args.context)
    log = open(args.log, "w", buffering=1) if args.log else None

    evals = [[0, evaluate(model, windows, args)]]
    train_loss, step_seconds = [], []
    low_share_sum = saving_sum = 0.0
    low_blocks_steps = 0
    calibration = None
    map_wait_s = None
    eval_seconds = 0.0
    finite = math.isfinite(evals[0][1])
    agent_wait_s = None
    if pt is not None:  # every run: the first steps' reports must reach prismd
        agent_wait_s = wait_for_agent(pt, args.wait_map_s)
    t_start = time.monotonic()
    for step in range(args.steps):
        if pt is not None and step == args.wait_map_at:
            map_wait_s = wait_for_map(pt, step, args.wait_map_s)
        t0 = time.monotonic()
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        precisions = ["bf16"] * args.layers
        if pt is not None:
            pt.begin_step(step)
            precisions = pt.precisions()
            if step < args.low_from:
                hold_bf16(pt)
                precisions = ["bf16"] * args.layers
        x, y = corpus.train_batch(train, gen, args.batch, args.context)
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = ddp(x, y)
        loss.backward()
        loss_value = loss.item()
        if pt is not None:
            pt.end_step(step, loss=loss_value)  # the gradients as they came out of the all-reduce
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step_seconds.append(time.monotonic() - t0)
        finite = finite and math.isfinite(loss_value)
        train_loss.append(loss_value)
        low = [i for i, p in enumerate(precisions) if p != "bf16"]
        low_blocks_steps += len(low)
        low_share_sum += sum(block_bytes[i] for i in low) / sum(block_bytes)
        saving_sum += sum(block_bytes[i] * LOW_SAVING[precisions[i]] for i in low) / sum(block_bytes)
        if pt is not None and calibration is None and step >= args.calibrate_at and pt.calibration_wanted():
            t_cal = time.monotonic()
            with autocast():
                by_format = pt.calibrate(lambda: model(*corpus.train_batch(train, calib_gen, args.calib_batch,
                                                                            args.context)[:1]))
            calibration = {"step": step, "seconds": time.monotonic() - t_cal,
                           "errors": {f: {str(b): e for b, e in sorted(errors.items())}
                                      for f, errors in by_format.items()}}
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            t_eval = time.monotonic()
            evals.append([step + 1, evaluate(model, windows, args)])
            eval_seconds += time.monotonic() - t_eval
            finite = finite and math.isfinite(evals[-1][1])
        if log:
            log.write(json.dumps({"step": step, "loss": loss_value, "precisions": precisions,
                                  "seconds": step_seconds[-1], "eval": evals[-1] if evals[-1][0] == step + 1
                                  else None}) + "\n")
    wall = time.monotonic() - t_start

    ring = 2 * (args.world - 1) / args.world
    if hook_state is not None:
        wire = {"mode": f"prism hook ({args.hook})", "wire_bytes": int(hook_state.wire_bytes),
                "bf16_bytes": int(hook_state.bf16_bytes), "calls": int(hook_state.calls)}
    else:
        wire = {"mode": "DDP FP32 ring all-reduce (computed)", "wire_bytes": int(ring * 4 * n_params * args.steps),
                "bf16_bytes": int(ring * 2 * n_params * args.steps), "calls": 0}
    warm = step_seconds[10:] if len(step_seconds) > 20 else step_seconds
    result = {
        "name": args.name, "rank": args.rank, "world": args.world, "steps": args.steps,
        "model": {"layers": args.layers, "width": args.width, "heads": args.heads, "context": args.context,
                  "params": n_params, "block_params": block_numel},
        "train": {"batch_per_rank": args.batch, "lr": args.lr, "warmup_frac": args.warmup_frac,
                  "weight_decay": args.weight_decay, "clip": args.clip, "seed": args.seed,
                  "tokens_per_step": args.batch * args.context * args.world, "low_from": args.low_from},
        "corpus": corpus_info,
        "prism": pt is not None, "low": args.low if pt is not None else None, "hook": args.hook,
        "evals": evals, "train_loss": train_loss, "finite": finite,
        "low_share": low_share_sum / args.steps, "transfer_saving_pct": 100.0 * saving_sum / args.steps,
        "low_block_steps": low_blocks_steps, "final_precisions": precisions,
        "step_seconds_mean": statistics.fmean(warm), "step_seconds_median": statistics.median(warm),
        "eval_seconds": eval_seconds, "wall_seconds": wall, "wire": wire, "calibration": calibration,
        "params_sha256": params_sha256(model),
    }
    if pt is not None:
        result.update(map_version=pt.map_version, map_wait_s=map_wait_s, agent_wait_s=agent_wait_s,
                      switches=[[s, v, p] for s, v, p in pt.switches], late_switches=pt.late_switches,
                      client_counters=pt.counters())
        pt.close()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)
    if log:
        log.close()
    # DDP (its reducer, holding the hook) goes before the process group: freed after it, as main's
    # locals are at return, it sometimes hung the rank at exit with the hook registered.
    del ddp, hook_state
    gc.collect()
    if args.world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
