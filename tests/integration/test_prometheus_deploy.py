#!/usr/bin/python3
"""The Grafana dashboards (deploy/grafana/*.json) and the Prometheus rules (deploy/prometheus/*.yml)
checked against a real Prometheus (issue 14, item 4).

Debian's `prometheus` (or $PRISM_PROMETHEUS) runs on loopback with a scratch storage directory and
a generated configuration: scrape and rule evaluation interval 1 s, the rule files loaded, and
three targets, all real processes of this build: prismd (scrape job "prism", the name the rules
assume: what a ServiceMonitor of the chart's Service "prism" gives it) and two prism-agents
(scrape job "prism-agent"). honor_labels is false, Prometheus's default, so the Prism job id that
prismd and the agents export as label `job` arrives as `exported_job`. Each agent serves one rank
of a two-rank data-parallel PyTorch job that trains meanwhile (examples/train_demo.py, gloo on
127.0.0.1: the demo's pieces, scripts/demo.sh, with its policy configuration).

Once prismd has decided a map and both trainers use it, the test waits (bounded, polling
Prometheus's own API) until every target has been scraped, healthy, at least twice since then, and
every rule group evaluated at least twice after that. It then fixes one evaluation time T, the
oldest of every target's newest scrape and every group's newest evaluation (so every sample up to
T is in), and runs through /api/v1/query at T:

  - every target expression of every panel of every dashboard (rows' nested panels too) and of
    its annotations, with Grafana's variables replaced as Grafana would: $job by the test's
    training job, any other query variable by its first value, or by its allValue (else `.+`)
    where it allows several values or All;
    $__interval, $__rate_interval and $__range as Grafana computes them from the dashboard's time
    range and a 1 s scrape interval. Every query variable's own query (label_values(...),
    query_result(...), ...) is run too and must list values;
  - the expression of every recording and alerting rule.

Each must parse (status "success") and return at least one series, except those in
EMPTY_BY_NATURE (an error counter that stays zero, an alert that must not fire in this healthy
setup), each with its reason. Those must return no series (unless also in CAN_BLINK), and every
metric selector in them must still select a series, so that an alert is quiet because nothing is
wrong and not because it watches a metric or scrape job that is not there; an entry that names no
expression or rule fails the test too. A result whose every sample is NaN (0/0, a quantile of a
histogram that observed nothing) is no number to draw and counts as no series, unless the
expression is in NAN_BY_NATURE, with its reason: those must return series, every one NaN (unless
also in CAN_BLINK, where numbers are accepted too). For an expression that fails, the test prints its file,
panel or rule, the query after substitution, Prometheus's error or which of its selectors select
nothing. Every rule must also be loaded and evaluated healthy (/api/v1/rules: health "ok", no
lastError).

Environment: PRISM_BUILD_DIR (service/prismd, agent/prism-agent, lib/libprism.so),
PRISM_SOURCE_DIR, PRISM_DEPLOY_DIR (default SOURCE/deploy: its grafana/*.json and prometheus/*.yml
are checked), PRISM_PROMETHEUS (default /usr/bin/prometheus), PRISM_LIBRARY (default
BUILD/lib/libprism.so). Ports are loopback ports the kernel gave as free a moment before. No sleep
stands for a wait and nothing asserts a duration; every wait is bounded, every process is killed
on every path, and every log is printed when the test fails."""

import calendar
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

import yaml

from prismtest import free_port, http_get, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(HERE, "..", "..")))
DEPLOY = os.path.abspath(os.environ.get("PRISM_DEPLOY_DIR") or os.path.join(SOURCE, "deploy"))
PROMETHEUS = os.environ.get("PRISM_PROMETHEUS", "/usr/bin/prometheus")
LIBRARY = os.environ.get("PRISM_LIBRARY") or os.path.join(BUILD, "lib", "libprism.so")

JOB = "promtest"  # the training job's id
# Scrape job names, as deploy/prometheus/prism-rules.yml assumes them (its header comment).
PRISMD_SCRAPE_JOB = "prism"
AGENT_SCRAPE_JOB = "prism-agent"
WORLD = 2
# Five minutes of training at least: through the waits below (a dozen seconds here, idle; the test
# checks that both still train at T), and a trainer left behind by a killed test ends by itself.
STEPS = 6000
STEP_MS = 50
# scripts/demo.sh's policy configuration: the first decision after a few dozen steps.
CONFIG = {"warmup_steps": 10, "update_interval_steps": 10, "history_window": 5, "min_steps_between_switches": 20,
          "apply_lag_steps": 3, "step_timeout_ms": 1000, "calibration_samples": 4}
SCRAPE_S = 1  # scrape and rule evaluation interval
WAIT_S = 180  # the bound of each wait: minutes, for a loaded 2-core machine

