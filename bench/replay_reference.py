#!/usr/bin/python3
"""A plain-Python replay of a JSONL trace: the reference `prismctl replay` is timed against in
bench/bench_replay.sh. Standard library only, written from DESIGN 4.2-4.4 (and the merge of 4.3)
for what the benchmark's trace and config use: layout, calibration and step lines; the config
keys below. It prints the same telemetry records as `prismctl replay --timestamp T`, byte for
byte: the same decisions and the same numbers, because it does the same floating-point
operations in the same order (sums in block-id order, the running mean of the merge, C's
round() and C's shortest-exact number text).

Not covered (prismctl has them; the benchmark's trace needs none): config changes during the run,
binary traces, the merger's timeouts and its limit on open steps, rank numbers other than 0 to
N-1, and the checks and error messages of a bad trace (the reference trusts its input).

Usage: replay_reference.py TRACE.jsonl --world-size N [--config FILE] [--timestamp T]
"""

import argparse
import json
import math
import sys
import time

DEFAULTS = {
    "enabled": True, "mode": "dynamic", "bf16_threshold": 0.6, "int8_threshold": 0.3,
    "ambiguous_default": "bf16", "hysteresis_margin": 0.1, "grad_weight": 0.7, "error_weight": 0.3,
    "grad_sensitivity_threshold": 2.0, "quant_error_threshold": 0.05, "warmup_steps": 10,
    "history_window": 5, "update_interval_steps": 10, "min_steps_between_switches": 20,
    "force_bf16_blocks": [], "force_int8_blocks": [], "low_precision": "int8", "apply_lag_steps": 1,
}
# Keys the reference accepts and that do not change decisions.
IGNORED = {"run_calibration", "calibration_samples", "log_decisions", "telemetry_enabled", "telemetry_file",
           "step_timeout_ms", "world_size"}
SAVING = {"bf16": 0.0, "int8": 0.5, "fp8_e4m3": 0.5, "fp8_e5m2": 0.5, "int4": 0.75}


def c_round(x):
    """C's round(): halves away from zero (Python's round() goes to even)."""
    f = math.floor(x)
    r = f + 1.0 if x - f >= 0.5 else f
    return float(r) if x >= 0 else -c_round(-x)


def num(x):
    """prism_buf_append_double: %.15g, %.16g or %.17g, the first that reads back exactly; an
    integral value keeps a '.0'; NaN and Inf are null."""
    if not math.isfinite(x):
        return "null"
    for digits in (15, 16, 17):
        text = "%.*g" % (digits, x)
        if float(text) == x:
            break
    if not any(c in text for c in ".en"):
        text += ".0"
    return text


def opt(present, x):
    return num(x) if present else "null"


class Block:
    __slots__ = ("id", "precision", "reported", "assigned", "nonfinite_pending", "window", "has_switch",
                 "last_switch", "has_score", "sens", "grad", "rel", "has_err", "err", "bytes", "calibration")

    def __init__(self, block_id):
        self.id = block_id
        self.precision = "bf16"
        self.reported = False
        self.assigned = False
        self.nonfinite_pending = False
        self.window = []
        self.has_switch = False
        self.last_switch = 0
        self.has_score = False
        self.sens = self.grad = self.rel = self.err = 0.0
        self.has_err = False
        self.bytes = 0
        self.calibration = {}


