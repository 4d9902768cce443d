#!/usr/bin/python3
"""Writes the replay benchmark's JSONL trace (bench/bench_replay.sh): BLOCKS blocks x STEPS steps
from RANKS ranks, deterministic for a seed.

The trace opens with a layout line (BF16 sizes from 4 KiB to 8 MiB) and, before step 20, an int8
calibration line for every tenth block. Each block has a base gradient norm spread over three
decades; a quarter of the blocks drift (their norm grows or shrinks tenfold over the run) so that
decisions really switch blocks, and every rank's figures carry a few percent of noise. Every
line holds one rank's report of one step with all the figures an agent sends (mean, variance,
nonfinite included), written as Python writes floats (the shortest text that reads back
exactly), so a line of 10,000 blocks is about 1 MB, as a real agent's trace line is.

Usage: replay_trace_gen.py OUT.jsonl [--blocks N] [--steps N] [--ranks N] [--seed N]
"""

import argparse
import random
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--blocks", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seed", type=int, default=16)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    base = [10 ** rng.uniform(-2, 1) for _ in range(a.blocks)]
    drift = [rng.choice((0.1, 1.0, 1.0, 10.0)) if i % 4 == 0 else 1.0 for i in range(a.blocks)]
    sizes = [4096 * (1 << rng.randrange(0, 12)) for _ in range(a.blocks)]
    with open(a.out, "w") as f:
        layout = ", ".join('{"id": %d, "name": "block.%d", "param_bytes_bf16": %d}' % (i, i, sizes[i])
                           for i in range(a.blocks))
        f.write('{"layout": {"blocks": [%s]}}\n' % layout)
        for step in range(1, a.steps + 1):
            if step == 20:
                errors = ", ".join('"%d": %r' % (i, rng.uniform(0.001, 0.1)) for i in range(0, a.blocks, 10))
                f.write('{"calibration": {"format": "int8", "errors": {%s}}}\n' % errors)
            t = (step - 1) / max(a.steps - 1, 1)
            for rank in range(a.ranks):
                parts = []
                for i in range(a.blocks):
                    l2 = base[i] * drift[i] ** t * rng.uniform(0.97, 1.03)
                    numel = sizes[i] // 2
                    parts.append('{"id": %d, "l2": %r, "max_abs": %r, "mean": %r, "variance": %r, '
                                 '"numel": %d, "nonfinite": 0}'
                                 % (i, l2, l2 / 8, rng.uniform(-1e-4, 1e-4), (l2 * l2) / numel, numel))
                loss = 4.0 * 0.98 ** step + rng.uniform(-0.01, 0.01)
                f.write('{"step": %d, "rank": %d, "loss": %r, "blocks": [%s]}\n'
                        % (step, rank, loss, ", ".join(parts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
