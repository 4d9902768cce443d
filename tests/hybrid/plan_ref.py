#!/usr/bin/python3
"""Independent reference of issue 15's hybrid-device model and of `prismctl plan`'s output.

Written from the issue text (issue 15: Formats, Indicator, Time, Memory, Allocation,
deliverable 2) and the choices `prismctl plan --help` lists only, never from the C implementation, so that
the differential test (test_plan_differential.py) compares two independent readings. Every sum
follows the order of service/policy/README.md literally (Python floats are IEEE doubles, math.sqrt, math.frexp and
math.ldexp are exact or correctly rounded as in C), so both sides must agree to the last bit.

Usage: plan_ref.py PLAN.json  -> prints the JSON object `prismctl plan` prints (exit 0), or the
start-refusal message on stderr (exit 1), or `plan_ref: FILE: KEY: PROBLEM` (exit 2).
Stdlib only.
"""

import json
import math
import sys

MANTISSA = {"fp16": 10, "bf16": 7, "fp8_e4m3": 3, "fp8_e5m2": 2}
OPS_FIELD = {"bf16": "bf16_ops_per_second", "fp16": "fp16_ops_per_second",
             "int8": "int8_ops_per_second", "fp8_e4m3": "fp8_ops_per_second"}
INT8_Q = 127.0
TIME_SLACK = 1.0 + 1e-9


class PlanError(Exception):
    """A refused PLAN.json: key names the offending key, problem says why (exit 2)."""

    def __init__(self, key, problem):
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class StartRefused(Exception):
    """A non-fixed class whose start does not fit its budget (exit 1)."""

    def __init__(self, name, need, budget):
        super().__init__(f'class "{name}" does not fit: its start needs {fmt_num(need)} bytes, '
                         f'its budget is {fmt_num(budget)} bytes')
        self.name = name
        self.need = need
        self.budget = budget


def fmt_num(x):
    """Shortest round-trip text of a double: Python's repr (12288.0, 0.1, 1e+20), which is what
    prism_buf_append_double writes too."""
    return repr(float(x))


# ---------------------------------------------------------------- validation (exit 2)

def _num(obj, key, path, required=True, default=None):
    if key not in obj:
        if required:
            raise PlanError(f"{path}.{key}", "missing")
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PlanError(f"{path}.{key}", "must be a number")
    v = float(v)
    if not math.isfinite(v):
        raise PlanError(f"{path}.{key}", "must be finite")
    return v


def _nonneg(obj, key, path, required=True, default=None):
    v = _num(obj, key, path, required, default)
    if v is not None and v < 0:
        raise PlanError(f"{path}.{key}", "must be >= 0")
    return v


def _only(obj, allowed, path):
    """obj must be an object with keys from allowed; path "" is the top level."""
    if not isinstance(obj, dict):
        raise PlanError(path or "PLAN", "must be an object")
    for k in obj:
        if k not in allowed:
            raise PlanError(f"{path}.{k}" if path else k, "unknown key")