class Policy:
    def __init__(self, cfg):
        self.c = cfg
        self.blocks = {}
        self.order = []          # reported blocks, ascending id
        self.order_dirty = False
        self.collected = 0
        self.last_step = None
        self.map_version = 0
        self.force_bf16 = set(cfg["force_bf16_blocks"])
        self.force_low = set(cfg["force_int8_blocks"])

    def block(self, block_id):
        b = self.blocks.get(block_id)
        if b is None:
            b = self.blocks[block_id] = Block(block_id)
        return b

    def override(self, block_id):
        if not self.c["enabled"]:
            return 0
        if block_id in self.force_bf16:
            return 1
        if block_id in self.force_low:
            return 2
        return 0

    def change(self, b, to, step, changes):
        changes.append(b.id)
        b.precision = to
        b.has_switch = True
        b.last_switch = step

    def score(self, b):
        c = self.c
        b.has_score = False
        b.has_err = False
        b.sens = b.grad = b.rel = b.err = 0.0
        if not c["enabled"] or c["mode"] == "off" or not b.window:
            return
        total = 0.0
        for x in b.window:
            total += x
        b.rel = total / len(b.window)
        b.grad = min(b.rel / c["grad_sensitivity_threshold"], 1.0)
        s = b.grad
        e = b.calibration.get(c["low_precision"])
        if e is not None:
            b.has_err = True
            b.err = min(e / c["quant_error_threshold"], 1.0)
            s = c["grad_weight"] * b.grad + c["error_weight"] * b.err
        b.sens = min(max(s, 0.0), 1.0)
        b.has_score = True

    def decide(self, b, step, changes):
        c = self.c
        low = c["low_precision"]
        nonfinite = b.nonfinite_pending
        b.nonfinite_pending = False
        self.score(b)
        forced = self.override(b.id)
        target = b.precision
        if not c["enabled"]:
            target = "bf16"
        elif forced:
            target = "bf16" if forced == 1 else low
        elif c["mode"] != "dynamic":
            target = "bf16"
        elif nonfinite:
            target = "bf16"
        elif b.has_score:
            s = b.sens
            is_low = b.precision != "bf16"
            if not b.assigned:
                want_low = False if s >= c["bf16_threshold"] else (
                    True if s < c["int8_threshold"] else c["ambiguous_default"] != "bf16")
            elif is_low:
                want_low = not (s >= c["bf16_threshold"])
            else:
                want_low = s < c["int8_threshold"] - c["hysteresis_margin"]
            cooling = b.assigned and b.has_switch and step - b.last_switch < c["min_steps_between_switches"]
            b.assigned = True
            if not cooling and want_low != is_low:
                target = low if want_low else "bf16"
        if target != "bf16" and target != low:
            target = low
        if target != b.precision:
            self.change(b, target, step, changes)

    def add_step(self, step, stats):
        """stats: [(id, l2, numel, nonfinite)] in the merged step's order. Returns the summary
        of a decision, or None."""
        if self.last_step is not None and step <= self.last_step:
            raise ValueError("step %d is not after the last step %d" % (step, self.last_step))
        l2_sum = 0.0
        finite = 0
        for _, l2, _, nonfinite in stats:
            if nonfinite == 0 and math.isfinite(l2):
                l2_sum += l2
                finite += 1
        mean_l2 = l2_sum / finite if finite else 0.0
        if math.isinf(mean_l2):
            largest = max(l2 for _, l2, _, nf in stats if nf == 0 and math.isfinite(l2))
            scaled = 0.0
            for _, l2, _, nf in stats:
                if nf == 0 and math.isfinite(l2):
                    scaled += l2 / largest
            mean_l2 = largest * (scaled / finite)
        changes = []
        history = self.c["history_window"]
        for block_id, l2, _, nonfinite in stats:
            b = self.block(block_id)
            if not b.reported:
                b.reported = True
                self.order_dirty = True
                if self.override(block_id) == 2:
                    self.change(b, self.c["low_precision"], step, changes)
            if nonfinite == 0 and math.isfinite(l2):
                b.window.append(l2 / mean_l2 if mean_l2 > 0 else 0.0)
                if len(b.window) > history:
                    del b.window[0]
            else:
                b.nonfinite_pending = True
        self.collected += 1
        self.last_step = step
        if self.order_dirty:
            self.order = sorted((b for b in self.blocks.values() if b.reported), key=lambda b: b.id)
            self.order_dirty = False
        summary = None
        w = max(self.c["warmup_steps"], 1)
        n = self.collected
        if n == w or (n > w and (n - w) % self.c["update_interval_steps"] == 0):
            first = len(changes)
            for b in self.order:
                self.decide(b, step, changes)
            summary = self.summarize(step, len(changes) - first)
        if changes:
            self.map_version += 1
        if summary is not None:
            summary["map_version"] = self.map_version
        return summary

    def summarize(self, step, precision_changes):
        all_bytes = all(b.bytes > 0 for b in self.order)
        saved = total = sens_sum = 0.0
        low = bf16 = scored = 0
        smax = smin = 0.0
        by_precision = {name: 0 for name in SAVING}
        for b in self.order:
            by_precision[b.precision] += 1
            if b.precision != "bf16":
                low += 1
            else:
                bf16 += 1
            wgt = float(b.bytes) if all_bytes else 1.0
            saved += wgt * SAVING[b.precision]
            total += wgt
            if b.has_score:
                if scored == 0 or b.sens > smax:
                    smax = b.sens
                if scored == 0 or b.sens < smin:
                    smin = b.sens
                sens_sum += b.sens
                scored += 1
        return {"step": step, "bf16": bf16, "low": low, "scored": scored, "by_precision": by_precision,
                "mean": sens_sum / scored if scored else 0.0, "max": smax, "min": smin,
                "changes": precision_changes,
                "saving": c_round(saved / total * 100.0 * 10.0) / 10.0 if total > 0 else 0.0}


