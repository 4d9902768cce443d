#!/usr/bin/python3
"""Lint of the Grafana dashboards in deploy/grafana/ (issue 14, item 2).

Usage: lint_dashboards.py --source-dir DIR [--rules FILE]... DASHBOARD.json...

Checks each dashboard, printing every problem with the dashboard's file and the panel's title,
and exits 1 when there is any:
  - it is valid JSON, of the Classic JSON model at schemaVersion SCHEMA_VERSION, with its own
    stable uid (EXPECTED[file]: ours, not the uid of someone's Grafana);
  - templating has a variable `datasource` of type datasource and query prometheus, and the
    variables EXPECTED[file] names, each a query variable with a string query;
  - every panel (rows excepted) and every target, and every query variable, has the datasource
    {"type": "prometheus", "uid": "${datasource}"}, and no other `uid` appears anywhere but the
    dashboard's own;
  - panel ids are unique integers; every panel has a gridPos of integers inside the 24 columns;
    every panel but a row has a title, a description and at least one target with an expr and a
    refId unique in the panel;
  - every rate(), irate() and increase() range is [$__rate_interval]; every $variable an
    expression uses is one of the dashboard's or Grafana's ($__rate_interval, $__interval,
    $__range);
  - every metric name an expression (targets[].expr, templating[].query) uses is one the binaries
    export, extracted from the sources (family(...) in service/prismd/rest.c, one(...)/metric(...)
    and friends in agent/metrics.c: a string literal that is a whole prism_ metric name, and
    `# TYPE name type` lines, the type being the string after the name or after a variable that
    holds it; a histogram's family adds its _bucket, _sum and _count) or a
    recording rule of the given rule files.
With --rules, the rule files' expressions are checked the same way (metric names only; `up`, the
series Prometheus writes per target, is allowed there). With --promtool, every dashboard
expression, its variables replaced by sample values, must parse: they are written as recording
rules of a temporary file that `promtool check rules` reads.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

SCHEMA_VERSION = 42
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
EXPECTED = {  # file -> (uid, required query variables)
    "prism-service.json": ("prism-service", ["instance"]),
    "prism-job.json": ("prism-job", ["job"]),
    "prism-agents.json": ("prism-agents", ["instance"]),
}
SOURCES = ["service/prismd/rest.c", "agent/metrics.c"]
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                   "unless", "atan2", "inf", "nan"}
PANEL_TYPES = {"row", "timeseries", "stat", "table", "gauge", "bargauge", "text", "piechart", "state-timeline",
               "heatmap"}


def exported_metrics(source_dir):
    """The metric names the binaries export, from their sources (see the module's comment)."""
    names = set()
    for rel in SOURCES:
        with open(os.path.join(source_dir, rel), encoding="utf-8") as f:
            text = f.read()
        typed = {}
        for m in re.finditer(r'"(prism_[a-z0-9_]+)"\s*,\s*"(counter|gauge|histogram|summary|untyped)"', text):
            typed[m.group(1)] = m.group(2)
        for m in re.finditer(r"# TYPE (prism_[a-z0-9_]+) (counter|gauge|histogram|summary|untyped)", text):
            typed[m.group(1)] = m.group(2)
        # A name held in a variable (const char *lag = "prism_..."; metric(f, lag, "histogram", ...)).
        held = dict((m.group(1), m.group(2)) for m in re.finditer(r'\b(\w+)\s*=\s*"(prism_[a-z0-9_]+)"\s*;', text))
        for m in re.finditer(r'\(\s*[&\w]+\s*,\s*(\w+)\s*,\s*"(counter|gauge|histogram|summary|untyped)"', text):
            if m.group(1) in held:
                typed[held[m.group(1)]] = m.group(2)
        for m in re.finditer(r'"(prism_[a-z0-9_]+)"', text):
            names.add(m.group(1))
        for name, kind in typed.items():
            names.add(name)
            if kind == "histogram":
                names.update({name + "_bucket", name + "_sum", name + "_count"})
            elif kind == "summary":
                names.update({name + "_sum", name + "_count"})
    return names


def recording_rules(paths):
    """Names recorded by the rule files, and (group, name, expr) of every rule."""
    recorded, rules = set(), []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("record") or rule.get("alert")
                if "record" in rule:
                    recorded.add(rule["record"])
                rules.append((os.path.basename(path), name, rule["expr"]))
    return recorded, rules


def strip_promql(expr):
    """expr with its strings, label matchers, ranges and label lists removed: what is left names
    metrics, functions, keywords and numbers."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", expr)
    return expr


def metric_names(expr):
    """The metric names expr uses (a Grafana label_values(metric, label) counts its metric)."""
    found = set()
    lv = re.fullmatch(r"\s*label_values\(\s*(?:([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*,)?\s*\w+\s*\)\s*", expr)
    if lv:
        return {lv.group(1)} if lv.group(1) else set()
    stripped = strip_promql(expr)
    for m in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", stripped):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_KEYWORDS:
            continue
        found.add(word)
    return found


def variables_used(expr):
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expr))


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


# Sample values of the variables, for parsing an expression (label_values() is Grafana's, not PromQL).
SAMPLE_VALUES = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "__interval_ms": "15000",
                 "__range_s": "3600"}


def parse_problems(promtool, exprs):
    """The expressions of exprs ((where, expr)) that promtool cannot parse, as problem lines."""
    rules = []
    for where, expr in exprs:
        if expr.strip().startswith("label_values("):
            continue
        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: SAMPLE_VALUES.get(m.group(1), "x"), expr)
        rules.append((where, expr, text))
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (where, expr, text) in enumerate(rules):  # one file each: promtool names no rule in its errors
            path = os.path.join(tmp, f"expr{i}.yml")
            with open(path, "w", encoding="utf-8") as f:
                f.write("groups:\n  - name: lint\n    rules:\n      - record: lint:expr\n        expr: "
                        + json.dumps(text) + "\n")
        paths = [os.path.join(tmp, f"expr{i}.yml") for i in range(len(rules))]
        r = subprocess.run([promtool, "check", "rules"] + paths, capture_output=True, text=True, timeout=120,
                           check=False)
        if r.returncode != 0:
            failed = {int(m.group(1)): m.group(2) for m in re.finditer(r"expr(\d+)\.yml: (.*)", r.stdout + r.stderr)}
            for i, (where, expr, _) in enumerate(rules):
                if i in failed:
                    problems.append((where, f"does not parse ({failed[i].split('could not parse expression: ')[-1]}): {expr}"))
            if not problems:
                problems.append(("promtool", r.stderr.strip()))
    return problems


def lint_dashboard(path, known, promtool=None):
    problems = []
    name = os.path.basename(path)

    def bad(where, msg):
        problems.append(f"{name}: {where}: {msg}")

    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        bad("file", f"not valid JSON: {e}")
        return problems
    uid, required = EXPECTED.get(name, (None, []))
    if uid is None:
        bad("file", f"unknown dashboard (the lint knows {sorted(EXPECTED)})")
    elif d.get("uid") != uid:
        bad("dashboard", f"uid is {d.get('uid')!r}, expected {uid!r}")
    if d.get("schemaVersion") != SCHEMA_VERSION:
        bad("dashboard", f"schemaVersion is {d.get('schemaVersion')!r}, expected {SCHEMA_VERSION}")
    if not d.get("title"):
        bad("dashboard", "no title")
    if d.get("id") is not None:
        bad("dashboard", "id must be null (Grafana assigns it)")

    variables = d.get("templating", {}).get("list", [])
    by_name = {v.get("name"): v for v in variables}
    dsv = by_name.get("datasource")
    if not dsv or dsv.get("type") != "datasource" or dsv.get("query") != "prometheus":
        bad("templating", "no variable `datasource` of type datasource with query prometheus")
    for req in required:
        if req not in by_name:
            bad("templating", f"no variable `{req}`")
    exprs = []  # (where, expr)
    for v in variables:
        if v.get("type") == "query":
            where = f"variable {v.get('name')}"
            if v.get("datasource") != DATASOURCE:
                bad(where, f"datasource is {v.get('datasource')!r}, expected {DATASOURCE}")
            if not isinstance(v.get("query"), str) or not v["query"].strip():
                bad(where, "query is not a non-empty string")
            else:
                exprs.append((where, v["query"]))

    ids = set()
    for p in walk_panels(d.get("panels", [])):
        title = p.get("title") or f"(untitled panel id {p.get('id')})"
        where = f"panel {title!r}"
        pid = p.get("id")
        if not isinstance(pid, int) or isinstance(pid, bool):
            bad(where, f"id {pid!r} is not an integer")
        elif pid in ids:
            bad(where, f"id {pid} is used twice")
        else:
            ids.add(pid)
        g = p.get("gridPos")
        if not isinstance(g, dict) or any(not isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            bad(where, f"gridPos {g!r} lacks integer h, w, x, y")
        elif g["w"] < 1 or g["h"] < 1 or g["x"] < 0 or g["y"] < 0 or g["x"] + g["w"] > 24:
            bad(where, f"gridPos {g!r} is outside the 24 columns")
        ptype = p.get("type")
        if ptype not in PANEL_TYPES:
            bad(where, f"unknown panel type {ptype!r}")
        if ptype == "row":
            continue
        if not p.get("title"):
            bad(where, "no title")
        if not p.get("description"):
            bad(where, "no description")
        if p.get("datasource") != DATASOURCE:
            bad(where, f"datasource is {p.get('datasource')!r}, expected {DATASOURCE}")
        targets = p.get("targets") or []
        if not targets:
            bad(where, "no targets")
        refs = set()
        for t in targets:
            if t.get("datasource") != DATASOURCE:
                bad(where, f"target {t.get('refId')}: datasource is {t.get('datasource')!r}, expected {DATASOURCE}")
            if t.get("refId") in refs or not t.get("refId"):
                bad(where, f"target refId {t.get('refId')!r} is missing or used twice")
            refs.add(t.get("refId"))
            if not isinstance(t.get("expr"), str) or not t["expr"].strip():
                bad(where, f"target {t.get('refId')}: no expr")
            else:
                exprs.append((where, t["expr"]))

    def find_uids(node, path_):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "uid" and path_ and v != "${datasource}":
                    bad("dashboard", f"hard-coded uid {v!r} at {'/'.join(path_ + [k])}")
                find_uids(v, path_ + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                find_uids(v, path_ + [str(i)])

    find_uids(d, [])

    for where, expr in exprs:
        for fn, rng in re.findall(r"\b(rate|irate|increase)\s*\([^\[]*\[([^\]]*)\]", expr):
            if rng != "$__rate_interval":
                bad(where, f"{fn}() over [{rng}], expected [$__rate_interval]: {expr}")
        for var in variables_used(expr):
            if var not in by_name and var not in GRAFANA_VARIABLES:
                bad(where, f"unknown variable ${var}: {expr}")
        for metric in sorted(metric_names(expr)):
            if metric not in known:
                bad(where, f"metric {metric} is not exported by the binaries nor recorded: {expr}")
    if promtool:
        for where, msg in parse_problems(promtool, exprs):
            bad(where, msg)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-dir", required=True, help="the repository root (for the metric sources)")
    ap.add_argument("--rules", action="append", default=[], help="a Prometheus rule file (recording rules count)")
    ap.add_argument("--promtool", help="promtool, to check that every expression parses")
    ap.add_argument("dashboards", nargs="+")
    args = ap.parse_args()
    exported = exported_metrics(args.source_dir)
    recorded, rules = recording_rules(args.rules)
    known = exported | recorded
    problems = []
    for path in args.dashboards:
        problems += lint_dashboard(path, known, args.promtool)
    for fname, rname, expr in rules:
        for metric in sorted(metric_names(expr)):
            if metric not in known and metric != "up":
                problems.append(f"{fname}: rule {rname}: metric {metric} is not exported by the binaries nor recorded")
    for p in problems:
        print(p)
    print(f"{len(args.dashboards)} dashboards, {len(rules)} rules, {len(exported)} exported metric names, "
          f"{len(recorded)} recorded: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
