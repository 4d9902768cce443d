#!/usr/bin/python3
"""Keeps a real prismd holding the jobs the dashboard's browser tests and benchmark look at, fed
by real gRPC agents (grpcio with the message classes protoc generated at build time, as
tests/integration/test_grpc.py uses them).

Starts prismd on free loopback ports (scratch data dir; TLS with --tls-cert/--tls-key), or
connects to a running one (--grpc ADDR --http ADDR). Jobs:
  train  2 ranks, 48 named blocks ("model.layers.N.attn" / ".mlp"), device profiles, calibration
         errors, a loss every step; rank 1 reports each step 4 steps after rank 0 and never
         acknowledges a map, so it lags; a few "wandering" blocks change sensitivity now and then,
         the others keep theirs.
  1k     1 rank, 1,000 named blocks.
  10k    1 rank, 10,000 named blocks (steps at --big-step-ms).
  hybrid 4 ranks in two device classes, "fast" (ranks 0, 1: the V100 profile of examples/hybrid/)
         and "slow" (ranks 2, 3: the T4 profile), the 48-block GPT layout of
         examples/hybrid/gpt48.plan.json with its cost figures, and every step that example's
         gradient and tensor statistics; once the job exists its config is PATCHed to hybrid
         true with the example's link and force_bf16_blocks, so a decision plans (the same plan
         at every later decision: the inputs do not change). Ready once the plan is in force.
Every job reports one step per --step-ms and decides every 5 steps, so that a change made over
REST (overrides, config) takes effect at the next decision, about a second later. --churn JOB,..
makes those jobs' maps change at every decision (one map event per decision: the live-update
benchmark).

When every job has made its first decision it prints ONE JSON line on stdout:
  {"http": "127.0.0.1:PORT", "scheme": "http"|"https", "grpc": "...", "jobs": {"train": ID, ...},
   "tokens": {ID: TOKEN}, "blocks": {ID: N}, "stable_low": {ID: [block ids]}, "step_ms": ...,
   "hybrid_classes": {"fast": [ranks], "slow": [ranks]}}
then keeps reporting until --steps steps per job or --seconds have passed, stdin reaches its end
(the parent went away) or SIGTERM/SIGINT comes; then it closes the streams, stops the prismd it
started and exits 0. Everything it waits for is bounded."""

import argparse
import json
import math
import os
import queue
import signal
import ssl
import sys
import threading
import time
import urllib.request


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("PRISM_BUILD_DIR", "build"),
                   help="build directory holding service/prismd and python-gen (default: $PRISM_BUILD_DIR)")
    p.add_argument("--grpc", help="gRPC address of a running prismd (then --http too); default: start one")
    p.add_argument("--http", help="HTTP address of that prismd")
    p.add_argument("--tls-cert", help="PEM certificate: prismd serves TLS (started or given)")
    p.add_argument("--tls-key", help="PEM key of --tls-cert (to start prismd)")
    p.add_argument("--jobs", default="train,1k,10k,hybrid", help="which jobs to feed (train, 1k, 10k, hybrid)")
    p.add_argument("--prefix", default="dash", help="job ids are PREFIX-train, PREFIX-1k, PREFIX-10k, PREFIX-hybrid")
    p.add_argument("--step-ms", type=int, default=200, help="one step per this many ms (train, 1k)")
    p.add_argument("--big-step-ms", type=int, default=1000, help="one step per this many ms (10k)")
    p.add_argument("--steps", type=int, default=5000, help="steps per job at most")
    p.add_argument("--seconds", type=float, default=900, help="run at most this long after ready")
    p.add_argument("--churn", default="", help="jobs (train, 1k, 10k) whose map changes at every decision")
    return p.parse_args()


ARGS = parse_args()
os.environ["PRISM_BUILD_DIR"] = ARGS.build
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import grpc  # noqa: E402
import test_grpc  # noqa: E402  (Prismd; it also puts build/python-gen on sys.path)
from prism.v1 import prism_pb2 as pb  # noqa: E402

WAIT_S = 30
DECIDE_EVERY = 5  # update_interval_steps
CONFIG = {"warmup_steps": DECIDE_EVERY, "update_interval_steps": DECIDE_EVERY, "history_window": 3,
          "apply_lag_steps": 1, "min_steps_between_switches": 0, "step_timeout_ms": 2000}
STOP = threading.Event()


def log(*words):
    print("feed:", *words, file=sys.stderr, flush=True)


