#!/usr/bin/python3
"""What Prism's reporting adds to a training step (issue 5, bench/README.md "Reporting overhead").

A PyTorch model of --blocks residual blocks (Linear width x width) trains on the CPU (or --device
cuda). Each configuration runs --steps timed steps after --warmup untimed ones, interleaved in
rounds so that drift of the machine hits all of them alike:
  baseline   forward, backward, SGD: no Prism at all
  attached   the same step inside prism.torch's begin_step / end_step, with a real prism-agent and
             prismd (started here on loopback, in a scratch directory) and the policy in mode
             "off", so every block stays bf16 and the difference is the reporting alone: one
             hint-table read, the gradient statistics of every block (Prism's kernels), one
             StepReport on the agent's socket
  no agent   the same with no agent listening: statistics skipped, the report dropped and counted
It prints the median step time of each, the overhead (median of the per-round differences) in ms
and in percent of the baseline step, the median time of begin_step and end_step themselves, and
those two calls as a percentage of the baseline step ("calls %": the overhead measured directly,
which the step-time difference only resolves when it is larger than the step's own noise).

  /usr/bin/python3 bench/bench_report.py [--blocks 24] [--width 1024] [--batch 64] [--steps 60]
        [--build build-release] [--device cpu|cuda]
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

import prism.torch  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_file(path, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_report: {path} did not appear in {timeout_s} s")
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build-release"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    if not 1 <= args.blocks <= 4096 or not 1 <= args.width <= 16384 or args.steps < 3:
        raise SystemExit("bench_report: --blocks 1..4096, --width 1..16384, --steps >= 3")
    dev = torch.device(args.device)
    os.environ.setdefault("PRISM_LIBRARY", os.path.join(args.build, "lib", "libprism.so"))

    work = tempfile.mkdtemp(prefix="prism-bench-report-")
    procs = []
    try:
        config = os.path.join(work, "config.json")
        with open(config, "w") as f:
            json.dump({"mode": "off", "run_calibration": False}, f)
        grpc = f"127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen(
            [os.path.join(args.build, "service", "prismd"), "--grpc-listen", grpc, "--http-listen",
             f"127.0.0.1:{free_port()}", "--data-dir", os.path.join(work, "data"), "--config", config,
             "--log-level", "warn"]))
        shared = os.path.join(work, "agent")
        procs.append(subprocess.Popen(
            [os.path.join(args.build, "agent", "prism-agent"), "--prismd", grpc, "--dir", shared,
             "--metrics-listen", "off", "--device", "cpu", "--profile-budget-ms", "200", "--log-level", "warn"]))
        wait_file(os.path.join(shared, "prism-agent.sock"))

        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(args.width) for _ in range(args.blocks)]).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(args.batch, args.width, device=dev)
        attached = prism.torch.attach(list(model), job_id="bench", dir=shared, model_id="bench")
        lonely = prism.torch.attach(list(model), job_id="bench", dir=os.path.join(work, "nobody"), model_id="bench")

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize()

        def step(pt, i, parts):
            t0 = time.perf_counter()
            if pt:
                pt.begin_step(i)
            t1 = time.perf_counter()
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            if pt:
                pt.end_step(i, loss=loss.item())
            t3 = time.perf_counter()
            opt.step()
            sync()
            t4 = time.perf_counter()
            if parts is not None:
                parts.append((t1 - t0, t3 - t2))
            return t4 - t0

        times = {"baseline": [], "attached": [], "no agent": []}
        parts = {"attached": [], "no agent": []}
        runs = {"baseline": None, "attached": attached, "no agent": lonely}
        i = 0
        for _ in range(args.warmup):
            for pt in runs.values():
                step(pt, i, None)
                i += 1
        for _ in range(args.steps):
            for name, pt in runs.items():
                times[name].append(step(pt, i, parts.get(name)))
                i += 1
        counters = attached.counters()
        lost = lonely.counters()

        params = sum(p.numel() for p in model.parameters())
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        print(f"# bench_report: {args.blocks} blocks x Linear({args.width}) = {params / 1e6:.1f} M parameters, "
              f"batch {args.batch}, {args.steps} steps each, device {args.device}")
        print(f"# machine: {cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads")
        base = statistics.median(times["baseline"])
        print(f"{'config':<10} {'step ms':>9} {'overhead ms':>12} {'overhead %':>11} {'begin_step us':>14} "
              f"{'end_step us':>12} {'calls %':>8}")
        print(f"{'baseline':<10} {base * 1e3:9.3f}")
        for name in ("attached", "no agent"):
            med = statistics.median(times[name])
            over = statistics.median(t - b for t, b in zip(times[name], times["baseline"]))
            begin = statistics.median(p[0] for p in parts[name])
            end = statistics.median(p[1] for p in parts[name])
            print(f"{name:<10} {med * 1e3:9.3f} {over * 1e3:12.3f} {100 * over / base:11.2f} {begin * 1e6:14.1f} "
                  f"{end * 1e6:12.1f} {100 * (begin + end) / base:8.3f}")
        print(f"# attached: {counters['reports_sent']} reports sent, {counters['reports_dropped']} dropped; "
              f"no agent: {lost['reports_sent']} sent, {lost['reports_dropped']} dropped")
        attached.close()
        lonely.close()
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
