#!/usr/bin/python3
"""The training-quality experiment: every configuration, one after the other, then the results
(results.json), the plot (loss.png) and README.md's results section.

One command runs it all:

    cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release && \\
        cmake --build build-release -j --target prismd prism-agent prism prismctl
    bench/train_quality/run.py --build-dir build-release

Each configuration trains model.GPT on 2 ranks (train.py, torch DDP over gloo on loopback); a
configuration with Prism gets a real prismd (its own data directory and config) and one
prism-agent per rank. Logs, prismd's data (telemetry, trace) and each rank's results stay in
OUT/runs/NAME/ (git-ignored). --configs runs some of them: results of the others already in
OUT/results.json are kept when they were made with the same settings (steps, model, batch, seed,
evaluation, the corpus's SHA-256s, packages' versions and exclusion rule, torch's version), so a
long run can be done in pieces; results of other settings are not replaced without --fresh. Kept
static-* results whose forced block count is not prism-int8's final one are dropped (said on
stderr). The static plans need a prism-int8 result (or --static-low N). --report-only rewrites
the sweep, the plot and the table from results.json as it is. --smoke is the CI test's setting (a
tiny model, a handful of steps, every configuration; see tests/integration/test_train_quality.py).
SIGTERM stops the run in progress (prismd, agents, trainers: each in a process group of its own)
and exits with 143."""

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import report  # noqa: E402

# Every configuration (the list, in the order they run: static plans take their block
# count from prism-int8). prism: None (no prismd), "dynamic" (the policy decides), "uniform"
# (every block forced low), "static-first" / "static-random" (as many blocks forced low as
# prism-int8 ended with: the first ones / a random set with a fixed seed; BF16 before prism-int8's
# first low step, train.py's --low-from, so that they save over the same steps). hook: the DDP hook's
# wire format, or None (DDP's own FP32 all-reduce).
CONFIGS = [
    {"name": "bf16", "prism": None, "low": None, "hook": None},
    {"name": "prism-int8", "prism": "dynamic", "low": "int8", "hook": None},
    {"name": "prism-fp8", "prism": "dynamic", "low": "fp8_e4m3", "hook": None},
    {"name": "prism-int4", "prism": "dynamic", "low": "int4", "hook": None},
    {"name": "uniform-int8", "prism": "uniform", "low": "int8", "hook": None},
    {"name": "uniform-fp8", "prism": "uniform", "low": "fp8_e4m3", "hook": None},
    {"name": "uniform-int4", "prism": "uniform", "low": "int4", "hook": None},
    {"name": "static-first", "prism": "static-first", "low": "int8", "hook": None},
    {"name": "static-random", "prism": "static-random", "low": "int8", "hook": None},
    {"name": "prism-int8+fp8hook", "prism": "dynamic", "low": "int8", "hook": "fp8_e4m3"},
    {"name": "fp8hook", "prism": None, "low": None, "hook": "fp8_e4m3"},
]
BY_NAME = {c["name"]: c for c in CONFIGS}
STATIC_RANDOM_SEED = 16

# The experiment's settings (train.py's options) and the smoke test's.
FULL = {"steps": 2000, "layers": 8, "width": 256, "heads": 4, "context": 128, "batch": 16, "lr": 1e-3,
        "eval_every": 50, "eval_windows": 512, "max_files": None, "seed": 1, "last_evals": 5}
SMOKE = {"steps": 8, "layers": 3, "width": 32, "heads": 2, "context": 32, "batch": 4, "lr": 1e-3,
         "eval_every": 4, "eval_windows": 8, "max_files": 20, "seed": 1, "last_evals": 2}
# prismd's policy config for the dynamic runs; "low_precision" is added per configuration. The
# smoke test's thresholds put blocks low at the first decision, so that a handful of steps see
# a map.
POLICY_FILE = os.path.join(HERE, "policy.json")
SMOKE_POLICY = {"warmup_steps": 2, "update_interval_steps": 2, "history_window": 2, "min_steps_between_switches": 2,
                "apply_lag_steps": 1, "step_timeout_ms": 30000, "calibration_samples": 1,
                "bf16_threshold": 0.99, "int8_threshold": 0.98, "hysteresis_margin": 0.0}