def parse_plan(doc):
    """Checks a parsed PLAN.json and returns the model's inputs (blocks in id order)."""
    _only(doc, ("blocks", "classes", "link", "config"), "")
    blocks_in = doc.get("blocks")
    if not isinstance(blocks_in, list) or not blocks_in:
        raise PlanError("blocks", "must be a non-empty array")
    L = len(blocks_in)
    blocks = [None] * L
    for n, b in enumerate(blocks_in):
        p = f"blocks[{n}]"
        _only(b, ("id", "name", "flops", "param_bytes_bf16", "activation_bytes_bf16",
                  "state_bytes", "stats"), p)
        bid = b.get("id")
        if isinstance(bid, bool) or not isinstance(bid, int) or bid < 0 or bid >= L \
                or blocks[bid] is not None:
            raise PlanError(f"{p}.id", f"must be each of 0..{L - 1} exactly once")
        st = b.get("stats")
        _only(st, ("x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs", "w_numel",
                   "g_l2", "g_max_abs", "y_numel"), f"{p}.stats")
        s = {k: _nonneg(st, k, f"{p}.stats") for k in st}
        for k in ("x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs", "w_numel",
                  "g_l2", "g_max_abs", "y_numel"):
            if k not in s:
                raise PlanError(f"{p}.stats.{k}", "missing")
        for k in ("x_numel", "w_numel"):
            if s[k] < 1:
                raise PlanError(f"{p}.stats.{k}", "must be >= 1")
        blocks[bid] = {
            "flops": _nonneg(b, "flops", p),
            "W": _nonneg(b, "param_bytes_bf16", p),
            "A": _nonneg(b, "activation_bytes_bf16", p),
            "S": _nonneg(b, "state_bytes", p),
            "stats": s,
        }

    classes_in = doc.get("classes")
    if not isinstance(classes_in, list) or not classes_in:
        raise PlanError("classes", "must be a non-empty array")
    classes = []
    names = set()
    for n, c in enumerate(classes_in):
        p = f"classes[{n}]"
        _only(c, ("name", "ranks", "profile"), p)
        name = c.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise PlanError(f"{p}.name", "must be a non-empty string, unique")
        names.add(name)
        r = c.get("ranks")
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise PlanError(f"{p}.ranks", "must be an integer >= 1")
        pr = c.get("profile")
        pp = f"{p}.profile"
        _only(pr, ("device_class", "device_name", "memory_bytes", "bf16_ops_per_second",
                   "fp16_ops_per_second", "int8_ops_per_second", "fp8_ops_per_second",
                   "quantize_cost", "cast_cost", "h2d_bytes_per_second"), pp)
        ops = {f: _nonneg(pr, OPS_FIELD[f], pp, False, 0.0) for f in OPS_FIELD}
        qc = pr.get("quantize_cost")
        if qc is None:
            raise PlanError(f"{pp}.quantize_cost", "missing")
        _only(qc, ("fixed_seconds", "seconds_per_byte"), f"{pp}.quantize_cost")
        classes.append({
            "name": name,
            "ops": ops,
            "memory_bytes": _nonneg(pr, "memory_bytes", pp),
            "q_fixed": _nonneg(qc, "fixed_seconds", f"{pp}.quantize_cost"),
            "q_per_byte": _nonneg(qc, "seconds_per_byte", f"{pp}.quantize_cost"),
            "path": pp,
        })

    link = doc.get("link")
    _only(link, ("bytes_per_second", "latency_seconds"), "link")
    bps = _num(link, "bytes_per_second", "link")
    if bps <= 0:
        raise PlanError("link.bytes_per_second", "must be > 0")
    lat = _nonneg(link, "latency_seconds", "link")

    cfg = doc.get("config", {})
    _only(cfg, ("fixed_classes", "memory_fraction", "gamma", "low_format",
                "force_bf16_blocks"), "config")
    frac = _num(cfg, "memory_fraction", "config", False, 0.9)
    if not (0 < frac <= 1):
        raise PlanError("config.memory_fraction", "must be in (0, 1]")
    gamma = _nonneg(cfg, "gamma", "config", False, 4.0)
    low_cfg = cfg.get("low_format", "auto")
    if low_cfg not in ("int8", "fp8_e4m3", "auto"):
        raise PlanError("config.low_format", "must be int8, fp8_e4m3 or auto")
    force = cfg.get("force_bf16_blocks", [])
    if not isinstance(force, list):
        raise PlanError("config.force_bf16_blocks", "must be an array")
    for n, f in enumerate(force):
        if isinstance(f, bool) or not isinstance(f, int) or not (0 <= f < L):
            raise PlanError(f"config.force_bf16_blocks[{n}]", "must be a block id")
    fixed_cfg = cfg.get("fixed_classes")
    if fixed_cfg is not None:
        if not isinstance(fixed_cfg, list):
            raise PlanError("config.fixed_classes", "must be an array")
        for n, f in enumerate(fixed_cfg):
            if f not in names:
                raise PlanError(f"config.fixed_classes[{n}]", "must name a class")

    # Formats (issue: Formats; every format a class runs needs ops > 0).
    for c in classes:
        c["high"] = "bf16" if c["ops"]["bf16"] > 0 else "fp16"
        if low_cfg == "auto":
            c["low"] = "fp8_e4m3" if c["ops"]["fp8_e4m3"] > 0 else "int8"
        else:
            c["low"] = low_cfg
    top = max(c["ops"][c["high"]] for c in classes)
    for c in classes:
        if fixed_cfg is None:
            c["fixed"] = c["ops"][c["high"]] == top
        else:
            c["fixed"] = c["name"] in fixed_cfg
        # A format a class runs needs ops > 0: its high format, and its low format unless the
        # class is fixed (a fixed class runs every block high, in the plan and in both baselines).
        for f in (c["high"],) if c["fixed"] else (c["high"], c["low"]):
            if c["ops"][f] <= 0:
                raise PlanError(f"{c['path']}.{OPS_FIELD[f]}", f"must be > 0 (the class runs {f})")
    return blocks, classes, {"bps": bps, "lat": lat, "frac": frac, "gamma": gamma,
                             "force": set(force)}