class Stream:
    """One rank's Connect stream, open until closed (no deadline): messages go out through a
    queue; a reader thread hands each reply to on_reply."""

    def __init__(self, channel, token, on_reply):
        self.outbox = queue.Queue()
        self.on_reply = on_reply
        connect = channel.stream_stream("/prism.v1.PolicyService/Connect",
                                        request_serializer=pb.AgentMessage.SerializeToString,
                                        response_deserializer=pb.ServiceMessage.FromString)
        self.replies = connect(self._requests(), metadata=[("authorization", "Bearer " + token)])
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self):
        for _ in range(10_000_000):
            m = self.outbox.get()
            if m is None:
                return
            yield m

    def _read(self):
        try:
            for m in self.replies:
                self.on_reply(m)
        except grpc.RpcError as e:
            if not STOP.is_set():
                log("stream ended:", e.code(), e.details())
        self.ended.set()

    def send(self, **kind):
        self.outbox.put(pb.AgentMessage(**kind))

    def close(self):
        self.outbox.put(None)
        self.ended.wait(timeout=WAIT_S)


def unit(seed):
    """A fixed pseudo-random number in [0, 1) for an integer seed (same every run)."""
    x = math.sin(seed * 12.9898 + 78.233) * 43758.5453
    return x - math.floor(x)


class Job:
    """One fed job: its layout, the norms its blocks report and its rank streams."""

    def __init__(self, kind, job_id, names, world_size, period_s, churn):
        self.kind, self.id, self.names = kind, job_id, names
        self.world_size, self.period_s, self.churn = world_size, period_s, churn
        self.token = "tok-" + job_id
        self.n = len(names)
        # Base level per block: high (stays bf16), low (goes to the low precision), middle
        # (ambiguous: stays bf16). Wanderers swap between high and low now and then.
        self.base = []
        for i in range(self.n):
            u = unit(i + 7 * len(job_id))
            wave = 0.5 + 0.5 * math.sin(i / max(self.n, 1) * 6.283 * 3)
            if u < 0.4 * wave + 0.15:
                self.base.append(2.0 + 2.0 * unit(i + 1000))   # high: rel well above 1.2
            elif u < 0.85:
                self.base.append(0.05 + 0.25 * unit(i + 2000))  # low: rel well below 0.4
            else:
                self.base.append(0.9 + 0.3 * unit(i + 3000))   # middle
        self.wanderers = set(range(5, self.n, 12))  # one block in twelve
        self.stable_low = [i for i in range(self.n) if self.base[i] < 0.5 and i not in self.wanderers]
        self.lagging_rank = 1  # (in a job of one rank: none)
        self.steps_sent = 0
        self.map_version = 0
        self.ready = threading.Event()
        self.streams = []

    def norms(self, step, rank):
        """The norms rank reports at step: the base levels, a wanderer swapped while its phase
        is odd (phase: 20 steps, or one decision when churning; wanderers run at 1, 2 or 3 phases per
        swap), a little per-rank noise."""
        span = DECIDE_EVERY if self.churn else 20
        phase = step // span
        out = []
        for i, b in enumerate(self.base):
            if i in self.wanderers and ((phase + i // 12) // (1 + (i // 12) % 3)) % 2 == 1:
                b = 3.0 if b < 0.5 else 0.1
            if self.churn and i % 7 == phase % 7:
                b = 3.0 if b < 0.5 else 0.1
            out.append(b * (1.0 + 0.04 * (unit(step * 31 + i * 7 + rank) - 0.5)))
        return out

    def loss(self, step):
        return 0.9 + 2.6 * math.exp(-step / 350.0) + 0.05 * (unit(step + 17) - 0.5)

    def step_report(self, step, rank):
        """What rank reports at step: every block's gradient figures from norms()."""
        norms = self.norms(step, rank)
        return pb.StepReport(step=step, loss=self.loss(step), blocks=[
            pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=n * 0.1, mean=0.0, variance=n * n / 1e4, numel=4096)
            for i, n in enumerate(norms)])

    def after_first_update(self, prismd):
        """Called once, when rank 0 took the job's first map (before ready): nothing to do."""

    def layout(self):
        fingerprint = bytes((len(self.id) * 37 + i * 11 + self.n) % 256 for i in range(32))
        return pb.ModelLayout(fingerprint=fingerprint, model_id="dashboard-feed/" + self.kind, blocks=[
            pb.BlockInfo(id=i, name=name, param_bytes_bf16=(2 << 20) * (1 + i % 3))
            for i, name in enumerate(self.names)])

    def device(self, rank):
        return pb.DeviceProfile(device_class="train-h100", device_name="NVIDIA H100 80GB HBM3 (fed)",
                                memory_bytes=85899345920, bf16_ops_per_second=9.0e14,
                                fp16_ops_per_second=9.0e14, int8_ops_per_second=1.8e15,
                                fp8_ops_per_second=1.8e15, h2d_bytes_per_second=2.5e10 - rank * 1e9)


EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "hybrid")
HYBRID_CLASSES = {"fast": "v100-32gb.profile.json", "slow": "t4-16gb.profile.json"}