SMOKE_WAIT_AT = 5  # the smoke run's trainers wait at this step until a map is in effect
# The sweep over prism-int8's recorded trace (prismctl replay --sweep): the policy's thresholds
# around policy.json's values (which are in the grid: the live run's config).
SWEEP = [("bf16_threshold", "0.5,0.6,0.7"), ("int8_threshold", "0.2,0.3,0.4"),
         ("grad_sensitivity_threshold", "1.5,2,3")]
# The smoke test's: each value valid with SMOKE_POLICY's other threshold, SMOKE_POLICY's in it.
DESIGN_DEFAULTS = {"bf16_threshold": 0.6, "int8_threshold": 0.3, "grad_sensitivity_threshold": 2.0}  # DESIGN 4.1
SMOKE_SWEEP = [("bf16_threshold", "0.99,1"), ("int8_threshold", "0.5,0.98")]


def forced_blocks(plan, n_blocks, k):
    """The blocks a fixed plan forces low, sorted: "uniform" every one of n_blocks; "static-first"
    the first k; "static-random" k of them drawn by random.Random(STATIC_RANDOM_SEED)."""
    if plan == "uniform":
        return list(range(n_blocks))
    if plan == "static-first":
        return list(range(k))
    if plan == "static-random":
        return sorted(random.Random(STATIC_RANDOM_SEED).sample(range(n_blocks), k))
    raise ValueError(f"forced_blocks: unknown plan {plan!r}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(addr, path, timeout=5):
    """(status, body bytes) of GET http://addr/path; (None, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def bounded_wait(what, predicate, timeout_s, every_s=0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


class Run:
    """The processes of one configuration, in OUT/runs/NAME/. stop() ends every one still running."""

    def __init__(self, cfg, settings, args, static_low, low_from=0):
        self.cfg, self.settings, self.args = cfg, settings, args
        self.dir = os.path.join(args.out, "runs", cfg["name"])
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.procs = []  # every process started, stopped in reverse order
        self.services = []  # prismd and the agents: none may exit while the ranks train
        self.static_low = static_low
        self.low_from = low_from
        self.forced = []
        self.http = None
        self.job = "train-quality"

    def spawn(self, argv, log, **kw):
        fd = os.open(os.path.join(self.dir, log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            # Its own process group (and session): stop() ends the process and anything it started,
            # and a signal to run.py's group (a terminal's ^C, a test's kill) does not reach it
            # before run.py's own handler has stopped it in order.
            p = subprocess.Popen(argv, stderr=fd, stdout=subprocess.DEVNULL, start_new_session=True, **kw)
        finally:
            os.close(fd)
        self.procs.append(p)
        return p

    def policy(self, n_blocks):
        """prismd's config for this configuration."""
        cfg = self.cfg
        if self.args.smoke:
            base = dict(SMOKE_POLICY)
        else:
            with open(POLICY_FILE) as f:
                base = json.load(f)
        base["low_precision"] = cfg["low"]
        if cfg["prism"] != "dynamic":
            self.forced = forced_blocks(cfg["prism"], n_blocks, self.static_low)
        if cfg["prism"] != "dynamic":
            # Fixed plans: overrides only (DESIGN 4.2 "static"), no calibration to run.
            base.update(mode="static", force_int8_blocks=self.forced, run_calibration=False)
        return base

    def start_prism(self):
        """prismd with this configuration's policy, and one prism-agent per rank."""
        b = self.args.build_dir
        config = os.path.join(self.dir, "prismd-config.json")
        self.policy_doc = self.policy(self.settings["layers"])
        with open(config, "w") as f:
            json.dump(self.policy_doc, f, indent=1)
        grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.services.append(self.spawn(
            [os.path.join(b, "service", "prismd"), "--grpc-listen", grpc, "--http-listen", self.http,
             "--data-dir", os.path.join(self.dir, "prismd-data"), "--config", config], "prismd.log"))
        bounded_wait("prismd ready", lambda: self.alive() and http_get(self.http, "/readyz")[0] == 200, 60)
        for r in range(self.args.world):
            self.services.append(self.spawn(
                [os.path.join(b, "agent", "prism-agent"), "--prismd", grpc, "--dir",
                 os.path.join(self.dir, f"agent{r}"), "--metrics-listen", f"127.0.0.1:{free_port()}",
                 "--device", "cpu", "--profile-budget-ms", "100", "--backoff-initial-ms", "50",
                 "--backoff-max-ms", "400"], f"agent{r}.log"))

    def alive(self):
        dead = [p for p in self.services if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{self.cfg['name']}: {dead[0].args[0]} exited with {dead[0].returncode} "
                               f"(logs in {self.dir})")
        return True

    def train(self):
        """Starts the ranks and waits for them (bounded); returns their results."""
        s, cfg = self.settings, self.cfg
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
                   PRISM_LIBRARY=os.path.join(self.args.build_dir, "lib", "libprism.so"))
        outs = [os.path.join(self.dir, f"rank{r}.json") for r in range(self.args.world)]
        trainers = []
        for r in range(self.args.world):
            argv = [sys.executable, os.path.join(HERE, "train.py"), "--name", cfg["name"], "--rank", str(r),
                    "--world", str(self.args.world), "--dist-file", os.path.join(self.dir, "gloo-rendezvous"),
                    "--out", outs[r], "--log", os.path.join(self.dir, f"steps{r}.jsonl"), "--job", self.job]
            for key in ("steps", "layers", "width", "heads", "context", "batch", "lr", "eval_every",
                        "eval_windows", "seed", "max_files"):
                if s[key] is not None:
                    argv += ["--" + key.replace("_", "-"), str(s[key])]
            if cfg["prism"]:
                argv += ["--agent-dir", os.path.join(self.dir, f"agent{r}"), "--low", cfg["low"],
                         "--calibrate-at", str(max(0, self.policy_doc.get("warmup_steps", 10) - 10))]
                if self.args.smoke:
                    argv += ["--wait-map-at", str(SMOKE_WAIT_AT), "--wait-map-s", "60"]
            if self.low_from:
                argv += ["--low-from", str(self.low_from)]
            if cfg["hook"]:
                argv += ["--hook", cfg["hook"]]
            trainers.append(self.spawn(argv, f"trainer{r}.log", env=env))
        deadline = time.monotonic() + self.args.config_timeout_s
        while any(t.poll() is None for t in trainers):
            if time.monotonic() > deadline:
                self.dump_stacks(trainers)
                raise RuntimeError(f"{cfg['name']}: the trainers did not finish in {self.args.config_timeout_s} s "
                                   f"(logs in {self.dir})")
            failed = [t for t in trainers if t.poll() not in (None, 0)]
            if failed:
                raise RuntimeError(f"{cfg['name']}: a trainer exited with {failed[0].returncode}: "
                                   f"{tail(os.path.join(self.dir, 'trainer%d.log' % trainers.index(failed[0])))}")
            if cfg["prism"]:
                self.alive()
            time.sleep(0.2)
        results = []
        for path in outs:
            with open(path) as f:
                results.append(json.load(f))
        return results

    def prismd_record(self):
        """prismd's view after the run: the block map (REST), its telemetry records and the
        job's binary trace when this prismd records one, copied into the run's directory."""
        out = {}
        status, body = http_get(self.http, f"/v1/jobs/{self.job}/config")
        if status == 200:
            out["config"] = json.loads(body)  # the job's whole config as prismd held it
        status, body = http_get(self.http, f"/v1/jobs/{self.job}/blocks")
        if status == 200:
            blocks = json.loads(body)
            with open(os.path.join(self.dir, "blocks.json"), "w") as f:
                json.dump(blocks, f, indent=1)
            out["map_version"] = blocks.get("map_version")
            out["precisions"] = [b["precision"] for b in sorted(blocks["blocks"], key=lambda b: b["id"])]
        status, body = http_get(self.http, f"/v1/jobs/{self.job}/trace", timeout=30)
        if status == 200 and body:
            with open(os.path.join(self.dir, "trace.ptrace"), "wb") as f:
                f.write(body)
            out["trace"] = os.path.relpath(os.path.join(self.dir, "trace.ptrace"), self.args.out)
        data = os.path.join(self.dir, "prismd-data")
        for dirpath, _, files in os.walk(data):
            for name in files:
                if name.endswith(".jsonl") and "telemetry" in name:
                    shutil.copy(os.path.join(dirpath, name), os.path.join(self.dir, "telemetry.jsonl"))
                    out["telemetry"] = os.path.relpath(os.path.join(self.dir, "telemetry.jsonl"), self.args.out)
        return out

    def dump_stacks(self, trainers, timeout_s=10):
        """Asks every trainer still running for its Python stack (train.py's faulthandler writes it
        to the trainer's log on SIGUSR1) and waits, at most timeout_s, until each log shows one or
        the trainer has exited."""
        logs = {}
        for r, t in enumerate(trainers):
            if t.poll() is None:
                path = os.path.join(self.dir, f"trainer{r}.log")
                logs[r] = (t, path, os.path.getsize(path) if os.path.exists(path) else 0)
                t.send_signal(signal.SIGUSR1)

        def dumped():
            for t, path, size in logs.values():
                if t.poll() is not None:
                    continue
                with open(path, "rb") as f:
                    f.seek(size)
                    if b"most recent call first" not in f.read():
                        return False
            return True

        try:
            bounded_wait("the trainers' stacks", dumped, timeout_s)
        except RuntimeError:
            pass  # the error that follows says the run overran; the logs hold what they hold

    def stop(self):
        """Ends every process this run started and its process group: SIGTERM, then SIGKILL to the
        groups of those still running after 15 s. Returns when every one has exited."""
        for p in reversed(self.procs):
            signal_group(p, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            signal_group(p, signal.SIGKILL)  # the process if still there, and anything left in its group
            p.wait(timeout=10)


def signal_group(p, sig):
    """Sends sig to p's process group (p leads one: spawn's start_new_session); nothing when the
    group is gone."""
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path, n=2000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


def summarize(cfg, ranks, settings, prismd, static_low, forced, low_from):
    """One configuration's entry in results.json, from its ranks' results (rank 0's figures; the
    ranks' parameters compared)."""
    r0 = ranks[0]
    evals = r0["evals"]
    last = [loss for _, loss in evals[-settings["last_evals"]:]]
    train_tail = r0["train_loss"][-max(1, len(r0["train_loss"]) // 20):]
    out = {
        "name": cfg["name"], "prism": cfg["prism"], "low": cfg["low"], "hook": cfg["hook"],
        "held_out_loss": statistics.fmean(last), "held_out_last_evals": len(last),
        "final_train_loss": statistics.fmean(train_tail), "evals": evals,
        "finite": all(r["finite"] for r in ranks),
        "low_share": r0["low_share"], "transfer_saving_pct": r0["transfer_saving_pct"],
        "final_precisions": r0["final_precisions"],
        "final_low_blocks": sum(p != "bf16" for p in r0["final_precisions"]),
        "wire": r0["wire"], "wire_vs_bf16": r0["wire"]["wire_bytes"] / r0["wire"]["bf16_bytes"]
        if r0["wire"]["bf16_bytes"] else None,
        "step_seconds": max(r["step_seconds_mean"] for r in ranks),
        "step_seconds_median": max(r["step_seconds_median"] for r in ranks),
        "wall_seconds": max(r["wall_seconds"] for r in ranks),
        "params_identical": len({r["params_sha256"] for r in ranks}) == 1,
        "steps": r0["steps"], "model": r0["model"], "corpus": r0["corpus"],
    }
    if cfg["prism"]:
        out.update(map_version=r0["map_version"], switches=r0["switches"], late_switches=r0["late_switches"],
                   calibration=r0["calibration"], map_wait_s=r0["map_wait_s"], prismd=prismd,
                   reports_dropped=sum(r["client_counters"].get("reports_dropped", 0) for r in ranks))
    if cfg["prism"] and cfg["prism"] != "dynamic":
        out["forced_low"] = forced
    if cfg["prism"] == "dynamic":
        out["first_low_step"] = first_low_step(out)
    if cfg["prism"] in ("static-first", "static-random"):
        out["static_low_from"] = static_low
        out["low_from_step"] = low_from  # train.py's --low-from: BF16 before it whatever the map said
    return out


def sweep(args, results):
    """(the sweep of SWEEP over prism-int8's binary trace by prismctl replay --sweep, None) or
    (None, why there is none)."""
    r = results.get("prism-int8")
    trace = (r.get("prismd") or {}).get("trace") if r else None
    if not trace:
        return None, "prism-int8 has no recorded trace (this prismd records none, or prism-int8 did not run)"
    prismctl = os.path.join(args.build_dir, "service", "prismctl")
    if not os.path.exists(os.path.join(args.out, trace)):
        return None, f"{trace} is not in {args.out}"
    if not os.path.exists(prismctl):
        return None, f"no {prismctl} (build the prismctl target)"
    grid = SMOKE_SWEEP if args.smoke else SWEEP
    argv = ["prismctl", "replay", "--format", "json"]
    for key, values in grid:
        argv += ["--sweep", f"{key}={values}"]
    argv.append(trace)
    proc = subprocess.run([prismctl] + argv[1:], capture_output=True, text=True, timeout=600, cwd=args.out)
    if proc.returncode != 0:
        return None, f"prismctl replay --sweep exited with {proc.returncode}: {proc.stderr.strip()[-500:]}"
    rows = []
    for line in proc.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "config" in row:
            rows.append(row)
    live = r["prismd"].get("config")
    if live is None:  # a result from before run.py kept prismd's config: what it was given
        live = dict(DESIGN_DEFAULTS)
        if args.smoke:
            live.update(SMOKE_POLICY)
        else:
            with open(POLICY_FILE) as f:
                live.update(json.load(f))
    return {"command": " ".join(argv), "trace": trace, "live": {k: live.get(k) for k, _ in grid},
            "rows": rows}, None


def previous_doc(path):
    """What results.json holds."""
    with open(path) as f:
        return json.load(f)


def corpus_key(settings):
    """What identifies the corpus a run trains and evaluates on (corpus.load's info less the file
    lists): each split's files, bytes and SHA-256, the packages' versions, the exclusion rule."""
    import corpus
    info = corpus.load(settings["max_files"])[3]
    return {"packages": info["packages"], "excluded_rule": info["excluded_rule"],
            "held_out_rule": info["held_out_rule"], "train": info["train"], "held_out": info["held_out"]}


def settings_key(s):
    """The settings results must share to sit in one results.json: train.py's options, the
    corpus (corpus_key) and torch's version. s["corpus"] and s["torch"] are filled in by main."""
    import torch
    key = {k: s[k] for k in ("steps", "layers", "width", "heads", "context", "batch", "lr", "eval_every",
                             "eval_windows", "max_files", "seed")}
    key["corpus"] = s["corpus"] if "corpus" in s else corpus_key(s)
    key["torch"] = torch.__version__
    return key


def load_results(path, key, fresh):
    """results.json's configurations when they were made with these settings (key: settings_key);
    {} with fresh or without a results.json. Results of other settings are never overwritten
    silently: exits unless fresh."""
    if fresh or not os.path.exists(path):
        return {}
    with open(path) as f:
        old = json.load(f)
    if old.get("settings") != key:
        differ = settings_differ(old.get("settings") or {}, key)
        sys.exit(f"run.py: {path} holds results made with other settings (they differ in: {', '.join(differ)}); "
                 "use another --out, or --fresh to replace them")
    return old.get("configs", {})


def settings_differ(theirs, key, ignore=()):
    """The names of the settings in which theirs and key differ, sorted, less those in ignore."""
    return sorted(k for k in set(theirs) | set(key) if k not in ignore and theirs.get(k) != key.get(k))


def first_low_step(result):
    """The first step at which a result's trainers ran with a block low (its switches), or None."""
    for step, _, precisions in result.get("switches") or []:
        if any(p != "bf16" for p in precisions):
            return step
    return None


def stale_statics(results):
    """The static-* results not made against the prism-int8 result at hand: their forced block
    count is not its final_low_blocks, or they went low from another step than its first low step
    (made against another prism-int8 run, or with --static-low)."""
    p = results.get("prism-int8")
    if not p:
        return []
    k, step = p["final_low_blocks"], first_low_step(p) or 0
    return [n for n in ("static-first", "static-random")
            if n in results and (len(results[n].get("forced_low", [])) != k
                                 or results[n].get("low_from_step", 0) != step)]


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "system": platform.platform()}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="configurations: " + ", ".join(c["name"] for c in CONFIGS))
    ap.add_argument("--build-dir", default=os.environ.get("PRISM_BUILD_DIR", os.path.join(ROOT, "build-release")),
                    help="where prismd, prism-agent and libprism.so were built (default build-release)")
    ap.add_argument("--out", default=HERE, help="where results.json, loss.png and runs/ go (default: this folder)")
    ap.add_argument("--readme", default=None,
                    help="the README whose table is rewritten (default: OUT/README.md when OUT is this folder)")
    ap.add_argument("--configs", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--smoke", action="store_true", help="the CI smoke test's tiny settings")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the sweep, loss.png and the README section from results.json only")
    ap.add_argument("--fresh", action="store_true",
                    help="start OUT/results.json afresh (needed when it holds results of other settings)")
    ap.add_argument("--replicate", action="append", default=[], metavar="DIR",
                    help="another seed's --out folder (made with these settings but --seed): its held-out losses "
                         "go into results.json (replicates) and the report's table by seed; repeatable; kept "
                         "by later runs with the same settings")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--static-low", type=int, default=None,
                    help="blocks the static plans put low when there is no prism-int8 result (without it and "
                         "without a prism-int8 result, the static plans are refused)")
    ap.add_argument("--config-timeout-s", type=float, default=None,
                    help="most seconds one configuration may take (default: 120 with --smoke, else 20 x steps + 600)")
    for key, value in FULL.items():
        if key == "max_files":
            ap.add_argument("--max-files", type=int, default=None, help="only the first N files of each split")
            continue
        ap.add_argument("--" + key.replace("_", "-"), type=type(value), default=None,
                        help=f"(default {value}; smoke {SMOKE[key]})")
    args = ap.parse_args(argv)
    base = SMOKE if args.smoke else FULL
    args.settings = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in base.items()}
    names = args.configs.split(",") if args.configs else [c["name"] for c in CONFIGS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"--configs: unknown configuration {unknown[0]!r} (known: {', '.join(BY_NAME)})")
    args.names = [c["name"] for c in CONFIGS if c["name"] in names]
    if args.config_timeout_s is None:
        args.config_timeout_s = 120.0 if args.smoke else 20.0 * args.settings["steps"] + 600
    args.build_dir = os.path.abspath(args.build_dir)
    args.out = os.path.abspath(args.out)
    if args.readme is None and args.out == HERE:
        args.readme = os.path.join(HERE, "README.md")
    return args


