#!/usr/bin/python3
"""bench/bench_replay.sh's three replays agree on a small trace of the benchmark's kind: the
plain-Python reference (bench/replay_reference.py), prismctl replay of the JSONL trace and of its
binary form (--record) print the same telemetry byte for byte, under the benchmark's config and
under the defaults. Keeps the reference, the generator and the benchmark honest in CI."""

import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ["PRISM_BUILD_DIR"]
PRISMCTL = os.path.join(BUILD, "service", "prismctl")
PY = "/usr/bin/python3"


def run(cmd):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if res.returncode != 0:
        sys.exit("FAIL: %s exited %d: %s" % (" ".join(cmd), res.returncode, res.stderr.decode()))
    return res.stdout


def main():
    with tempfile.TemporaryDirectory(prefix="prism-replay-ref-") as d:
        trace = os.path.join(d, "t.jsonl")
        binary = os.path.join(d, "t.ptrace")
        run([PY, os.path.join(SRC, "bench", "replay_trace_gen.py"), trace, "--blocks", "300", "--steps", "40",
             "--ranks", "2", "--seed", "5"])
        cfg = os.path.join(d, "c.json")
        with open(cfg, "w") as f:
            f.write('{"warmup_steps": 10, "update_interval_steps": 5, "min_steps_between_switches": 10}')
        for config in ([], ["--config", cfg]):
            ref = run([PY, os.path.join(SRC, "bench", "replay_reference.py"), trace, "--world-size", "2",
                       "--timestamp", "1700000000"] + config)
            jsonl = run([PRISMCTL, "replay", "--world-size", "2", "--timestamp", "1700000000", "--record", binary]
                        + config + [trace])
            binary_out = run([PRISMCTL, "replay", "--timestamp", "1700000000", binary])
            lines = ref.count(b"\n")
            changes = ref.count(b'"precision_changes":0,')
            print("config %s: %d records, %d bytes, %d without changes" % (config or "defaults", lines, len(ref),
                                                                            changes))
            if lines < 4 or changes == lines:
                sys.exit("FAIL: the trace should make several decisions that switch blocks")
            if jsonl != ref:
                sys.exit("FAIL: prismctl replay of the JSONL trace differs from the reference")
            if binary_out != ref:
                sys.exit("FAIL: prismctl replay of the binary trace differs from the reference")
    print("ok")


if __name__ == "__main__":
    main()