# ---------------------------------------------------------------- the model

def eps(v):
    """ε(v): the exponent e of frexp(v), v = f·2^e with ½ ≤ f < 1; ε(0) = 0."""
    return math.frexp(v)[1]


def omega(block, i, L, fmt, high, gamma):
    """ω_i(fmt) of block i (0-based) for a class whose high format is `high`."""
    s = block["stats"]
    nX, mX, DX = s["x_l2"], s["x_max_abs"], s["x_numel"]
    nW, mW, DW = s["w_l2"], s["w_max_abs"], s["w_numel"]
    nG, mG, DY = s["g_l2"], s["g_max_abs"], s["y_numel"]
    eX = min(5, abs(eps(math.sqrt(nX / DX))))
    eW = min(5, abs(eps(math.sqrt(nW / DW))))
    eG = min(5, abs(eps(mG)))
    if fmt == "int8":
        k = MANTISSA[high]
        SX = mX / INT8_Q
        SW = mW / INT8_Q
        fwd = ((nW * (SX * SX)) * DX + (nX * (SW * SW)) * DW) / 6
        bwd = ((nG * (SX * SX)) * DX + (nX * math.ldexp(1.0, 2 * eX - 2 * k)) * DY) / 6
    else:
        p = math.ldexp(1.0, -2 * MANTISSA[fmt])
        fwd = p * ((nW * DX) * float(eX) + (nX * DW) * float(eW)) / 6
        bwd = p * ((nG * DX) * float(eX) + (nX * DY) * float(eG)) / 6
    d = float(i + 1)
    return (gamma * (float(L) - d)) * fwd + d * bwd


def is_low(c, fmt):
    return fmt == c["low"] and fmt != c["high"]


def fwd_time(block, c, fmt):
    t = block["flops"] / c["ops"][fmt]
    if is_low(c, fmt):
        return t + (c["q_fixed"] + c["q_per_byte"] * (block["W"] + block["A"]))
    return t + 0.0


def bwd_time(block, c, fmt):
    back = c["high"] if fmt == "int8" else fmt
    return (2 * block["flops"]) / c["ops"][back]


def ready_times(blocks, c, plan):
    """f_k(i) for i = 0..L-1: forward Σ over all blocks (j ascending) + backward Σ j = L-1..i."""
    L = len(blocks)
    fsum = 0.0
    for j in range(L):
        fsum += fwd_time(blocks[j], c, plan[j])
    f = [0.0] * L
    bsum = 0.0
    for i in range(L - 1, -1, -1):
        bsum += bwd_time(blocks[i], c, plan[i])
        f[i] = fsum + bsum
    return f


def iteration_time(blocks, classes, plans, link):
    """T = max(end(0), max_k f_k(0)), the all-reduce chained from block L-1 down to 0."""
    L = len(blocks)
    fs = [ready_times(blocks, c, plans[n]) for n, c in enumerate(classes)]
    end = 0.0
    for i in range(L - 1, -1, -1):
        start = max(max(f[i] for f in fs), end)
        end = (start + link["lat"]) + blocks[i]["W"] / link["bps"]
    return max(end, max(f[0] for f in fs)), [f[0] for f in fs]