def static_plan(results, args):
    """(blocks the static plans put low, where that number came from, the step they go low from):
    prism-int8's final count and first low step, else --static-low from step 0; RuntimeError when
    there is neither."""
    prism = results.get("prism-int8")
    if prism:
        return prism["final_low_blocks"], "prism-int8", first_low_step(prism) or 0
    if args.static_low is not None:
        return args.static_low, "--static-low", 0
    raise RuntimeError("the static plans put as many blocks low as prism-int8 ended with, and there is no "
                       "prism-int8 result: run prism-int8 first (in this run or into the same --out), or give "
                       "--static-low N")


def main(argv=None):
    args = parse_args(argv)
    # SIGTERM (a test's timeout, a job scheduler) unwinds like an error: each run's finally stops
    # its prismd, agents and trainers, which are in process groups of their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = args.settings
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.json")
    if args.report_only:
        # The report of what results.json holds, whatever settings it was made with.
        if not os.path.exists(results_path):
            sys.exit(f"run.py: --report-only: no {results_path}")
        old = previous_doc(results_path)
        results = old.get("configs", {})
        key, last_evals = old["settings"], old.get("last_evals", settings["last_evals"])
    else:
        statics = [n for n in args.names if n.startswith("static-")]
        settings["corpus"] = corpus_key(settings)
        key, last_evals = settings_key(settings), settings["last_evals"]
        results = load_results(results_path, key, args.fresh)
        old = previous_doc(results_path) if results else None
        if statics and "prism-int8" not in results and "prism-int8" not in args.names and args.static_low is None:
            sys.exit(f"run.py: {statics[0]} puts as many blocks low as prism-int8 ended with, and {results_path} "
                     "has no prism-int8 result: add prism-int8 to --configs, or give --static-low N")
    # The replicates are read (and a bad --replicate refused) before anything runs.
    reps = replicates(args.replicate, key, old)
    old_sweep = old.get("sweep") if old else None
    failures = []
    ran = []  # the configurations run now
    if not args.report_only:
        need = [os.path.join(args.build_dir, p) for p in ("service/prismd", "agent/prism-agent", "lib/libprism.so",
                                                            "service/prismctl")]
        missing = [p for p in need if not os.path.exists(p)]
        if missing:
            sys.exit(f"run.py: {missing[0]} is missing: build prismd, prism-agent, prism and prismctl in --build-dir")
        for name in args.names:
            ran.append(name)
            cfg = BY_NAME[name]
            static_low, source, low_from = None, None, 0
            run = None
            t0 = time.monotonic()
            print(f"run.py: {name} ...", file=sys.stderr, flush=True)
            try:
                if cfg["prism"] in ("static-first", "static-random"):
                    static_low, source, low_from = static_plan(results, args)
                run = Run(cfg, settings, args, static_low, low_from)
                if cfg["prism"]:
                    run.start_prism()
                ranks = run.train()
                prismd = run.prismd_record() if cfg["prism"] else None
            except RuntimeError as e:
                print(f"run.py: {name} failed: {e}", file=sys.stderr, flush=True)
                failures.append(name)
                results.pop(name, None)
                continue
            finally:
                if run is not None:
                    run.stop()
            results[name] = summarize(cfg, ranks, settings, prismd, (static_low, source), run.forced, low_from)
            r = results[name]
            print(f"run.py: {name}: held-out loss {r['held_out_loss']:.4f}, low share {100 * r['low_share']:.1f}%, "
                  f"{r['step_seconds']:.3f} s/step, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            drop_stale_statics(results)
            write_results(results_path, key, last_evals, results, reps=reps)
    if not args.report_only:
        drop_stale_statics(results)
    swept, why = sweep(args, results)
    if swept is None and old_sweep and "prism-int8" in results and "prism-int8" not in ran:
        swept, why = old_sweep, None  # the sweep of the same prism-int8 run, made before
    if swept is None:
        print(f"run.py: no sweep: {why}", file=sys.stderr)
    # A run that ran nothing keeps the date and machine of the results it rewrites.
    doc = write_results(results_path, key, last_evals, results, swept, why, None if ran else old, reps)
    report.write(args.out, doc, args.readme)
    if failures:
        sys.exit(f"run.py: failed: {', '.join(failures)}")


def drop_stale_statics(results):
    """Drops (and says so) the static-* results stale_statics names."""
    for name in stale_statics(results):
        print(f"run.py: dropping {name}: it forced {len(results[name]['forced_low'])} blocks low, prism-int8 ended "
              f"with {results['prism-int8']['final_low_blocks']}; run it again", file=sys.stderr, flush=True)
        del results[name]


def replicates(dirs, key, old):
    """The replicates results.json carries: those of the previous doc (same settings; old is None
    after --fresh), then each DIR's results.json summarized (held-out loss, low share, blocks low
    at the end per configuration), keyed by its seed. Exits when a DIR's settings differ from key
    in anything but the seed, or it has key's seed."""
    reps = dict(old.get("replicates") or {}) if old else {}
    for d in dirs:
        path = os.path.join(os.path.abspath(d), "results.json")
        if not os.path.exists(path):
            sys.exit(f"run.py: --replicate {d}: no {path}")
        other = previous_doc(path)
        theirs = other.get("settings") or {}
        differ = settings_differ(theirs, key, ignore=("seed",))
        if differ:
            sys.exit(f"run.py: --replicate {d}: made with other settings (they differ in: {', '.join(differ)})")
        if theirs.get("seed") == key.get("seed"):
            sys.exit(f"run.py: --replicate {d}: seed {key.get('seed')} is this results.json's own seed")
        reps[str(theirs["seed"])] = {
            "generated": other.get("generated"),
            "configs": {n: {"held_out_loss": r["held_out_loss"], "low_share": r["low_share"],
                            "final_low_blocks": r["final_low_blocks"]}
                        for n, r in (other.get("configs") or {}).items()}}
    return {k: reps[k] for k in sorted(reps, key=int)}


def write_results(path, key, last_evals, results, swept=None, why=None, old=None, reps=None):
    ordered = {c["name"]: results[c["name"]] for c in CONFIGS if c["name"] in results}
    doc = {"generated": old["generated"] if old else
           datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": old["machine"] if old else machine(), "settings": key, "last_evals": last_evals,
           "configs": ordered, "sweep": swept, "no_sweep": why if swept is None else None,
           "replicates": reps or {}}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return doc


if __name__ == "__main__":
    main()