class HybridJob(Job):
    """A job of two device classes that prismd plans for (issue 15, DESIGN 11): the GPT example's
    layout, costs and statistics, the same every step."""

    def __init__(self, job_id, period_s):
        with open(os.path.join(EXAMPLES, "gpt48.plan.json")) as f:
            self.example = json.load(f)
        self.example["blocks"].sort(key=lambda b: b["id"])
        self.profiles = {}
        for cls, name in HYBRID_CLASSES.items():
            with open(os.path.join(EXAMPLES, name)) as f:
                self.profiles[cls] = json.load(f)
        super().__init__("hybrid", job_id, [b["name"] for b in self.example["blocks"]], 4, period_s, False)
        self.lagging_rank = None
        self.stable_low = []

    @staticmethod
    def rank_class(rank):
        return "fast" if rank < 2 else "slow"

    def layout(self):
        fingerprint = bytes((len(self.id) * 41 + i * 13 + self.n) % 256 for i in range(32))
        return pb.ModelLayout(fingerprint=fingerprint, model_id="dashboard-feed/hybrid", blocks=[
            pb.BlockInfo(id=b["id"], name=b["name"], param_bytes_bf16=int(b["param_bytes_bf16"]), flops=int(b["flops"]),
                         activation_bytes_bf16=int(b["activation_bytes_bf16"]), state_bytes=int(b["state_bytes"]))
            for b in self.example["blocks"]])

    def device(self, rank):
        p = self.profiles[self.rank_class(rank)]
        return pb.DeviceProfile(
            device_class=self.rank_class(rank), device_name=p["device_name"] + " (fed)", memory_bytes=p["memory_bytes"],
            bf16_ops_per_second=p["bf16_ops_per_second"], fp16_ops_per_second=p["fp16_ops_per_second"],
            int8_ops_per_second=p["int8_ops_per_second"], fp8_ops_per_second=p["fp8_ops_per_second"],
            quantize_cost=pb.LinearCost(**p["quantize_cost"]), cast_cost=pb.LinearCost(**p["cast_cost"]),
            h2d_bytes_per_second=p["h2d_bytes_per_second"])

    def step_report(self, step, rank):
        blocks = self.example["blocks"]
        return pb.StepReport(step=step, loss=self.loss(step), blocks=[
            pb.BlockGradStats(block_id=b["id"], l2_norm=b["stats"]["g_l2"], max_abs=b["stats"]["g_max_abs"],
                              numel=int(b["stats"]["w_numel"])) for b in blocks], tensor_stats=[
            pb.BlockTensorStats(block_id=b["id"], x_l2=s["x_l2"], x_max_abs=s["x_max_abs"], x_numel=int(s["x_numel"]),
                                w_l2=s["w_l2"], w_max_abs=s["w_max_abs"], w_numel=int(s["w_numel"]),
                                y_numel=int(s["y_numel"])) for b in blocks for s in (b["stats"],)])

    def after_first_update(self, prismd):
        """Turns hybrid plans on for the job (its token), effective at the next decision."""
        link, cfg = self.example["link"], self.example["config"]
        body = {"hybrid": True, "hybrid_link_bytes_per_second": link["bytes_per_second"],
                "hybrid_link_latency_seconds": link["latency_seconds"],
                "hybrid_memory_fraction": cfg["memory_fraction"], "hybrid_gamma": cfg["gamma"],
                "hybrid_low_format": cfg["low_format"], "force_bf16_blocks": cfg["force_bf16_blocks"]}
        rest_call(prismd, "PATCH", "/v1/jobs/%s/config" % self.id, body, self.token)


HEARTBEAT_FIELDS = set(pb.Heartbeat.DESCRIPTOR.fields_by_name)