# Expressions (as written in the dashboard, whitespace aside) and rules (by record or alert name)
# that return no series in this healthy setup, and why. Each must return none here (but those in
# CAN_BLINK), and each metric selector in it must match a series (so that it is empty because
# nothing is wrong, not because it watches a metric or scrape job that is not there).
EMPTY_BY_NATURE = {
    "PrismdDown": "prismd is up: up{job=\"prism\"} is 1",
    "PrismdNotReady": "prismd is ready: prism_ready is 1",
    "PrismAgentDisconnected": "both agents are connected to prismd: prism_agent_upstream_connected is 1",
    "PrismTrainerReportsDropped": "no step report is dropped: the agents listen before the trainers start and "
                                  "stay connected to prismd",
    "PrismStoreErrors": "prismd's store takes every write: prism_store_errors_total stays 0",
    "PrismMapNotApplied": "both ranks ack each new map within a step and switch at its effective step",
    "PrismJobDecisionsStopped": "the job's last decision is seconds old, not 30 minutes",
    "PrismJobNoDecision": "the job has decided (the test waits for its first map): its last decision time is not 0",
}
# Expressions (as written, whitespace aside) and rules whose every sample is NaN in this setup, and
# why. A NaN-only result counts as no series unless listed here; each listed one must return series,
# all NaN (but those in CAN_BLINK, which may return numbers too).
_ALLREDUCE_NAN = ("0/0: the demo's trainers are Python (torch's gloo all-reduce) and libprism.so carries no "
                  "collectives, so the all-reduce byte counters stay 0")
_MAP_LAG_NAN = ("a quantile of no observation: prismd decides the job's one map before the scrapes the test waits "
                "for (the demo's later decisions keep it), so no map reaches a trainer within $__rate_interval of T; "
                "a number when T falls within it")
NAN_BY_NATURE = {
    # prism-rules.yml's all-reduce byte ratio, and the agents dashboard's "All-reduce speed-up (byte ratio)".
    "instance_format:prism_agent_trainer_allreduce_bf16_per_wire_bytes:ratio_rate5m": _ALLREDUCE_NAN,
    'sum by (job, instance, format) (rate(prism_agent_trainer_allreduce_bf16_bytes_total{instance=~"$instance"}'
    '[$__rate_interval])) / sum by (job, instance, format) (rate(prism_agent_trainer_allreduce_wire_bytes_total'
    '{instance=~"$instance"}[$__rate_interval])) * on (job, instance) group_left (node, rank, exported_job) '
    'prism_agent_info{instance=~"$instance"}': _ALLREDUCE_NAN,
    'instance_format:prism_agent_trainer_allreduce_bf16_per_wire_bytes:ratio_rate5m{instance=~"$instance"} * on '
    '(job, instance) group_left (node, rank, exported_job) prism_agent_info{instance=~"$instance"}': _ALLREDUCE_NAN,
    # The agents dashboard's "Map apply lag", the job dashboard's "Map apply lag (trainers)" (p50, p99).
    'histogram_quantile(0.99, sum by (job, instance, le) (rate(prism_agent_trainer_map_apply_lag_seconds_bucket'
    '{instance=~"$instance"}[$__rate_interval]))) * on (job, instance) group_left (node, rank, exported_job) '
    'prism_agent_info{instance=~"$instance"}': _MAP_LAG_NAN,
    'histogram_quantile(0.5, sum by (le) (rate(prism_agent_trainer_map_apply_lag_seconds_bucket[$__rate_interval]) '
    '* on (job, instance) group_left () prism_agent_info{exported_job="$job"}))': _MAP_LAG_NAN,
    'histogram_quantile(0.99, sum by (le) (rate(prism_agent_trainer_map_apply_lag_seconds_bucket[$__rate_interval]) '
    '* on (job, instance) group_left () prism_agent_info{exported_job="$job"}))': _MAP_LAG_NAN,
}
# Entries of EMPTY_BY_NATURE that a healthy job can make true for a moment (between a new map and
# every rank's Ack, say): empty or not at T, either is accepted; their selectors are still checked.
# Entries of NAN_BY_NATURE here may be numbers or NaN at T, either accepted (they still need series).
CAN_BLINK = {"PrismMapNotApplied"} | {k for k, why in NAN_BY_NATURE.items() if why is _MAP_LAG_NAN}


def log(msg):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def squash(expr):
    """An expression with its runs of whitespace made one space: the key of EMPTY_BY_NATURE."""
    return " ".join(expr.split())


_AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _AGGREGATORS | _LABEL_LISTS | {"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"}


