#!/usr/bin/python3
"""Differential test of `prismctl plan` against the independent Python reference (plan_ref.py).

Generates CASES bounded random PLAN.json files from a fixed seed (1-60 blocks, 1-4 classes with
distinct names in random order, int8 / fp8_e4m3 / auto / absent low formats, fp16-high classes,
fixed_classes given, empty or defaulted with ties of the largest high throughput,
force_bf16_blocks, Δ ties from identical classes and all-zero statistics, power-of-two
statistics on frexp's boundaries, budgets that make raises fail for memory, links and speeds that
make them fail for time, and starts that do not fit: exit 1), runs
$PRISM_BUILD_DIR/service/prismctl plan FILE and the reference on each, and asserts the same exit
status and, on success, equal JSON objects: the same keys in the same order, the same strings and
booleans, and every number equal to the last bit (float.hex). On a mismatch it keeps the case
file, prints its path, the path of the first differing value and both values, and goes on to
count every disagreeing case.

Then 39 bad PLANs (a small valid PLAN with one key added, deleted or given a bad value: every
level's unknown keys, missing keys, negative, zero and non-integer values, duplicate ids and
class names, formats whose throughput is 0, unknown fixed classes and forced blocks): both sides
must refuse each with exit 2 and nothing on stdout; the reference must name the expected key,
and where prismctl's `prismctl plan: FILE: KEY: PROBLEM` names another key that is printed as a
note (the texts fix only a few key spellings).

Usage: test_plan_differential.py [--cases N] [--seed S] [--keep DIR]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_ref  # noqa: E402

NAMES = ["t4", "v100", "a100", "l4", "h100", "T4-b", "mi50", "x"]


def pick_value(rng, scale):
    """A positive statistic: often a power of two (frexp boundaries), else a random double."""
    r = rng.random()
    if r < 0.3:
        return float(2 ** rng.randint(-12, 12))
    if r < 0.4:
        return float(rng.randint(1, 64))
    return rng.uniform(0.001, 1.0) * scale


def gen_stats(rng):
    if rng.random() < 0.08:  # all-zero statistics: ω = 0 in every format, Δ ties by block id
        return {"x_l2": 0, "x_max_abs": 0, "x_numel": rng.randint(1, 4096), "w_l2": 0,
                "w_max_abs": 0, "w_numel": rng.randint(1, 4096), "g_l2": 0, "g_max_abs": 0,
                "y_numel": rng.randint(0, 4096)}
    x_numel = rng.choice([1, 4, 16, 256, 4096, rng.randint(1, 1 << 22)])
    w_numel = rng.choice([1, 16, 1024, 1 << 20, rng.randint(1, 1 << 24)])
    y_numel = rng.choice([0, 1, 64, x_numel, rng.randint(1, 1 << 22)])
    s = {
        "x_l2": pick_value(rng, 1000.0), "x_max_abs": pick_value(rng, 20.0), "x_numel": x_numel,
        "w_l2": pick_value(rng, 100.0), "w_max_abs": pick_value(rng, 2.0), "w_numel": w_numel,
        "g_l2": pick_value(rng, 1.0), "g_max_abs": pick_value(rng, 0.1), "y_numel": y_numel,
    }
    if rng.random() < 0.2:  # √(nX/DX) exactly a power of two
        s["x_l2"] = float(x_numel) * float(4 ** rng.randint(-6, 6))
    if rng.random() < 0.1:
        s["g_max_abs"] = 0
    if rng.random() < 0.05:  # subnormal and tiny values: frexp exponents far below −5
        s[rng.choice(["x_l2", "w_l2", "g_max_abs"])] = rng.choice([5e-324, 1e-310, 2.0 ** -1000])
    if rng.random() < 0.05:
        s["x_max_abs"] = 0  # SX = 0 in the integer formula
    return s


def gen_block(rng, i):
    width = rng.choice([64, 256, 768, 1024, 4096])
    params = width * width * rng.randint(1, 12)
    b = {
        "id": i, "name": f"block.{i}",
        "flops": float(2 * params * rng.choice([1, 128, 512, 2048])) * rng.choice([1, 1.5]),
        "param_bytes_bf16": 2 * params,
        "activation_bytes_bf16": width * 2 * rng.choice([128, 512, 4096]) * rng.randint(1, 16),
        "state_bytes": 16 * params if rng.random() < 0.9 else rng.randint(0, 10 ** 6),
        "stats": gen_stats(rng),
    }
    if rng.random() < 0.05:  # empty blocks: no flops, or no bytes of some kind
        b[rng.choice(["flops", "param_bytes_bf16", "activation_bytes_bf16", "state_bytes"])] = 0
    return b


def gen_profile(rng, fp8_needed, int8_needed):
    fp16 = rng.choice([1e12, 2e12, 8e12, 65e12, 125e12, rng.uniform(1e12, 1e14)])
    prof = {"memory_bytes": 0, "fp16_ops_per_second": fp16,
            "quantize_cost": {"fixed_seconds": rng.choice([0, 1e-6, 5e-6, rng.uniform(0, 1e-4)]),
                              "seconds_per_byte": rng.choice([0, 1e-12, rng.uniform(0, 1e-10)])}}
    if rng.random() < 0.6:
        prof["bf16_ops_per_second"] = fp16 * rng.choice([1, 1, 2, 0.5])
    int8 = fp16 * rng.choice([0.5, 1, 2, 4, 8])
    if int8_needed or rng.random() < 0.7:
        prof["int8_ops_per_second"] = int8
    if fp8_needed or rng.random() < 0.4:
        prof["fp8_ops_per_second"] = fp16 * rng.choice([0.5, 1, 2, 4])
    if rng.random() < 0.1:
        prof["device_class"] = "dc"
        prof["device_name"] = "Some GPU"
        prof["cast_cost"] = {"fixed_seconds": 0, "seconds_per_byte": 0}
        prof["h2d_bytes_per_second"] = 1e10
    if rng.random() < 0.15 and "fp8_ops_per_second" not in prof and "int8_ops_per_second" in prof:
        prof["fp8_ops_per_second"] = 0
    return prof


def mem_of(blocks, low_ids):
    m = 0.0
    for b in sorted(blocks, key=lambda b: b["id"]):
        bits = 8.0 if b["id"] in low_ids else 16.0
        m += b["state_bytes"] + (b["activation_bytes_bf16"] * bits) / 16
    return m


def gen_case(rng):
    L = rng.randint(1, 60)
    blocks = []
    for i in range(L):
        if blocks and rng.random() < 0.15:  # a duplicate of an earlier block (same F, W, A, S)
            b = json.loads(json.dumps(rng.choice(blocks)))
            b["id"] = i
            b["name"] = f"block.{i}"
        else:
            b = gen_block(rng, i)
        blocks.append(b)
    if rng.random() < 0.5:
        rng.shuffle(blocks)  # ids are dense but the file may give them in any order

    K = rng.randint(1, 4)
    names = rng.sample(NAMES, K)
    low_format = rng.choice(["int8", "fp8_e4m3", "auto", None])
    config = {}
    if low_format is not None:
        config["low_format"] = low_format
    classes = []
    for n in range(K):
        prof = gen_profile(rng, low_format == "fp8_e4m3", True)
        if classes and rng.random() < 0.25:  # an identical class: Δ ties across classes
            prof = json.loads(json.dumps(classes[rng.randrange(len(classes))]["profile"]))
        classes.append({"name": names[n], "ranks": rng.randint(1, 8), "profile": prof})

    if rng.random() < 0.15:
        config["gamma"] = rng.choice([0, 1, 4.5, 16])
    if rng.random() < 0.3:
        config["memory_fraction"] = rng.choice([1, 0.5, 0.8, rng.uniform(0.1, 1)])
    frac = config.get("memory_fraction", 0.9)
    fixed_mode = rng.random()
    if fixed_mode < 0.25:
        config["fixed_classes"] = rng.sample(names, rng.randint(0, K))
    force = []
    if rng.random() < 0.3:
        force = rng.sample(range(L), rng.randint(0, min(L, 5)))
        config["force_bf16_blocks"] = force

    # Budgets: per class, somewhere between too small for the start and room for all high.
    m_start = mem_of(blocks, set(range(L)) - set(force))
    m_high = mem_of(blocks, set())
    for c in classes:
        r = rng.random()
        if r < 0.04:
            need = m_start * rng.uniform(0.5, 0.999)  # the start does not fit (if not fixed)
        elif r < 0.45:
            need = rng.uniform(m_start, m_high)  # raises stop for memory
        else:
            need = m_high * rng.uniform(1.0, 3.0)
        c["profile"]["memory_bytes"] = int(need / frac) + rng.randint(0, 3)

    link = {"bytes_per_second": rng.choice([1e9, 1.25e10, 5e10, rng.uniform(1e8, 1e11)]),
            "latency_seconds": rng.choice([0, 1e-5, 5e-5, rng.uniform(0, 1e-3)])}
    doc = {"blocks": blocks, "classes": classes, "link": link}
    if config or rng.random() < 0.5:
        doc["config"] = config
    return doc


def first_difference(a, b, path="$"):
    """The path and values of the first difference (numbers by float.hex), or None."""
    if isinstance(a, bool) or isinstance(b, bool):
        if a is b:
            return None
        return path, a, b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if float(a).hex() == float(b).hex():
            return None
        return path, f"{a!r} ({float(a).hex()})", f"{b!r} ({float(b).hex()})"
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a.keys()) != list(b.keys()):
            return path + " (keys)", list(a.keys()), list(b.keys())
        for k in a:
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for n, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{n}]")
            if d:
                return d
        if len(a) != len(b):
            return path + " (length)", len(a), len(b)
        return None
    if type(a) is type(b) and a == b:
        return None
    return path, a, b


def run_case(prismctl, path, doc):
    """Returns None when prismctl and the reference agree, else a description."""
    try:
        want = plan_ref.plan(doc)
        want_rc = 0
        refused = None
    except plan_ref.StartRefused as e:
        want, want_rc, refused = None, 1, e
    except plan_ref.PlanError as e:
        return f"generator made a bad case: {e.key}: {e.problem}"
    proc = subprocess.run([prismctl, "plan", path], capture_output=True, text=True, timeout=60)
    if proc.returncode != want_rc:
        return (f"exit status: prismctl {proc.returncode}, reference {want_rc}\n"
                f"  prismctl stderr: {proc.stderr.strip()}\n"
                f"  reference: {refused if refused else 'a plan'}")
    if want_rc == 1:
        if proc.stdout:
            return f"exit 1 with output on stdout: {proc.stdout[:200]!r}"
        want_msg = f"prismctl plan: {refused}\n"
        if proc.stderr != want_msg:
            return f"refusal message: prismctl {proc.stderr!r}, reference {want_msg!r}"
        return None
    if not proc.stdout.endswith("\n") or proc.stdout.count("\n") != 1:
        return f"output is not one line and a newline: {proc.stdout[:200]!r}"
    try:
        got = json.loads(proc.stdout)
    except ValueError as e:
        return f"output is not JSON: {e}: {proc.stdout[:200]!r}"
    d = first_difference(got, want)
    if d:
        return f"first difference at {d[0]}:\n  prismctl:  {d[1]}\n  reference: {d[2]}"
    return None


def base_doc():
    """A small valid PLAN the bad-input cases mutate: 3 blocks, a fixed and a non-fixed class."""
    rng = random.Random(7)
    blocks = [gen_block(rng, i) for i in range(3)]
    for b in blocks:
        b["stats"] = {"x_l2": 4.0, "x_max_abs": 1.0, "x_numel": 4, "w_l2": 16.0,
                      "w_max_abs": 2.0, "w_numel": 16, "g_l2": 1.0, "g_max_abs": 0.5,
                      "y_numel": 8}
    q = {"fixed_seconds": 1e-6, "seconds_per_byte": 1e-12}
    return {
        "blocks": blocks,
        "classes": [
            {"name": "fast", "ranks": 2, "profile": {
                "memory_bytes": 10 ** 12, "bf16_ops_per_second": 1e15, "int8_ops_per_second": 2e15,
                "quantize_cost": dict(q)}},
            {"name": "slow", "ranks": 2, "profile": {
                "memory_bytes": 10 ** 12, "fp16_ops_per_second": 6.5e13,
                "int8_ops_per_second": 1.3e14, "quantize_cost": dict(q)}},
        ],
        "link": {"bytes_per_second": 1e10, "latency_seconds": 1e-5},
        "config": {},
    }


def _set(doc, path, value):
    """Sets (value given) or deletes (value is DELETE) doc at path, a list of keys/indices."""
    for k in path[:-1]:
        doc = doc[k]
    if value is DELETE:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


DELETE = object()
# (path, value, the key the refusal should name): each must be refused with exit 2.
BAD = [
    (["colour"], 1, "colour"),
    (["blocks", 0, "colour"], 1, "blocks[0].colour"),
    (["blocks", 1, "stats", "z_l2"], 1, "blocks[1].stats.z_l2"),
    (["classes", 0, "colour"], 1, "classes[0].colour"),
    (["classes", 1, "profile", "colour"], 1, "classes[1].profile.colour"),
    (["classes", 1, "profile", "quantize_cost", "colour"], 1,
     "classes[1].profile.quantize_cost.colour"),
    (["link", "colour"], 1, "link.colour"),
    (["config", "colour"], 1, "config.colour"),
    (["blocks"], DELETE, "blocks"),
    (["classes"], DELETE, "classes"),
    (["link"], DELETE, "link"),
    (["blocks", 2, "flops"], DELETE, "blocks[2].flops"),
    (["blocks", 2, "state_bytes"], DELETE, "blocks[2].state_bytes"),
    (["blocks", 0, "stats", "g_l2"], DELETE, "blocks[0].stats.g_l2"),
    (["blocks", 0, "stats", "x_l2"], -1.0, "blocks[0].stats.x_l2"),
    (["blocks", 0, "stats", "x_numel"], 0, "blocks[0].stats.x_numel"),
    (["blocks", 1, "stats", "w_numel"], 0, "blocks[1].stats.w_numel"),
    (["blocks", 1, "stats", "w_max_abs"], "2", "blocks[1].stats.w_max_abs"),
    (["blocks", 1, "flops"], -5.0, "blocks[1].flops"),
    (["blocks", 1, "id"], 0, "blocks[1].id"),
    (["blocks", 2, "id"], 3, "blocks[2].id"),
    (["classes", 1, "name"], "fast", "classes[1].name"),
    (["classes", 1, "ranks"], 0, "classes[1].ranks"),
    (["classes", 1, "ranks"], 1.5, "classes[1].ranks"),
    (["classes", 1, "profile", "memory_bytes"], DELETE, "classes[1].profile.memory_bytes"),
    (["classes", 1, "profile", "quantize_cost"], DELETE, "classes[1].profile.quantize_cost"),
    (["classes", 1, "profile", "int8_ops_per_second"], 0,
     "classes[1].profile.int8_ops_per_second"),
    (["classes", 1, "profile", "fp16_ops_per_second"], DELETE,
     "classes[1].profile.fp16_ops_per_second"),
    (["link", "bytes_per_second"], 0, "link.bytes_per_second"),
    (["link", "bytes_per_second"], DELETE, "link.bytes_per_second"),
    (["link", "latency_seconds"], -1e-6, "link.latency_seconds"),
    (["link", "latency_seconds"], DELETE, "link.latency_seconds"),
    (["config", "memory_fraction"], 0, "config.memory_fraction"),
    (["config", "memory_fraction"], 1.5, "config.memory_fraction"),
    (["config", "gamma"], -1, "config.gamma"),
    (["config", "low_format"], "fp4", "config.low_format"),
    (["config", "low_format"], "fp8_e4m3", "classes[1].profile.fp8_ops_per_second"),
    (["config", "fixed_classes"], ["fast", "nope"], "config.fixed_classes[1]"),
    (["config", "force_bf16_blocks"], [0, 3], "config.force_bf16_blocks[1]"),
]


def refused_key(stderr, path):
    """KEY of `prismctl plan: FILE: KEY: PROBLEM`, or None."""
    prefix = f"prismctl plan: {path}: "
    if not stderr.startswith(prefix):
        return None
    return stderr[len(prefix):].split(": ", 1)[0]


def run_bad_cases(prismctl, outdir):
    """Each BAD mutation must be refused with exit 2 and nothing on stdout by both sides; a key
    named differently from the reference is printed as a note, not counted."""
    failures = 0
    for n, (path, value, key) in enumerate(BAD):
        doc = base_doc()
        _set(doc, path, value)
        file = os.path.join(outdir, f"bad{n:02d}.plan.json")
        with open(file, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        try:
            plan_ref.plan(doc)
            ref_key = None
        except plan_ref.PlanError as e:
            ref_key = e.key
        if ref_key != key:
            failures += 1
            print(f"REFERENCE bad case {n} ({file}): names {ref_key!r}, expected {key!r}")
        proc = subprocess.run([prismctl, "plan", file], capture_output=True, text=True, timeout=60)
        got = refused_key(proc.stderr, file)
        if proc.returncode != 2 or proc.stdout:
            failures += 1
            print(f"MISMATCH bad case {n} ({file}): {'.'.join(map(str, path))} = "
                  f"{'(deleted)' if value is DELETE else json.dumps(value)}: prismctl exit "
                  f"{proc.returncode}, stdout {proc.stdout[:80]!r}, stderr {proc.stderr.strip()!r}")
        elif got != key:
            print(f"note: bad case {n} ({file}): prismctl names {got!r} "
                  f"({proc.stderr.strip()!r}), the reference {key!r}")
    print(f"{len(BAD)} bad PLANs, {failures} not refused as expected")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--keep", help="directory to write every case into")
    args = ap.parse_args()
    build = os.environ.get("PRISM_BUILD_DIR")
    if not build:
        print("PRISM_BUILD_DIR is not set", file=sys.stderr)
        return 2
    prismctl = os.path.join(build, "service", "prismctl")
    rng = random.Random(args.seed)
    outdir = args.keep or tempfile.mkdtemp(prefix="plan_diff_")
    os.makedirs(outdir, exist_ok=True)
    failures = 0
    counts = {"ok": 0, "refused": 0, "raises": 0, "memory": 0, "time": 0, "accepted": 0}
    for n in range(args.cases):
        doc = gen_case(rng)
        path = os.path.join(outdir, f"case{n:03d}.plan.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        problem = run_case(prismctl, path, doc)
        try:
            ref = plan_ref.plan(doc)
            counts["ok"] += 1
            for r in ref["raises"]:
                counts["raises"] += 1
                counts["accepted" if r["accepted"] else r["reason"]] += 1
        except plan_ref.StartRefused:
            counts["refused"] += 1
        if problem:
            failures += 1
            print(f"MISMATCH case {n}: {path}\n  {problem}")
        elif not args.keep:
            os.unlink(path)
    base = base_doc()
    path = os.path.join(outdir, "base.plan.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(base, fh)
    problem = run_case(prismctl, path, base)
    if problem:
        failures += 1
        print(f"MISMATCH base of the bad cases: {problem}")
    failures += run_bad_cases(prismctl, outdir)
    print(f"{args.cases} cases, {failures} disagreeing; reference: {counts['ok']} plans, "
          f"{counts['refused']} starts refused, {counts['raises']} raises "
          f"({counts['accepted']} accepted, {counts['memory']} memory, {counts['time']} time)")
    if not failures and not args.keep:
        shutil.rmtree(outdir)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