class Rank:
    """One agent of a job: Hello, calibration when asked, acks (unless lagging), heartbeats."""

    def __init__(self, prismd, job, rank, lag):
        self.job, self.rank, self.lag = job, rank, lag
        self.last_step = 0
        self.dropped = 0
        self.stream = Stream(prismd.channel, job.token, self.on_reply)
        self.stream.send(hello=pb.Hello(job_id=job.id, rank=rank, world_size=job.world_size,
                                        node="node-%s-%d" % (job.kind, rank), token=job.token,
                                        device=job.device(rank), layout=job.layout()))

    def on_reply(self, m):
        kind = m.WhichOneof("kind")
        if kind == "welcome" and m.welcome.calibration_needed and self.rank == 0:
            self.stream.send(calibration=pb.CalibrationReport(format=pb.INT8, samples=4, errors=[
                pb.BlockError(block_id=i, relative_error=0.001 + 0.012 * unit(i + 5000))
                for i in range(self.job.n)]))
        elif kind == "update":
            u = m.update
            if self.rank == 0:
                self.job.map_version = max(self.job.map_version, u.map_version)
                self.job.ready.set()
            if not self.lag:
                self.stream.send(ack=pb.Ack(map_version=u.map_version, applied_step=u.effective_step))
        elif kind == "error":
            log(self.job.id, "rank", self.rank, "error:", m.error.message)

    def report(self, step):
        """Reports step; a lagging rank reports the step `lag` behind (each step completes when it
        does, well within step_timeout_ms), so prismd sees it `lag` steps behind the other."""
        s = step - self.lag
        if s < 1:
            return
        self.stream.send(step_report=self.job.step_report(s, self.rank))
        self.last_step = s
        if self.lag:
            self.dropped = s // 40  # the trainer-side counter its agent reports

    def heartbeat(self):
        fields = {"unix_time_ms": int(time.time() * 1000), "last_step": self.last_step}
        # The trainer-side counters, where this build's Heartbeat has them.
        if "trainer_reports_dropped" in HEARTBEAT_FIELDS:
            fields["trainer_reports_dropped"] = self.dropped
        if "trainer_late_switches" in HEARTBEAT_FIELDS:
            fields["trainer_late_switches"] = 3 if self.lag else 0
        self.stream.send(heartbeat=pb.Heartbeat(**fields))