def _skip_string(expr, i):
    """The index past the PromQL string starting at expr[i] (a quote)."""
    quote, i = expr[i], i + 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" and quote != "`" else 1
    return i + 1


def _skip_group(expr, i, open_, close):
    """The index past the bracketed group starting at expr[i] (open_), strings inside skipped."""
    depth = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
            continue
        depth += c == open_
        depth -= c == close
        i += 1
        if depth == 0:
            break
    return i


def selectors(expr):
    """The instant vector selectors of a PromQL expression, in order (metric{matchers}, metric,
    {matchers}; range and offset left out): a small scanner, not a parser, enough to ask
    Prometheus whether each selects anything."""
    out, i, n = [], 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "[":
            i = _skip_group(expr, i, "[", "]")
        elif c == "{":
            j = _skip_group(expr, i, "{", "}")
            out.append(expr[i:j])
            i = j
        elif (c.isalpha() or c in "_:") and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:.")):
            j = i
            while j < n and (expr[j].isalnum() or expr[j] in "_:"):
                j += 1
            word, k = expr[i:j], j
            while k < n and expr[k].isspace():
                k += 1
            if word in _LABEL_LISTS and k < n and expr[k] == "(":
                i = _skip_group(expr, k, "(", ")")  # by (job, instance): labels, not metrics
            elif word in _KEYWORDS or (k < n and expr[k] == "("):
                i = j  # an operator, or a function's name
            elif k < n and expr[k] == "{":
                i = _skip_group(expr, k, "{", "}")
                out.append(word + expr[k:i])
            else:
                out.append(word)
                i = j
        else:
            i += 1
    return out


def parse_time(stamp):
    """Unix seconds of Prometheus's RFC 3339 time with up to nanoseconds ("2026-01-02T03:04:05.123456789Z"
    or with an offset); None for Go's zero time (never happened)."""
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    if not m:
        raise AssertionError(f"unexpected time from Prometheus: {stamp!r}")
    year, mon, day, hh, mm, ss = (int(g) for g in m.groups()[:6])
    if year < 1971:
        return None
    secs = calendar.timegm((year, mon, day, hh, mm, ss, 0, 0, 0)) + float("0." + (m.group(7) or "0"))
    if m.group(8) != "Z":
        sign = 1 if m.group(8)[0] == "+" else -1
        secs -= sign * (int(m.group(8)[1:3]) * 3600 + int(m.group(8)[4:6]) * 60)
    return secs


# ---- Grafana's interval arithmetic -----------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_s(text):
    """Seconds of a Grafana/Prometheus duration such as 90s, 5m, 1h."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w|y)", text.strip())
    if not m:
        raise AssertionError(f"not a duration: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def prom_duration(secs):
    """A Prometheus duration for a positive number of seconds: whole seconds when it is one, ms otherwise."""
    ms = round(secs * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# Grafana's rounding of a computed interval to a tidy one (its "roundInterval"): an interval below
# each bound becomes the value beside it.
_ROUND = [(0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5), (1.5, 1),
          (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120), (450, 300),
          (750, 600), (1050, 900), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200), (16200, 10800),
          (32400, 21600), (86400, 43200)]


def grafana_intervals(dashboard):
    """What Grafana gives $__range, $__interval and $__rate_interval for this dashboard's default
    time range, a panel of 1000 data points and a datasource whose scrape interval is SCRAPE_S:
    interval = range / 1000 rounded as Grafana does and at least the scrape interval;
    rate interval = max(interval + scrape interval, 4 x scrape interval)."""
    frm = (dashboard.get("time") or {}).get("from", "now-1h")
    m = re.fullmatch(r"now-(\d+(?:ms|s|m|h|d|w|y))", frm)
    range_s = duration_s(m.group(1)) if m else 3600
    raw = range_s / 1000
    interval = next((v for bound, v in _ROUND if raw < bound), 86400 if raw < 604800 else 604800)
    interval = max(interval, SCRAPE_S)
    rate = max(interval + SCRAPE_S, 4 * SCRAPE_S)
    return {"__range": prom_duration(range_s), "__range_s": str(int(range_s)), "__range_ms": str(int(range_s * 1000)),
            "__interval": prom_duration(interval), "__interval_ms": str(int(interval * 1000)),
            "__rate_interval": prom_duration(rate)}


_VAR = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)")


def substitute(expr, values):
    """expr with every Grafana variable ($x, ${x}, ${x:fmt}, [[x]]) that values names replaced by
    its value, as Grafana does; other names are left as they are, as Grafana leaves them ($1 of
    label_replace; a misspelt variable then fails in Prometheus). A variable whose value is None
    (the datasource) raises AssertionError."""
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            return m.group(0)
        if values[name] is None:
            raise AssertionError(f"the datasource variable ${name} is in an expression")
        return values[name]
    return _VAR.sub(repl, expr)


# ---- what is checked ---------------------------------------------------------------------------

class Expr:
    """One expression to run: where it comes from (file, what), its text as written, its kind
    ("panel", "annotation", "record", "alert") and, for rules, the rule's name."""

    def __init__(self, file, what, raw, kind, name=None):
        self.file, self.what, self.raw, self.kind, self.name = file, what, raw, kind, name
        self.query = raw  # after substitution

    def keys(self):
        return [k for k in (self.name, squash(self.raw)) if k]


def dashboard_panels(panels):
    """Every panel of a panel list, rows' nested panels included, in order."""
    for p in panels or []:
        yield p
        yield from dashboard_panels(p.get("panels"))


def rule_files():
    """The rule files of DEPLOY/prometheus: its top-level *.yml holding rule groups (unit test
    files live in its tests/ folder)."""
    files = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "prometheus", "*.yml"))):
        with open(path) as f:
            doc = yaml.safe_load(f)
        if isinstance(doc, dict) and "groups" in doc:
            files.append((path, doc))
        else:
            log(f"note: {path} holds no rule groups; not loaded as a rule file")
    return files


def variable_query(var):
    """The query text of a Grafana query variable (a string, or the object of newer schemas)."""
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query", "")
    return q or ""


# ---- the processes -------------------------------------------------------------------------------

class Stack:
    """prismd, WORLD prism-agents, WORLD trainers and Prometheus, in a scratch directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="prism-promtest-")
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.metrics = [f"127.0.0.1:{free_port()}" for _ in range(WORLD)]
        self.prom = f"127.0.0.1:{free_port()}"
        self.procs = {}

    def spawn(self, name, argv, **kw):
        fd = os.open(os.path.join(self.dir, name + ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=fd, stderr=fd, stdin=subprocess.DEVNULL, **kw)
        finally:
            os.close(fd)
        return self.procs[name]

    def check_alive(self, names):
        for name in names:
            p = self.procs[name]
            if p.poll() is not None:
                raise AssertionError(f"{name} exited ({p.returncode}) before its time")

    def start_prismd(self):
        config = os.path.join(self.dir, "config.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        self.spawn("prismd", [os.path.join(BUILD, "service", "prismd"), "--grpc-listen", self.grpc,
                              "--http-listen", self.http, "--data-dir", os.path.join(self.dir, "data"),
                              "--config", config])
        wait_for("prismd ready", lambda: self.check_alive(["prismd"]) or
                 http_get(self.http, "/readyz", openapi=False)[0] == 200, timeout_s=WAIT_S, every_s=0.1)

    def start_agents(self):
        for r in range(WORLD):
            self.spawn(f"agent{r}", [os.path.join(BUILD, "agent", "prism-agent"), "--prismd", self.grpc, "--dir",
                                     os.path.join(self.dir, f"agent{r}"), "--metrics-listen", self.metrics[r],
                                     "--device", "cpu", "--node", f"node{r}", "--profile-budget-ms", "100",
                                     "--backoff-initial-ms", "50", "--backoff-max-ms", "400"])
        # Listening before the trainers start, so that no report of theirs is dropped for want of an agent.
        names = [f"agent{r}" for r in range(WORLD)]
        wait_for("every agent's /healthz", lambda: self.check_alive(names) or all(
            http_get(a, "/healthz", openapi=False)[0] == 200 for a in self.metrics), timeout_s=WAIT_S, every_s=0.1)

    def start_trainers(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"), PRISM_LIBRARY=LIBRARY)
        # gloo meets through a file in the run's directory: a port picked free here could be taken
        # by another test before torch has started (seen on a busy CI machine).
        rendezvous = os.path.join(self.dir, "gloo-rendezvous")
        for r in range(WORLD):
            self.spawn(f"trainer{r}", [sys.executable, os.path.join(SOURCE, "examples", "train_demo.py"),
                                       "--job", JOB, "--rank", str(r), "--world", str(WORLD),
                                       "--dir", os.path.join(self.dir, f"agent{r}"), "--steps", str(STEPS),
                                       "--step-ms", str(STEP_MS), "--dist-file", rendezvous], env=env)

    def start_prometheus(self, rule_paths):
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                       "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": rule_paths,
            "scrape_configs": [
                {"job_name": PRISMD_SCRAPE_JOB, "static_configs": [{"targets": [self.http]}]},
                {"job_name": AGENT_SCRAPE_JOB, "static_configs": [{"targets": list(self.metrics)}]},
            ],
        }
        path = os.path.join(self.dir, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        self.spawn("prometheus", [PROMETHEUS, f"--config.file={path}",
                                  f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
                                  f"--web.listen-address={self.prom}", "--log.level=info"])
        wait_for("Prometheus ready", lambda: self.check_alive(["prometheus"]) or
                 http_get(self.prom, "/-/ready", openapi=False)[0] == 200, timeout_s=WAIT_S, every_s=0.1)

    def stop(self):
        for name, p in self.procs.items():
            if p.poll() is None:
                p.kill()
        for name, p in self.procs.items():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"{name} (pid {p.pid}) did not exit after SIGKILL")

    def dump_logs(self):
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    tail = f.read()[-6000:]
                sys.stderr.write(f"---- {name} (last 6000 characters) ----\n{tail}\n")

    # -- Prometheus's HTTP API

    def api(self, path, params=None, post=False):
        """The "data" of a Prometheus API answer, or raises PromError with its error."""
        url = f"http://{self.prom}{path}"
        body = None
        if params is not None:
            enc = urllib.parse.urlencode(params, doseq=True)
            if post:
                body = enc.encode()
            else:
                url += "?" + enc
        req = urllib.request.Request(url, data=body)
        if body is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                doc = json.loads(text)
            except ValueError:
                raise PromError(f"HTTP {e.code}: {text[:500]}")
        if doc.get("status") != "success":
            raise PromError(f"{doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr, at):
        """(resultType, result) of an instant query at unix time `at`."""
        data = self.api("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}, post=True)
        return data["resultType"], data["result"]


class PromError(Exception):
    pass


def is_nan(value):
    """Whether a sample value as Prometheus's API writes it (a string) is NaN."""
    return value == "NaN"


def nan_only(rtype, result):
    """Whether an instant query's answer has samples and every one is NaN."""
    if rtype == "vector":
        return bool(result) and all(is_nan(x["value"][1]) for x in result)
    if rtype == "scalar":
        return is_nan(result[1])
    return False


def sample(rtype, result):
    """ "  (first: VALUE)" of an instant query's answer, for the log; "" when it has none."""
    if rtype == "vector" and result:
        return f"  (first: {result[0]['value'][1]})"
    if rtype == "scalar":
        return f"  (scalar: {result[1]})"
    return ""


def metric_value(text, name):
    m = re.search(r"^%s(?:\{\})? (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


# ---- the test ------------------------------------------------------------------------------------

class PrometheusDeployTest(unittest.TestCase):
    def test_dashboards_and_rules_against_prometheus(self):
        self.assertTrue(os.access(PROMETHEUS, os.X_OK),
                        f"{PROMETHEUS} is missing: scripts/install-deps.sh installs Debian's prometheus")
        dashboards = sorted(glob.glob(os.path.join(DEPLOY, "grafana", "*.json")))
        rules = rule_files()
        self.assertTrue(dashboards, f"no dashboards in {DEPLOY}/grafana")
        self.assertTrue(rules, f"no rule files in {DEPLOY}/prometheus")
        s = Stack()
        try:
            self.run_checks(s, dashboards, rules)
        except BaseException:
            s.dump_logs()
            raise
        finally:
            s.stop()
            shutil.rmtree(s.dir, ignore_errors=True)

    def wait_training(self, s):
        """Until prismd has decided a map for JOB and both trainers have started using it (the
        agents' /metrics say so); returns the unix time when that was seen."""
        def ready():
            s.check_alive(["prismd", "prometheus"] + [f"agent{r}" for r in range(WORLD)] +
                          [f"trainer{r}" for r in range(WORLD)])
            status, body = http_get(s.http, "/v1/jobs", openapi=False)
            if status != 200:
                return False
            jobs = [j for j in json.loads(body)["jobs"] if j["job_id"] == JOB]
            if not jobs or not jobs[0].get("map_version"):
                return False
            for addr in s.metrics:
                text = http_get(addr, "/metrics", openapi=False)[1]
                if not (metric_value(text, "prism_agent_trainer_map_version") or 0) >= 1:
                    return False
            return True
        wait_for("a first map decided by prismd and used by both trainers", ready, timeout_s=WAIT_S, every_s=0.2)
        return time.time()

    def wait_scrapes(self, s, since, groups):
        """Until every target has been scraped healthy at least twice since `since` and every rule
        group evaluated at least twice after that; returns the evaluation time T: the oldest of
        every target's newest scrape and every group's newest evaluation, so that at T every
        scrape and evaluation is complete. Polls Prometheus's own API; a missed poll only makes
        the wait longer."""
        scrapes = {}  # (job, instance) -> set of scrape times since `since`
        evals = {}  # group name -> set of evaluation times after the scrapes
        state = {"scraped": None}

        def done():
            s.check_alive(list(s.procs))
            targets = s.api("/api/v1/targets", {"state": "active"})["activeTargets"]
            want = {(PRISMD_SCRAPE_JOB, s.http)} | {(AGENT_SCRAPE_JOB, a) for a in s.metrics}
            have = {(t["labels"].get("job"), t["labels"].get("instance")) for t in targets}
            if not have <= want:
                raise AssertionError(f"Prometheus's targets are {sorted(have)}, not {sorted(want)}")
            state["last"] = "targets: " + "; ".join(
                f"{t['labels']['job']} {t['labels']['instance']} {t['health']} {t.get('lastError') or ''}"
                for t in targets)
            if have != want:
                return False  # discovery is not done
            newest = []
            for t in targets:
                key = (t["labels"]["job"], t["labels"]["instance"])
                if t["health"] != "up":
                    return False  # not scraped yet, or a listener not up yet: seen again next time
                at = parse_time(t["lastScrape"])
                if at is not None and at >= since:
                    scrapes.setdefault(key, set()).add(at)
                newest.append(at)
            state["last"] += f"; scrapes since the first map: {[len(v) for v in scrapes.values()]}"
            if state["scraped"] is None:
                if len(scrapes) < len(want) or min(len(v) for v in scrapes.values()) < 2:
                    return False
                state["scraped"] = max(max(v) for v in scrapes.values())
            loaded = s.api("/api/v1/rules")["groups"]
            if {g["name"] for g in loaded} != set(groups):
                raise AssertionError(f"Prometheus loaded the rule groups {sorted(g['name'] for g in loaded)}, "
                                     f"not {sorted(groups)}")
            for g in loaded:
                at = parse_time(g["lastEvaluation"])
                if at is not None and at > state["scraped"]:
                    evals.setdefault(g["name"], set()).add(at)
                newest.append(at)
            state["last"] += f"; rule group evaluations since: {evals and [len(v) for v in evals.values()]}"
            if len(evals) < len(groups) or min(len(v) for v in evals.values()) < 2:
                return False
            return min(newest)

        try:
            return wait_for("two scrapes of every target and two evaluations of every rule group", done,
                            timeout_s=WAIT_S, every_s=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: {state.get('last')}") from None

    def run_checks(self, s, dashboards, rules):
        # What is to be checked, read before anything starts: a file that does not parse fails at once.
        exprs = []
        boards = []
        for path in dashboards:
            with open(path) as f:
                board = json.load(f)
            boards.append((path, board))
        groups = []
        for path, doc in rules:
            for g in doc["groups"]:
                groups.append(g["name"])
                for rule in g.get("rules", []):
                    kind = "record" if "record" in rule else "alert"
                    exprs.append(Expr(path, f"group {g['name']}, {kind} {rule[kind]}", str(rule["expr"]), kind,
                                      rule[kind]))
        self.assertEqual(len(groups), len(set(groups)), f"rule group names repeat: {groups}")

        s.start_prismd()
        s.start_agents()
        s.start_prometheus([path for path, _ in rules])
        s.start_trainers()
        since = self.wait_training(s)
        log(f"training: prismd decided a map and both trainers use it ({time.strftime('%H:%M:%S')})")
        at = self.wait_scrapes(s, since, groups)
        log(f"evaluation time T = {at:.3f} ({time.strftime('%H:%M:%S', time.gmtime(at))} UTC)")
        s.check_alive([f"trainer{r}" for r in range(WORLD)])  # they were training through every scrape

        # Rules: every one loaded and evaluated healthy.
        problems = []
        for g in s.api("/api/v1/rules")["groups"]:
            for rule in g["rules"]:
                if rule.get("health") != "ok" or rule.get("lastError"):
                    problems.append(f"rule {rule['name']} of group {g['name']} ({g['file']}): health "
                                    f"{rule.get('health')!r}, lastError {rule.get('lastError')!r}")

        # Dashboards: variables first (their values go into the panels' expressions).
        for path, board in boards:
            exprs.extend(self.dashboard_exprs(s, path, board, at, problems))

        # Every expression, at T.
        used = set()
        for e in exprs:
            problems.extend(self.check_expr(s, e, at, used))
        for k in EMPTY_BY_NATURE:
            if k not in used:
                problems.append(f"EMPTY_BY_NATURE names {k!r}, which no dashboard expression or rule is")
        for k in NAN_BY_NATURE:
            if k not in used:
                problems.append(f"NAN_BY_NATURE names {k!r}, which no dashboard expression or rule is")
        for k in set(EMPTY_BY_NATURE) & set(NAN_BY_NATURE):
            problems.append(f"{k!r} is in both EMPTY_BY_NATURE and NAN_BY_NATURE")
        for k in CAN_BLINK - set(EMPTY_BY_NATURE) - set(NAN_BY_NATURE):
            problems.append(f"CAN_BLINK names {k!r}, which neither EMPTY_BY_NATURE nor NAN_BY_NATURE does")
        if problems:
            self.fail(f"{len(problems)} of the dashboards' and rules' checks failed:\n\n" + "\n\n".join(problems))
        log(f"{len(exprs)} expressions checked in {len(boards)} dashboards and {len(rules)} rule files")

    def check_expr(self, s, e, at, used):
        """The problems of one expression at T: it must parse and return a series that is a number,
        but as EMPTY_BY_NATURE and NAN_BY_NATURE allow. The keys of those it matches go into used."""
        empty_keys = [k for k in e.keys() if k in EMPTY_BY_NATURE]
        nan_keys = [k for k in e.keys() if k in NAN_BY_NATURE]
        used.update(empty_keys + nan_keys)
        blinks = bool(set(empty_keys + nan_keys) & CAN_BLINK)
        where = f"{os.path.relpath(e.file, DEPLOY)}: {e.what}"
        try:
            rtype, result = s.query(e.query, at)
        except PromError as err:
            return [f"{where}\n    query: {e.query}\n    error: {err}"]
        n = len(result) if rtype in ("vector", "matrix") else 1
        nan = nan_only(rtype, result)
        log(f"{n:4d} series  {where}{sample(rtype, result)}{'  (all NaN)' if nan else ''}")
        if nan_keys:
            reason = NAN_BY_NATURE[nan_keys[0]]
            if n == 0:
                return [f"{where}\n    query: {e.query}\n    error: no series{self.dead_selectors(s, e, at)}, yet "
                        f"NAN_BY_NATURE says it returns NaN: {reason}"]
            if not nan and not blinks:
                return [f"{where}\n    query: {e.query}\n    error: a number, yet NAN_BY_NATURE says it is NaN: "
                        f"{reason}\n    {json.dumps(result)[:800]}"]
            return []
        if nan:
            n = 0  # NaN everywhere: nothing to draw or to alert on, as good as no series
        if not empty_keys:
            if n == 0:
                what = "every sample is NaN" if nan else "no series"
                return [f"{where}\n    query: {e.query}\n    error: {what}{self.dead_selectors(s, e, at)} (if it "
                        f"is empty by nature, list it in EMPTY_BY_NATURE with the reason; NaN by nature, in "
                        f"NAN_BY_NATURE)" + (f"\n    {json.dumps(result)[:800]}" if nan else "")]
            return []
        reason = EMPTY_BY_NATURE[empty_keys[0]]
        dead = self.dead_selectors(s, e, at)
        if dead:
            return [f"{where}\n    query: {e.query}\n    error: listed in EMPTY_BY_NATURE ({reason}), but it is "
                    f"empty for another reason{dead}"]
        if n != 0 and not blinks:
            return [f"{where}\n    query: {e.query}\n    error: {n} series, yet EMPTY_BY_NATURE says it is empty: "
                    f"{reason}\n    {json.dumps(result)[:800]}"]
        return []

    def dead_selectors(self, s, e, at):
        """": selector X matches no series, ..." for each selector of e's query that selects
        nothing at `at` (5 minutes' lookback), or "" when each selects something."""
        dead = []
        for sel in dict.fromkeys(selectors(e.query)):
            try:
                rtype, result = s.query(f"count({sel})", at)
            except PromError as err:
                dead.append(f"selector {sel}: {err}")
                continue
            if not result:
                dead.append(f"selector {sel} matches no series")
        return "".join(f"; {d}" for d in dead)

    def dashboard_exprs(self, s, path, board, at, problems):
        """The Expr of every panel target of one dashboard, with its variables substituted; the
        dashboard's query variables are run here (problems gets what fails)."""
        values = dict(grafana_intervals(board))
        rel = os.path.relpath(path, DEPLOY)
        for var in (board.get("templating") or {}).get("list", []):
            name, vtype = var.get("name"), var.get("type")
            if vtype == "datasource":
                values[name] = None  # not to appear in an expression
                continue
            if vtype in ("constant", "custom", "textbox", "interval"):
                # Values written in the dashboard: Grafana starts from the first (its query is "a,b,c").
                first = str(var.get("query", "")).split(",")[0].strip()
                values[name] = ".+" if (var.get("includeAll") or var.get("multi")) else first
                continue
            if vtype != "query":
                problems.append(f"{rel}: variable ${name}: type {vtype!r} is not one this test knows")
                continue
            q = variable_query(var)
            try:
                q_sub = substitute(q, values)
                found = self.variable_values(s, q_sub, at, board)
            except (PromError, AssertionError) as err:
                problems.append(f"{rel}: variable ${name}\n    query: {q}\n    error: {err}")
                values[name] = ".+"
                continue
            regex = var.get("regex")
            if regex:
                rx = re.compile(regex.strip("/"))
                found = [(m.group(1) if m.groups() else v) for v in found for m in [rx.search(v)] if m]
            log(f"{len(found):4d} values  {rel}: variable ${name} = {q_sub}")
            if not found:
                problems.append(f"{rel}: variable ${name}\n    query: {q_sub}\n    error: no values")
            if name == "job":
                if JOB not in found:
                    problems.append(f"{rel}: variable $job: {found} has not the training job {JOB!r}")
                values[name] = JOB
            elif var.get("includeAll") or var.get("multi"):
                values[name] = var.get("allValue") or ".+"
            else:
                values[name] = sorted(found)[0] if found else ".+"
        out = []
        for panel in dashboard_panels(board.get("panels")):
            for target in panel.get("targets") or []:
                if "expr" not in target:
                    continue
                what = f"panel {panel.get('title')!r} (id {panel.get('id')}), target {target.get('refId')}"
                e = Expr(path, what, target["expr"], "panel")
                try:
                    e.query = substitute(e.raw, values)
                except AssertionError as err:
                    problems.append(f"{rel}: {what}\n    expr: {e.raw}\n    error: {err}")
                    continue
                out.append(e)
        # Prometheus annotations hold an expression too (Grafana's built-in one has none).
        for ann in (board.get("annotations") or {}).get("list", []):
            if ann.get("expr"):
                what = f"annotation {ann.get('name')!r}"
                e = Expr(path, what, ann["expr"], "annotation")
                try:
                    e.query = substitute(e.raw, values)
                except AssertionError as err:
                    problems.append(f"{rel}: {what}\n    expr: {e.raw}\n    error: {err}")
                    continue
                out.append(e)
        return out

    def variable_values(self, s, q, at, board):
        """The values Grafana would list for a Prometheus query variable, over the dashboard's range
        ending at `at`: label_values(label), label_values(selector, label), label_names(),
        metrics(regex), query_result(expr), and a bare selector (series)."""
        range_s = duration_s(grafana_intervals(board)["__range"])
        span = {"start": f"{at - range_s:.3f}", "end": f"{at:.3f}"}
        q = q.strip()
        m = re.fullmatch(r"label_values\(\s*(\w+)\s*\)", q)
        if m:
            return s.api(f"/api/v1/label/{m.group(1)}/values", span)
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\s*\)", q, re.S)
        if m:
            series = s.api("/api/v1/series", dict(span, **{"match[]": m.group(1)}))
            return sorted({x[m.group(2)] for x in series if x.get(m.group(2))})
        if re.fullmatch(r"label_names\(\s*\)", q):
            return s.api("/api/v1/labels", span)
        m = re.fullmatch(r"metrics\((.*)\)", q, re.S)
        if m:
            rx = re.compile(m.group(1).strip())
            return [n for n in s.api("/api/v1/label/__name__/values", span) if rx.search(n)]
        m = re.fullmatch(r"query_result\((.+)\)", q, re.S)
        if m:
            rtype, result = s.query(m.group(1), at)
            return [json.dumps(x.get("metric")) for x in result] if rtype == "vector" else [str(result)]
        series = s.api("/api/v1/series", dict(span, **{"match[]": q}))
        return [json.dumps(x) for x in series]


class HelpersTest(unittest.TestCase):
    """What the test computes itself, on fixed inputs: a wrong substitution or selector would make
    the checks above pass or fail for the wrong reason."""

    def test_selectors(self):
        self.assertEqual(selectors('sum by (job, le) (rate(a_bucket{code=~"2..", x="a}b"}[5m]))'),
                         ['a_bucket{code=~"2..", x="a}b"}'])
        self.assertEqual(selectors('label_replace(max by (job) (m) > 0, "c", "$1", "", "")'), ["m"])
        self.assertEqual(selectors("(time() - t > 1800) and on (job, exported_job) (delta(s[30m]) > 0)"),
                         ["t", "s"])
        self.assertEqual(selectors('max without(le)(a - a offset 15m) > 0 or {__name__="up"} unless on() vector(1e3)'),
                         ["a", "a", '{__name__="up"}'])
        self.assertEqual(selectors("topk(5, x:y:z[5m:1m]) / ignoring(a) group_left(b) bar"), ["x:y:z", "bar"])

    def test_substitute(self):
        values = {"job": "j", "instance": ".+", "__rate_interval": "6s", "datasource": None}
        self.assertEqual(substitute('rate(m{exported_job="$job", instance=~"${instance}"}[$__rate_interval])', values),
                         'rate(m{exported_job="j", instance=~".+"}[6s])')
        self.assertEqual(substitute('x{a=~"[[instance]]"} ${job:raw} $1 $other', values), 'x{a=~".+"} j $1 $other')
        with self.assertRaises(AssertionError):
            substitute('m{a="$datasource"}', values)

    def test_grafana_intervals(self):
        self.assertEqual(grafana_intervals({"time": {"from": "now-1h"}}),
                         {"__range": "3600s", "__range_s": "3600", "__range_ms": "3600000", "__interval": "5s",
                          "__interval_ms": "5000", "__rate_interval": "6s"})
        self.assertEqual(grafana_intervals({"time": {"from": "now-15m"}})["__rate_interval"], "4s")  # 1s + 1s < 4 x 1s
        self.assertEqual(grafana_intervals({"time": {"from": "now-6h"}})["__interval"], "20s")
        self.assertEqual(grafana_intervals({})["__range"], "3600s")

    def test_nan_only(self):
        self.assertTrue(nan_only("vector", [{"metric": {}, "value": [1, "NaN"]}, {"metric": {"a": "b"}, "value": [1, "NaN"]}]))
        self.assertFalse(nan_only("vector", [{"metric": {}, "value": [1, "NaN"]}, {"metric": {"a": "b"}, "value": [1, "0"]}]))
        self.assertFalse(nan_only("vector", []))
        self.assertFalse(nan_only("vector", [{"metric": {}, "value": [1, "+Inf"]}]))
        self.assertTrue(nan_only("scalar", [1, "NaN"]))
        self.assertFalse(nan_only("scalar", [1, "2.5"]))

    def test_parse_time(self):
        self.assertEqual(parse_time("1971-01-01T00:00:01.5Z"), 365 * 86400 + 1.5)
        self.assertEqual(parse_time("2026-11-26T12:00:00.25+01:00"), parse_time("2026-11-26T11:00:00.25Z"))
        self.assertIsNone(parse_time("0001-01-01T00:00:00Z"))


if __name__ == "__main__":
    unittest.main()
