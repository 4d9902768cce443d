#!/usr/bin/python3
"""Writes the PLAN.json files of examples/hybrid/ (issue 15, item 6): the paper's setting of
V100-32GB training GPUs beside T4-16GB inference GPUs, on a BERT-base-like model of 12 blocks and
a GPT-like model of 48 blocks, and (on request) a 1,000-block case for timing `prismctl plan`.

  make_plans.py [--out DIR]            v100-32gb.profile.json, t4-16gb.profile.json,
                                       bert12.plan.json, gpt48.plan.json into DIR (default: here)
  make_plans.py --big PATH [--blocks N] the N-block (default 1,000) case, two classes, into PATH

Everything is deterministic (a fixed seed for the statistics); see README.md for where each
figure comes from.
"""

import argparse
import json
import math
import os
import random

GB = 1024 ** 3

# Vendor datasheet figures (NVIDIA Tesla V100 and T4 datasheets): QSync's Table I could not be
# retrieved here, see README.md. Neither Volta nor Turing has BF16, so both run FP16 high.
V100 = {
    "device_class": "v100-32gb",
    "device_name": "Tesla V100-SXM2-32GB",
    "memory_bytes": 32 * GB,
    "bf16_ops_per_second": 0,
    "fp16_ops_per_second": 125e12,   # tensor cores, FP16 with FP32 accumulate
    "int8_ops_per_second": 62e12,    # no INT8 tensor cores: DP4A, 4 x 15.7 FP32 TFLOPS
    "fp8_ops_per_second": 0,
    # ~1.5 bytes moved per BF16 byte quantized (read 2, write 1) at 900 GB/s, + launches
    "quantize_cost": {"fixed_seconds": 10e-6, "seconds_per_byte": 1.7e-12},
    "cast_cost": {"fixed_seconds": 10e-6, "seconds_per_byte": 2.2e-12},
    "h2d_bytes_per_second": 12e9,
}
T4 = {
    "device_class": "t4-16gb",
    "device_name": "Tesla T4",
    "memory_bytes": 16 * GB,
    "bf16_ops_per_second": 0,
    "fp16_ops_per_second": 65e12,    # tensor cores, FP16
    "int8_ops_per_second": 130e12,   # tensor cores, INT8
    "fp8_ops_per_second": 0,
    # the same traffic at 320 GB/s
    "quantize_cost": {"fixed_seconds": 10e-6, "seconds_per_byte": 4.7e-12},
    "cast_cost": {"fixed_seconds": 10e-6, "seconds_per_byte": 6.3e-12},
    "h2d_bytes_per_second": 12e9,
}
# 25 GbE between the nodes: ring all-reduce of W bytes over 8 ranks moves 2·7/8·W per link, at
# ~90% of 3.125 GB/s line rate → an effective 1.6e9 bytes of W per second; 30 µs per message.
LINK = {"bytes_per_second": 1.6e9, "latency_seconds": 30e-6}


def transformer_blocks(layers, hidden, seq, batch, seed, heads=0, ffn_mult=4):
    """Blocks of a pre-LN transformer layer stack (attention + MLP per block).

    flops: forward of one micro-batch on one rank: 2·tokens·(4h² + 2·ffn·h) for the Linear
    layers plus 4·tokens·seq·h for the attention scores and their product with V.
    param_bytes_bf16: 2 bytes per parameter (weights and biases, two LayerNorms).
    activation_bytes_bf16: 34·s·b·h bytes (Korthikanti et al.'s count for a layer without
    recomputation), plus 5·a·s²·b for the attention scores when `heads` a is given (no flash
    attention).
    state_bytes: 16 bytes per parameter (BF16 weights and gradients, FP32 master copy and two
    Adam moments) — mixed-precision Adam, what no precision change touches.
    stats: X is the LayerNorm'd block input (≈ unit RMS, outlier features growing with depth),
    W the Linear weights (init std 0.02, grown a little by training), G their gradients
    (shrinking with depth); values drawn around those scales with a fixed seed.
    """
    rng = random.Random(seed)
    ffn = ffn_mult * hidden
    tokens = seq * batch
    params = 4 * hidden * hidden + 4 * hidden + 2 * hidden * ffn + ffn + hidden + 4 * hidden
    w_numel = 4 * hidden * hidden + 2 * hidden * ffn
    flops = 2 * tokens * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * tokens * seq * hidden
    blocks = []
    for i in range(layers):
        depth = (i + 1) / layers
        x_numel = tokens * hidden
        x_rms = rng.uniform(0.9, 1.1)
        w_std = 0.02 * rng.uniform(1.0, 1.6)
        g_rms = 2e-6 * rng.uniform(0.5, 2.0) / (0.5 + depth)
        blocks.append({
            "id": i,
            "name": f"layers.{i}",
            "flops": float(flops),
            "param_bytes_bf16": 2 * params,
            "activation_bytes_bf16": 34 * seq * batch * hidden + 5 * heads * seq * seq * batch,
            "state_bytes": 16 * params,
            "stats": {
                "x_l2": x_rms * math.sqrt(x_numel),
                "x_max_abs": rng.uniform(6.0, 12.0) * (1 + 3 * depth),
                "x_numel": x_numel,
                "w_l2": w_std * math.sqrt(w_numel),
                "w_max_abs": w_std * rng.uniform(4.5, 9.0),
                "w_numel": w_numel,
                "g_l2": g_rms * math.sqrt(w_numel),
                "g_max_abs": g_rms * rng.uniform(20.0, 80.0),
                "y_numel": tokens * hidden,
            },
        })
    return blocks


def plan_doc(blocks, v100_ranks=4, t4_ranks=4):
    return {
        "blocks": blocks,
        "classes": [
            {"name": "v100-32gb", "ranks": v100_ranks, "profile": V100},
            {"name": "t4-16gb", "ranks": t4_ranks, "profile": T4},
        ],
        "link": LINK,
        "config": {"memory_fraction": 0.9, "gamma": 4, "low_format": "auto",
                   "force_bf16_blocks": [0]},
    }


def write(path, doc, indent=1):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=indent)
        fh.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--big")
    ap.add_argument("--blocks", type=int, default=1000)
    args = ap.parse_args()
    if args.big:
        # 1,000 narrow blocks (hidden 128, micro-batch 2 x 128 tokens): a deep model whose
        # T4 start fits 14.4 GiB, so every block is tried as a raise.
        doc = plan_doc(transformer_blocks(args.blocks, 128, 128, 2, seed=1000))
        write(args.big, doc, indent=None)
        return
    write(os.path.join(args.out, "v100-32gb.profile.json"), V100)
    write(os.path.join(args.out, "t4-16gb.profile.json"), T4)
    # BERT-base: 12 layers, hidden 768, FFN 3072, sequence 128, micro-batch 32 per rank.
    write(os.path.join(args.out, "bert12.plan.json"),
          plan_doc(transformer_blocks(12, 768, 128, 32, seed=12)))
    # GPT-like: 48 layers, hidden 768, 12 heads (GPT-2-small width, 48 deep: ~340M parameters),
    # sequence 1024, micro-batch 3 per rank, attention scores stored (no flash attention): the
    # T4's 16 GiB holds the start (INT8 activations) but not every block at FP16.
    write(os.path.join(args.out, "gpt48.plan.json"),
          plan_doc(transformer_blocks(48, 768, 1024, 3, seed=48, heads=12)))


if __name__ == "__main__":
    main()