def record(p, s, timestamp, loss):
    """The telemetry line of DESIGN 4.4, keys in prism_telemetry_append's order."""
    scored = s["scored"] > 0
    head = ('{"step_id":%d,"timestamp":%s,"blocks_bf16":%d,"blocks_int8":%d,"mean_sensitivity":%s,'
            '"max_sensitivity":%s,"min_sensitivity":%s,"precision_changes":%d,'
            '"estimated_bandwidth_saving_pct":%s,"low_precision":"%s","map_version":%d'
            % (s["step"], num(timestamp), s["bf16"], s["low"], opt(scored, s["mean"]), opt(scored, s["max"]),
               opt(scored, s["min"]), s["changes"], num(s["saving"]), p.c["low_precision"], s["map_version"]))
    if loss is not None:
        head += ',"loss":' + num(loss)
    details = ['"%d":{"precision":"%s","sensitivity":%s,"grad_score":%s,"error_score":%s,"relative_magnitude":%s}'
               % (b.id, b.precision, opt(b.has_score, b.sens), opt(b.has_score, b.grad),
                  opt(b.has_score and b.has_err, b.err), opt(b.has_score, b.rel)) for b in p.order]
    # Issue 17's fields, last; the reference implements no loss-spike rule (its configs leave it off).
    tail = ',"blocks_by_precision":{%s},"loss_spike":false' % ",".join(
        '"%s":%d' % (name, s["by_precision"][name]) for name in SAVING)
    return head + ',"block_details":{' + ",".join(details) + "}" + tail + "}\n"


class Merger:
    """DESIGN 4.3: a step completes when every rank reported it; once one is complete, the
    oldest open step goes out; reports of a step not after the last one out are dropped."""

    def __init__(self, world):
        self.world = world
        self.open = {}   # step -> [ranks set, {id: [ranks, l2_mean, numel, nonfinite]}, loss_sum, loss_count]
        self.last_out = None

    def add(self, rank, step, loss, blocks):
        if self.last_out is not None and step <= self.last_out:
            return
        s = self.open.get(step)
        if s is None:
            s = self.open[step] = [set(), {}, 0.0, 0]
        if rank in s[0]:
            return
        s[0].add(rank)
        if loss is not None:
            s[2] += loss
            s[3] += 1
        accs = s[1]
        for b in blocks:
            a = accs.get(b["id"])
            if a is None:
                a = accs[b["id"]] = [0, 0.0, 0, 0]
            a[0] += 1
            a[1] += (b["l2"] - a[1]) / a[0]
            a[2] += b["numel"]
            a[3] += b.get("nonfinite", 0)

    def ready(self, closing):
        if not self.open:
            return None
        if not closing and not any(len(s[0]) >= self.world for s in self.open.values()):
            return None
        step = min(self.open)
        s = self.open.pop(step)
        self.last_out = step
        stats = [(block_id, a[1], a[2], min(a[3], a[2])) for block_id, a in s[1].items()]
        return step, stats, (s[2] / s[3] if s[3] else None)


def load_config(path):
    cfg = dict(DEFAULTS)
    if path:
        with open(path) as f:
            given = json.load(f)
        for k, v in given.items():
            if k not in DEFAULTS and k not in IGNORED:
                raise SystemExit("replay_reference.py: config key %s is not supported" % k)
            cfg[k] = v
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--config")
    ap.add_argument("--timestamp", type=float)
    a = ap.parse_args()
    policy = Policy(load_config(a.config))
    merger = Merger(a.world_size)
    out = sys.stdout
    steps = decisions = 0

    def drain(closing):
        nonlocal steps, decisions
        while True:
            got = merger.ready(closing)
            if got is None:
                return
            step, stats, loss = got
            summary = policy.add_step(step, stats)
            steps += 1
            if summary is not None:
                decisions += 1
                out.write(record(policy, summary, a.timestamp if a.timestamp is not None else time.time(), loss))

    with open(a.trace) as f:
        for line in f:
            if not line.strip():
                continue
            obj = json.loads(line)
            if "layout" in obj:
                for b in obj["layout"]["blocks"]:
                    policy.block(b["id"]).bytes = b["param_bytes_bf16"]
            elif "calibration" in obj:
                fmt = obj["calibration"]["format"]
                for k, e in obj["calibration"]["errors"].items():
                    policy.block(int(k)).calibration[fmt] = float(e)
            else:
                merger.add(obj.get("rank", 0), obj["step"], obj.get("loss"), obj["blocks"])
                drain(False)
    drain(True)
    out.flush()
    print("replay_reference.py: %d steps, %d decisions, map_version %d" % (steps, decisions, policy.map_version),
          file=sys.stderr)


if __name__ == "__main__":
    main()