def memory(blocks, plan):
    m = 0.0
    for i, b in enumerate(blocks):
        bits = 16.0 if plan[i] in ("bf16", "fp16") else 8.0
        m += b["S"] + (b["A"] * bits) / 16
    return m


def indicator(blocks, classes, plans, gamma):
    L = len(blocks)
    total = 0.0
    for n, c in enumerate(classes):
        if c["fixed"]:
            continue
        for i in range(L):
            total += omega(blocks[i], i, L, plans[n][i], c["high"], gamma)
    return total


def plan(doc):
    """The object `prismctl plan` prints, as a Python dict in the output's key order."""
    blocks, classes, cfg = parse_plan(doc)
    L = len(blocks)
    link = cfg
    gamma = cfg["gamma"]
    budgets = [cfg["frac"] * c["memory_bytes"] for c in classes]

    def baseline(plans):
        t, _ = iteration_time(blocks, classes, plans, link)
        fits = all(memory(blocks, plans[n]) <= budgets[n]
                   for n, c in enumerate(classes) if not c["fixed"])
        return {"iteration_seconds": t, "indicator": indicator(blocks, classes, plans, gamma),
                "fits": fits}

    high_plans = [[c["high"]] * L for c in classes]
    low_plans = [[c["high"] if c["fixed"] else c["low"]] * L for c in classes]

    plans = []
    for c in classes:
        if c["fixed"]:
            plans.append([c["high"]] * L)
        else:
            plans.append([c["high"] if i in cfg["force"] else c["low"] for i in range(L)])
    for n, c in enumerate(classes):
        if not c["fixed"]:
            m = memory(blocks, plans[n])
            if m > budgets[n]:
                raise StartRefused(c["name"], m, budgets[n])
    t0, _ = iteration_time(blocks, classes, plans, link)
    limit = t0 * TIME_SLACK

    cands = []
    for n, c in enumerate(classes):
        if c["fixed"]:
            continue
        for i in range(L):
            if plans[n][i] == c["low"] and c["low"] != c["high"]:
                delta = omega(blocks[i], i, L, c["low"], c["high"], gamma) \
                    - omega(blocks[i], i, L, c["high"], c["high"], gamma)
                cands.append((delta, c["name"], i, n))
    cands.sort(key=lambda x: (-x[0], x[1], x[2]))
    raises = []
    for delta, name, i, n in cands:
        plans[n][i] = classes[n]["high"]
        m = memory(blocks, plans[n])
        if m > budgets[n]:
            reason = "memory"
        else:
            t, _ = iteration_time(blocks, classes, plans, link)
            reason = "ok" if t <= limit else "time"
        if reason != "ok":
            plans[n][i] = classes[n]["low"]
        raises.append({"class": name, "block": i, "delta": delta, "accepted": reason == "ok",
                       "reason": reason})

    t, f0 = iteration_time(blocks, classes, plans, link)
    out_classes = []
    for n, c in enumerate(classes):
        out_classes.append({
            "name": c["name"], "fixed": c["fixed"], "low_format": c["low"],
            "high_format": c["high"], "plan": list(plans[n]),
            "memory_bytes": memory(blocks, plans[n]), "budget_bytes": budgets[n],
            "compute_seconds": f0[n],
        })
    return {
        "iteration_seconds": t,
        "start_seconds": t0,
        "indicator": indicator(blocks, classes, plans, gamma),
        "classes": out_classes,
        "baselines": {"uniform_low": baseline(low_plans), "uniform_high": baseline(high_plans)},
        "raises": raises,
    }


def main(argv):
    if len(argv) != 2:
        print("usage: plan_ref.py PLAN.json", file=sys.stderr)
        return 2
    path = argv[1]
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        out = plan(doc)
    except (OSError, ValueError) as e:
        print(f"plan_ref: {path}: {e}", file=sys.stderr)
        return 2
    except PlanError as e:
        print(f"plan_ref: {path}: {e.key}: {e.problem}", file=sys.stderr)
        return 2
    except StartRefused as e:
        print(f"plan_ref: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