def make_jobs():
    kinds = [k for k in ARGS.jobs.split(",") if k]
    churn = set(k for k in ARGS.churn.split(",") if k)
    jobs = []
    for kind in kinds:
        job_id = "%s-%s" % (ARGS.prefix, kind)
        if kind == "train":
            names = ["model.layers.%d.%s" % (i // 2, "attn" if i % 2 == 0 else "mlp") for i in range(48)]
            jobs.append(Job(kind, job_id, names, 2, ARGS.step_ms / 1000, kind in churn))
        elif kind == "1k":
            parts = ("attn.qkv", "attn.out", "mlp.up", "mlp.down")
            names = ["encoder.layers.%d.%s" % (i // 4, parts[i % 4]) for i in range(1000)]
            jobs.append(Job(kind, job_id, names, 1, ARGS.step_ms / 1000, kind in churn))
        elif kind == "10k":
            names = ["model.layers.%d.mlp.experts.%d" % (i // 100, i % 100) for i in range(10000)]
            jobs.append(Job(kind, job_id, names, 1, ARGS.big_step_ms / 1000, kind in churn))
        elif kind == "hybrid":
            jobs.append(HybridJob(job_id, ARGS.step_ms / 1000))
        else:
            sys.exit("feed: unknown job kind %r (train, 1k, 10k, hybrid)" % kind)
    return jobs


def rest_url(prismd, path):
    ctx = ssl._create_unverified_context() if prismd.tls else None
    return "%s://%s%s" % ("https" if prismd.tls else "http", prismd.http_addr, path), ctx


def rest_call(prismd, method, path, body, token):
    """One REST request with a JSON body and the job's token; raises unless prismd says 200."""
    url, ctx = rest_url(prismd, path)
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method, headers={
        "content-type": "application/json", "authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=WAIT_S, context=ctx) as r:
        if r.status != 200:
            raise RuntimeError("%s %s: HTTP %d" % (method, path, r.status))


def rest_until(prismd, path, ready):
    """GETs path until ready(doc) holds (REST shows the snapshot published just after an
    update: a moment later than the agents see it); bounded: 400 x 50 ms. A plain GET: whether
    answers conform to the OpenAPI document is the integration tests' business, not the feed's."""
    url, ctx = rest_url(prismd, path)
    for _ in range(400):
        with urllib.request.urlopen(url, timeout=WAIT_S, context=ctx) as r:
            if ready(json.loads(r.read())):
                return
        time.sleep(0.05)
    raise RuntimeError("%s never became ready" % path)


def drive(job, prismd, deadline):
    """Reports one step per period to every rank of job until STOP, the step bound or deadline.
    Paced by a monotonic schedule: a slow step does not shift the next ones, and a feed that fell
    more than a step behind starts afresh rather than sending the missed steps in a burst."""
    ranks = [Rank(prismd, job, r, lag=4 if r == job.lagging_rank else 0) for r in range(job.world_size)]
    job.streams = ranks
    due = time.monotonic()
    for step in range(1, ARGS.steps + 1):
        if STOP.is_set() or time.monotonic() > deadline():
            break
        for r in ranks:
            r.report(step)
        if step % 5 == 0:
            for r in ranks:
                r.heartbeat()
        job.steps_sent = step
        due += job.period_s
        wait = due - time.monotonic()
        if wait < -job.period_s:  # more than a step behind (a loaded machine): no burst to catch up
            due, wait = time.monotonic(), 0
        if wait > 0 and STOP.wait(wait):
            break
    for r in ranks:
        r.stream.close()


def main():
    tls = ARGS.tls_cert
    started = None
    if ARGS.grpc:
        prismd = test_grpc.Prismd.__new__(test_grpc.Prismd)  # a handle on a running prismd
        prismd.grpc_addr, prismd.http_addr, prismd.tls = ARGS.grpc, ARGS.http, tls
        if tls:
            with open(tls, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            prismd.channel = grpc.secure_channel(prismd.grpc_addr, creds,
                                                 options=[("grpc.ssl_target_name_override", "localhost")])
        else:
            prismd.channel = grpc.insecure_channel(prismd.grpc_addr)
        grpc.channel_ready_future(prismd.channel).result(timeout=WAIT_S)
    else:
        extra = ("--tls-cert", tls, "--tls-key", ARGS.tls_key) if tls else ()
        prismd = started = test_grpc.Prismd(*extra, config_extra=CONFIG, tls=tls)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: STOP.set())
    jobs = make_jobs()
    ready_at = [None]

    def deadline():
        return ready_at[0] + ARGS.seconds if ready_at[0] else time.monotonic() + ARGS.seconds

    threads = [threading.Thread(target=drive, args=(job, prismd, deadline), daemon=True) for job in jobs]
    for t in threads:
        t.start()
    code = 0
    try:
        for job in jobs:
            if not job.ready.wait(timeout=120):
                raise RuntimeError("%s made no decision in 120 s" % job.id)
            # REST shows the snapshot published just after the update: wait for it there too.
            rest_until(prismd, "/v1/jobs", lambda d: any(
                j["job_id"] == job.id and j["map_version"] >= 1 for j in d["jobs"]))
            job.after_first_update(prismd)
        for job in jobs:
            if isinstance(job, HybridJob):  # planned at a decision after the PATCH: in force
                rest_until(prismd, "/v1/jobs/%s/plan" % job.id, lambda d: d["status"] == "planned")
        ready_at[0] = time.monotonic()
        print(json.dumps({
            "http": prismd.http_addr, "scheme": "https" if tls else "http", "grpc": prismd.grpc_addr,
            "jobs": {job.kind: job.id for job in jobs}, "tokens": {job.id: job.token for job in jobs},
            "blocks": {job.id: job.n for job in jobs},
            "stable_low": {job.id: job.stable_low[:50] for job in jobs},
            "step_ms": {job.id: round(job.period_s * 1000) for job in jobs},
            "hybrid_classes": {c: [r for r in range(4) if HybridJob.rank_class(r) == c] for c in HYBRID_CLASSES},
            "decide_every_steps": DECIDE_EVERY}), flush=True)

        def watch_stdin():
            try:
                while sys.stdin.readline():
                    pass
            except (OSError, ValueError):
                pass
            STOP.set()
        threading.Thread(target=watch_stdin, daemon=True).start()
        for t in threads:
            while t.is_alive() and not STOP.is_set():
                t.join(timeout=0.5)
    except Exception as e:  # noqa: BLE001 - said once, then the cleanup below
        log("failed:", e)
        code = 1
    finally:
        STOP.set()
        for t in threads:
            t.join(timeout=WAIT_S)
        if started:
            status = started.stop()
            if status != 0 or code:
                log("prismd exited with", status, "; its log:\n" + started.logs()[-4000:])
        else:
            prismd.channel.close()
    log("done:", ", ".join("%s %d steps, map_version %d" % (j.id, j.steps_sent, j.map_version) for j in jobs))
    return code


if __name__ == "__main__":
    sys.exit(main())
