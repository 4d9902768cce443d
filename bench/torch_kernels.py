#!/usr/bin/python3
"""The PyTorch side of `prism-bench kernels`: each Prism kernel written as a PyTorch user would
write it in eager mode, timed on the same inputs (bf16, 1 MiB to 1 GiB), one line per kernel and
size: "kernel device mib seconds" (the median of the runs). prism-bench runs this script and
prints its figures beside Prism's.

Torch releases without FP8 dtypes (Debian 12 has 1.13) get FP8 rounding written with frexp/ldexp,
which is what such a user would do there; with torch.float8_e4m3fn the native cast is used."""
import argparse
import os
import sys
import time

import torch

KERNELS = [
    "grad_stats",
    "quantize_int8_block128",
    "quantize_fp8_e4m3_row4096",
    "quantize_fp8_e5m2_tensor",
    "quantize_int4_block128",
    "quantize_int8_block128_stochastic",
    "dequantize_int8_block128",
    "dequantize_fp8_e4m3_row4096",
    "dequantize_accumulate_int8_block128",
    "relative_error",
]

FP8 = {"e4m3": (448.0, 3, -9, "float8_e4m3fn"), "e5m2": (57344.0, 2, -16, "float8_e5m2")}


def scale_of(amax, qmax):
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def to_fp8(v, kind):
    qmax, mbits, min_exp, native = FP8[kind]
    if hasattr(torch, native):
        return v.clamp(-qmax, qmax).to(getattr(torch, native))
    _, e = torch.frexp(v)
    ulp = torch.ldexp(torch.ones_like(v), (e - 1 - mbits).clamp(min=min_exp))
    return (torch.round(v / ulp) * ulp).clamp(-qmax, qmax)


def grad_stats(x):
    xf = x.float()
    finite = torch.isfinite(xf)
    var, mean = torch.var_mean(xf, unbiased=False)
    return torch.linalg.vector_norm(xf), xf.abs().amax(), mean, var, (~finite).sum()


def quantize_groups(x, group, qmax):
    xf = x.float().view(-1, group)
    s = scale_of(xf.abs().amax(dim=1, keepdim=True), qmax)
    return xf / s, s


def quantize_int8_block128(x, stochastic=False):
    v, s = quantize_groups(x, 128, 127.0)
    q = torch.floor(v + torch.rand_like(v)) if stochastic else torch.round(v)
    return q.clamp_(-127, 127).to(torch.int8), s


def quantize_int4_block128(x):
    v, s = quantize_groups(x, 128, 7.0)
    q = torch.round(v).clamp_(-7, 7).to(torch.int8).view(-1)
    return (q[0::2] & 0xF) | (q[1::2] << 4), s


def quantize_fp8_e4m3_row4096(x):
    v, s = quantize_groups(x, 4096, 448.0)
    return to_fp8(v, "e4m3"), s


def quantize_fp8_e5m2_tensor(x):
    xf = x.float()
    s = scale_of(xf.abs().amax(), 57344.0)
    return to_fp8(xf / s, "e5m2"), s


def make_case(name, x, y):
    """The function to time for a kernel, with its inputs prepared (codes for the dequantizers)."""
    if name == "grad_stats":
        return lambda: grad_stats(x)
    if name == "quantize_int8_block128":
        return lambda: quantize_int8_block128(x)
    if name == "quantize_int8_block128_stochastic":
        return lambda: quantize_int8_block128(x, stochastic=True)
    if name == "quantize_int4_block128":
        return lambda: quantize_int4_block128(x)
    if name == "quantize_fp8_e4m3_row4096":
        return lambda: quantize_fp8_e4m3_row4096(x)
    if name == "quantize_fp8_e5m2_tensor":
        return lambda: quantize_fp8_e5m2_tensor(x)
    if name == "dequantize_int8_block128":
        q, s = quantize_int8_block128(x)
        q = q.view(-1, 128)
        return lambda: (q.float() * s).to(torch.bfloat16)
    if name == "dequantize_fp8_e4m3_row4096":
        q, s = quantize_fp8_e4m3_row4096(x)
        return lambda: (q.float() * s).to(torch.bfloat16)
    if name == "dequantize_accumulate_int8_block128":
        q, s = quantize_int8_block128(x)
        q = q.view(-1, 128)
        acc = torch.zeros(q.shape, dtype=torch.float32, device=x.device)
        return lambda: acc.add_(q.float() * s)
    if name == "relative_error":
        return lambda: torch.linalg.vector_norm(x.float() - y.float()) / torch.linalg.vector_norm(x.float())
    raise ValueError(name)


def median_seconds(fn, device, budget):
    def once():
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    first = once()
    reps = max(3, min(50, int(budget / first) if first > 0 else 50))
    times = sorted(once() for _ in range(reps))
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--min-mib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--kernel", default=None, help="only kernels whose name contains this")
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_kernels.py: torch has no CUDA device here", file=sys.stderr)
        return 0
    torch.set_num_threads(os.cpu_count() or 1)
    mib = args.min_mib
    while mib <= args.max_mib:
        n = mib * (1 << 20) // 2
        g = torch.Generator().manual_seed(12345)
        x = ((torch.rand(n, generator=g) - 0.5) * 0.02).to(torch.bfloat16).to(args.device)
        y = (x.float() * 1.01).to(torch.bfloat16)
        for name in KERNELS:
            if args.kernel and args.kernel not in name:
                continue
            seconds = median_seconds(make_case(name, x, y), args.device, args.seconds)
            print(f"{name} {args.device} {mib} {seconds:.9f}", flush=True)
        del x, y
        mib *= 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
