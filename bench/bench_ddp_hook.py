#!/usr/bin/python3
"""Time prism.torch's quantized all-reduce (the DDP hook's, python/prism/ddp.py) against the
group's plain float32 all_reduce, on P gloo ranks on loopback, for one bucket of N float32
gradients (default 6,553,600: DDP's default 25 MiB bucket). Prints one line per method: the mean
time of a call (after one warm-up call), the payload bytes one rank sends and their ratio to a
BF16 ring all-reduce of the same elements.

    PRISM_LIBRARY=build/lib/libprism.so /usr/bin/python3 bench/bench_ddp_hook.py --ranks 2

Napkin math: on loopback the wire is nearly free, so the times are compute: the Prism all-reduce
quantizes N elements, sums N elements' codes (its slice from every rank), requantizes N/P and
dequantizes N, each a pass of libprism's CPU kernels; the plain all_reduce adds N floats per
rank and copies. On a real network the bytes decide: the ratios are 2 (P-1)/P N (B + 4/256)
against 2 (P-1)/P N x 2 for BF16 (B = 1 byte, int4 1/2): 0.508, 0.258, and 2.0 for float32."""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def worker(rank, world, store_path, n, reps):
    import torch
    import torch.distributed as dist
    import prism.torch as pt
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    bf16 = 4 * n * (world - 1) // world

    def timed(call):
        call()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        dist.barrier()
        return (time.perf_counter() - t0) / reps * 1e3

    rows = [("float32 all_reduce", timed(lambda: dist.all_reduce(x.clone())), 2 * (world - 1) * n * 4 // world)]
    for wire in ("int8", "fp8_e4m3", "fp8_e5m2", "int4"):
        sent = []
        ms = timed(lambda: sent.append(pt.quantized_allreduce([x.clone()], wire)["bytes_sent"]))
        rows.append((f"prism {wire}", ms, sent[-1]))
    copy_ms = timed(lambda: x.clone())
    if rank == 0:
        print(f"{world} gloo ranks, {n} float32 elements per bucket, {reps} calls each "
              f"(clone of the input: {copy_ms:.1f} ms, included)")
        print(f"{'method':20s} {'ms/call':>9s} {'bytes sent':>12s} {'vs BF16':>8s}")
        for name, ms, sent in rows:
            print(f"{name:20s} {ms:9.1f} {sent:12d} {sent / bf16:8.3f}")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--numel", type=int, default=6_553_600)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        worker(a.worker, a.ranks, a.store, a.numel, a.reps)
        return
    with tempfile.TemporaryDirectory() as d:
        args = [sys.executable, os.path.abspath(__file__), "--ranks", str(a.ranks), "--numel", str(a.numel),
                "--reps", str(a.reps), "--store", os.path.join(d, "store")]
        procs = [subprocess.Popen(args + ["--worker", str(r)]) for r in range(a.ranks)]
        codes = [p.wait(timeout=600) for p in procs]
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
