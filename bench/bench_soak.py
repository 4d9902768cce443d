#!/usr/bin/python3
"""Soak of prismd (DESIGN 13: 1,000 churning agents for 10 minutes; RSS, descriptors and threads
flat after warm-up), against the real prismd on loopback.

What runs, all in one asyncio loop of this process (Python grpcio's aio API):
  - agent slots: JOBS x RANKS of them (default 50 x 20 = 1,000), each running one simulated agent
    after another for the whole soak. An agent opens its own channel (its own TCP connection),
    opens a Connect stream, sends a Hello (job id, rank, world_size, token also as `authorization`
    metadata, a ModelLayout of BLOCKS blocks with the job's fingerprint), sends StepReports on the
    job's step clock (one step every --step-s seconds, the same for every rank of the job), reads
    every ServiceMessage, and after a random number of steps vanishes: with a half-close (then reads
    to the end and expects status OK), by cancelling the call mid-stream, or by closing its channel
    mid-stream. After a short random gap the next agent of that rank takes its place.
  - REST readers (--rest-readers at once): GET /v1/jobs, /v1/jobs/J/blocks,
    /v1/jobs/J/telemetry?limit=5 and /metrics, one connection per request.
  - SSE clients (--sse-clients at once): GET /v1/jobs/J/events held open for a random 1 to 20 s,
    then closed; the map versions they see are recorded too.
  - a sampler: prismd's VmRSS and Threads (/proc/PID/status) and open descriptors (/proc/PID/fd)
    every --sample-s seconds, with prismd's connected agents and decisions from /metrics.

Every map an agent saw (the Welcome's map and every PrecisionUpdate: job, map_version ->
decided_step and the precision of each block) is recorded; one version seen with two different
maps is a failure at once.

At the end, once every client is gone: /metrics and GET /v1/jobs must count no agent connected,
and prismd's sockets must be back to the start's and its other fds to the start's plus one
telemetry file per job (both waited for, bounded); then prismd is killed with SIGKILL, restarted
on the same --data-dir, and for every job GetBlockMap and REST must show a map_version at least
the highest any client saw, with the same precisions where it is that version, and exactly the
map prismd served just before the kill; earlier versions an agent saw are rebuilt from the
per-block switch history where it still covers them. DESIGN 7: "a map is durable before it is
sent", so nothing a client saw may be lost.

"Flat after warm-up": the largest RSS, fd count and thread count of the last --judge-minutes
minutes are compared with the largest of the warm-up (the minutes up to --warmup-minutes), with the
tolerances printed; larger is a failure.

Exit status 0 when every check passed, 1 otherwise (what failed is printed), 2 for bad usage.
--quick: 4 jobs x 5 ranks for 30 s, the same checks except flatness (too short to judge), for CI.
"""

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

RSS_TOLERANCE = 0.10      # last minutes' max RSS <= warm-up max * (1 + this) + RSS_SLACK_MIB
RSS_SLACK_MIB = 4.0
FD_TOLERANCE = 0.10       # same for open descriptors (they follow the agents connected) ...
FD_SLACK = 16
THREAD_TOLERANCE = 0.0    # ... and threads, which should not move at all
THREAD_SLACK = 2
START_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 60.0    # clients gone after the end of the soak
DISCONNECT_TIMEOUT_S = 60.0  # prismd counts no agent connected
SETTLE_TIMEOUT_S = 30.0   # no more decisions once the agents are gone
HALF_CLOSE_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 10.0
FD_IDLE_SLACK = 4         # fds with every client gone: at most the start's + one per job + this
HISTORY_ROWS = 20         # switches per block that GET /v1/jobs/J/blocks/B shows (rest.c HISTORY_MAX)


def now():
    return time.monotonic()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- prismd and /proc


class Prismd:
    """The real prismd on loopback; restartable on the same data dir."""

    def __init__(self, binary, workdir, config, tokens):
        self.binary = binary
        self.dir = workdir
        self.config_path = os.path.join(workdir, "config.json")
        with open(self.config_path, "w") as f:
            json.dump(config, f)
        # Every job's token provisioned, as a cluster deploys prismd (DESIGN 6): no trust on first
        # use, and the jobs are not counted against the one address all these agents come from
        # (--max-auto-jobs-per-peer counts the jobs an address auto-creates without one).
        self.tokens_path = os.path.join(workdir, "tokens.json")
        with open(self.tokens_path, "w") as f:
            json.dump(tokens, f)
        self.proc = None
        self.grpc_addr = self.http_addr = None

    def start(self):
        self.grpc_addr = "127.0.0.1:%d" % free_port()
        self.http_addr = "127.0.0.1:%d" % free_port()
        self.log = open(os.path.join(self.dir, "prismd.log"), "a")
        self.proc = subprocess.Popen(
            [self.binary, "--grpc-listen", self.grpc_addr, "--http-listen", self.http_addr,
             "--data-dir", os.path.join(self.dir, "data"), "--config", self.config_path,
             "--job-tokens-file", self.tokens_path, "--require-provisioned-tokens", "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc:
            self.log.close()
        return self.proc.returncode if self.proc else None

    def log_tail(self, n=4000):
        try:
            with open(os.path.join(self.dir, "prismd.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def proc_sample(pid):
    """(VmRSS in MiB, open descriptors, threads, CPU seconds) of a process, or None."""
    try:
        rss = threads = None
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024.0
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir("/proc/%d/fd" % pid))
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return rss, fds, threads, cpu
    except (OSError, ValueError, IndexError):
        return None


def fd_kinds(pid):
    """Open descriptors of a process by kind: socket, pipe, anon_inode, file."""
    kinds = {}
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return kinds
    for name in names:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


# ---------------------------------------------------------------- HTTP on loopback


async def http_get(addr, path, timeout=HTTP_TIMEOUT_S):
    """(status, body) of GET http://addr/path with one connection; (None, error) on failure."""
    host, port = addr.rsplit(":", 1)
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
        writer.write(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, addr)).encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(-1), timeout)
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if b"transfer-encoding: chunked" in head.lower():
            body = dechunk(body)
        return status, body.decode(errors="replace")
    except (OSError, asyncio.TimeoutError, ValueError, IndexError) as e:
        return None, repr(e)
    finally:
        if writer:
            writer.close()


def dechunk(body):
    out, i = [], 0
    for _ in range(1000000):
        j = body.find(b"\r\n", i)
        if j < 0:
            break
        n = int(body[i:j].split(b";")[0], 16)
        if n == 0:
            break
        out.append(body[j + 2:j + 2 + n])
        i = j + 2 + n + 2
    return b"".join(out)


def metric_sum(text, name):
    """Sum of every sample of a metric family (with any labels); None when it is absent."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


# ---------------------------------------------------------------- the soak


class Soak:
    def __init__(self, args, pb, grpc):
        self.a = args
        self.pb = pb
        self.grpc = grpc
        self.rng = random.Random(args.seed)
        self.jobs = ["soak-j%02d" % j for j in range(args.jobs)]
        self.token = {job: "token-" + job for job in self.jobs}
        self.fingerprint = {job: hashlib.sha256(("soak-model-" + job).encode()).digest() for job in self.jobs}
        self.t0 = None            # the step clock's origin
        self.end_at = None
        self.stopping = False
        # What the clients saw: job -> {map_version: (decided_step, precisions tuple)}.
        self.seen = {job: {} for job in self.jobs}
        self.sse_max = {job: 0 for job in self.jobs}
        self.failures = []
        self.conflicts = 0
        # Counters, cumulative; the sampler turns them into per-minute figures.
        self.c = dict(sessions=0, live=0, reports=0, updates=0, welcomes=0, halfclose=0, cancel=0, drop=0,
                      rest=0, rest_bad=0, sse=0, sse_events=0, unexpected=0, refused=0, backwards=0)
        self.unexpected = {}      # what ended an agent unexpectedly -> count
        self.samples = []         # (t, rss, fds, threads, prismd_cpu, own_cpu, connected, decisions, counters)
        self.idle_start = None    # proc_sample before any client

    def fail(self, what):
        if len(self.failures) < 50:
            self.failures.append(what)
        print("FAIL:", what, flush=True)

    def note_unexpected(self, what):
        self.c["unexpected"] += 1
        self.unexpected[what] = self.unexpected.get(what, 0) + 1

    # ---- statistics every rank of a job sends for a step: hot blocks change every 4 steps

    def step_stats(self, job_ix, step):
        epoch = step // 4
        r = random.Random(job_ix * 1000003 + epoch)
        hot = set(r.sample(range(self.a.blocks), max(1, self.a.blocks * 3 // 8)))
        out = []
        for b in range(self.a.blocks):
            l2 = 4.0 if b in hot else 0.3
            out.append(self.pb.BlockGradStats(block_id=b, l2_norm=l2, max_abs=l2 * 0.01, mean=0.0,
                                              variance=l2 * l2 / 65536.0, numel=65536, nonfinite=0))
        return out

    def current_step(self):
        return int((now() - self.t0) / self.a.step_s) + 1

    def record_map(self, job, version, decided_step, blocks, where):
        if version == 0:
            return
        precisions = tuple((b.block_id, b.precision) for b in blocks)
        known = self.seen[job].get(version)
        if known is None:
            self.seen[job][version] = (decided_step, precisions)
        elif known != (decided_step, precisions):
            self.conflicts += 1
            self.fail("job %s map_version %d seen as two maps (%s): %r and %r" %
                      (job, version, where, known, (decided_step, precisions)))

    # ---- one agent

    async def agent(self, job_ix, rank):
        pb, grpc = self.pb, self.grpc
        job = self.jobs[job_ix]
        self.c["sessions"] += 1
        self.c["live"] += 1
        mode = self.rng.choices(["halfclose", "cancel", "drop"], weights=[4, 3, 3])[0]
        steps = self.rng.randint(self.a.min_steps, self.a.max_steps)
        channel = grpc.aio.insecure_channel(self.prismd.grpc_addr,
                                            options=[("grpc.use_local_subchannel_pool", 1)])
        connect = channel.stream_stream("/prism.v1.PolicyService/Connect",
                                        request_serializer=pb.AgentMessage.SerializeToString,
                                        response_deserializer=pb.ServiceMessage.FromString)
        call = connect(metadata=(("authorization", "Bearer " + self.token[job]),))
        last_version = [0]
        ended_ok = [False]

        async def read_all():
            for _ in range(10 ** 9):
                m = await call.read()
                if m is grpc.aio.EOF:
                    ended_ok[0] = True
                    return
                kind = m.WhichOneof("kind")
                if kind == "welcome":
                    self.c["welcomes"] += 1
                    u = m.welcome.map
                elif kind == "update":
                    self.c["updates"] += 1
                    u = m.update
                elif kind == "error":
                    self.note_unexpected("Error %d: %s" % (m.error.code, m.error.message[:80]))
                    continue
                else:
                    continue
                if u.map_version < last_version[0]:
                    self.c["backwards"] += 1
                    self.fail("job %s rank %d: map_version went from %d back to %d on one stream" %
                              (job, rank, last_version[0], u.map_version))
                last_version[0] = u.map_version
                self.record_map(job, u.map_version, u.decided_step, u.blocks, "agent")

        reader = asyncio.ensure_future(read_all())
        try:
            layout = pb.ModelLayout(fingerprint=self.fingerprint[job], model_id="soak-model-" + job,
                                    blocks=[pb.BlockInfo(id=b, name="model.layers.%d" % b, param_bytes_bf16=1 << 20)
                                            for b in range(self.a.blocks)])
            await call.write(pb.AgentMessage(hello=pb.Hello(job_id=job, rank=rank, world_size=self.a.ranks,
                                                            node="soak-node-%d" % rank, token=self.token[job],
                                                            layout=layout)))
            sent_step = 0
            for _ in range(steps):
                if self.stopping or reader.done():
                    break
                step = self.current_step()
                if step <= sent_step:
                    step = sent_step + 1
                    await asyncio.sleep(max(0.0, self.t0 + (step - 1) * self.a.step_s - now()))
                    if self.stopping or reader.done():
                        break
                await call.write(pb.AgentMessage(step_report=pb.StepReport(
                    step=step, blocks=self.step_stats(job_ix, step))))
                self.c["reports"] += 1
                sent_step = step
            if reader.done():
                reader.result()  # raises what ended the stream
                self.note_unexpected("the stream ended before the agent left")
            elif mode == "halfclose":
                await call.done_writing()
                await asyncio.wait_for(asyncio.shield(reader), HALF_CLOSE_TIMEOUT_S)
                code = await call.code()
                if code != grpc.StatusCode.OK or not ended_ok[0]:
                    self.note_unexpected("half-close ended with %s" % code)
                else:
                    self.c["halfclose"] += 1
            elif mode == "cancel":
                call.cancel()
                self.c["cancel"] += 1
            else:
                await channel.close(grace=None)
                self.c["drop"] += 1
        except grpc.aio.AioRpcError as e:
            self.note_unexpected("%s: %s" % (e.code(), (e.details() or "")[:80]))
        except asyncio.TimeoutError:
            self.note_unexpected("half-close: no end of stream within %.0f s" % HALF_CLOSE_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - anything else is a finding, reported with its name
            self.note_unexpected("%s: %s" % (type(e).__name__, str(e)[:80]))
        finally:
            if not reader.done():
                call.cancel()
            try:
                await asyncio.wait_for(reader, 10)
            except (asyncio.CancelledError, asyncio.TimeoutError, grpc.aio.AioRpcError, Exception):
                pass
            await channel.close(grace=None)
            self.c["live"] -= 1

    async def slot(self, job_ix, rank):
        # Staggered start so the first Hellos do not all land at once.
        await asyncio.sleep(self.rng.uniform(0, min(5.0, self.a.seconds / 4)))
        while not self.stopping:
            await self.agent(job_ix, rank)
            await asyncio.sleep(self.rng.uniform(0.0, self.a.gap_s))

    # ---- REST and SSE

    async def rest_reader(self):
        await asyncio.sleep(self.rng.uniform(0, 2))
        while not self.stopping:
            job = self.rng.choice(self.jobs)
            path = self.rng.choice(["/v1/jobs", "/v1/jobs/%s/blocks" % job,
                                    "/v1/jobs/%s/telemetry?limit=5" % job, "/metrics"])
            status, body = await http_get(self.prismd.http_addr, path)
            self.c["rest"] += 1
            if status != 200 and not (status == 404 and path != "/v1/jobs" and path != "/metrics"):
                self.c["rest_bad"] += 1
                if status is None or status >= 500:
                    self.fail("GET %s answered %s %s" % (path, status, body[:200]))
            await asyncio.sleep(self.rng.uniform(0, 0.5))

    async def sse_client(self):
        await asyncio.sleep(self.rng.uniform(0, 5))
        host, port = self.prismd.http_addr.rsplit(":", 1)
        while not self.stopping:
            job = self.rng.choice(self.jobs)
            hold = min(self.rng.uniform(1, 20), max(0.1, self.end_at - now()))
            writer = None
            self.c["sse"] += 1
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), HTTP_TIMEOUT_S)
                writer.write(("GET /v1/jobs/%s/events HTTP/1.1\r\nHost: %s\r\n\r\n" %
                              (job, self.prismd.http_addr)).encode())
                await writer.drain()
                until = now() + hold
                for _ in range(10 ** 6):
                    left = until - now()
                    if left <= 0:
                        break
                    try:
                        line = await asyncio.wait_for(reader.readline(), left)
                    except asyncio.TimeoutError:
                        break
                    if not line:
                        break
                    if line.startswith(b"data: {"):
                        d = json.loads(line[6:])
                        self.c["sse_events"] += 1
                        self.sse_max[job] = max(self.sse_max[job], d["map_version"])
            except (OSError, asyncio.TimeoutError, ValueError) as e:
                self.c["rest_bad"] += 1
                self.note_unexpected("SSE: %r" % e)
            finally:
                if writer:
                    writer.close()
            await asyncio.sleep(self.rng.uniform(0, 2))

    # ---- the sampler

    async def sampler(self):
        own0 = time.process_time()
        for _ in range(10 ** 9):
            if self.stopping:
                return
            t = now() - self.t0
            p = proc_sample(self.prismd.proc.pid)
            status, text = await http_get(self.prismd.http_addr, "/metrics")
            connected = metric_sum(text, "prism_agents_connected") if status == 200 else None
            decisions = metric_sum(text, "prism_decisions_total") if status == 200 else None
            if p and t < self.a.seconds:
                self.samples.append((t, p[0], p[1], p[2], p[3], time.process_time() - own0, connected, decisions,
                                     dict(self.c)))
            await asyncio.sleep(self.a.sample_s)

    # ---- the whole run

    async def run(self, prismd):
        self.prismd = prismd
        self.idle_start = proc_sample(prismd.proc.pid)
        self.idle_kinds = fd_kinds(prismd.proc.pid)
        self.t0 = now()
        self.end_at = self.t0 + self.a.seconds
        sampler = asyncio.ensure_future(self.sampler())
        tasks = [asyncio.ensure_future(self.slot(j, r)) for j in range(self.a.jobs) for r in range(self.a.ranks)]
        tasks += [asyncio.ensure_future(self.rest_reader()) for _ in range(self.a.rest_readers)]
        tasks += [asyncio.ensure_future(self.sse_client()) for _ in range(self.a.sse_clients)]
        next_print = self.t0 + 60
        while now() < self.end_at:
            await asyncio.sleep(min(1.0, self.end_at - now()))
            if now() >= next_print:
                next_print += 60
                s = self.samples[-1] if self.samples else None
                if s:
                    print("  t=%4.0f s  rss=%.1f MiB fds=%d threads=%d connected=%s sessions=%d" %
                          (s[0], s[1], s[2], s[3], s[6], s[8]["sessions"]), flush=True)
            if prismd.proc.poll() is not None:
                self.fail("prismd exited during the soak with %s" % prismd.proc.returncode)
                break
        self.stopping = True
        done, pending = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
        if pending:
            self.fail("%d client tasks still running %.0f s after the end" % (len(pending), DRAIN_TIMEOUT_S))
            for t in pending:
                t.cancel()
        for t in done:
            if t.exception():
                self.fail("a client task failed: %r" % t.exception())
        await sampler
        if self.c["live"]:
            self.fail("%d agents still live" % self.c["live"])


# ---------------------------------------------------------------- end checks


async def wait_disconnected(soak, prismd):
    """/metrics and GET /v1/jobs count no agent connected, waited for with a bound."""
    deadline = now() + DISCONNECT_TIMEOUT_S
    last = None
    t_start = now()
    for _ in range(100000):
        s1, metrics = await http_get(prismd.http_addr, "/metrics")
        s2, jobs = await http_get(prismd.http_addr, "/v1/jobs")
        if s1 == 200 and s2 == 200:
            connected = metric_sum(metrics, "prism_agents_connected")
            listed = json.loads(jobs)
            listed = listed.get("jobs", listed) if isinstance(listed, dict) else listed
            rest_connected = sum(j.get("agents_connected", 0) for j in listed)
            last = (connected, rest_connected)
            if connected == 0 and rest_connected == 0:
                print("end: no agent connected (/metrics and /v1/jobs), %.1f s after the last client left" %
                      (now() - t_start))
                return True
        if now() > deadline:
            break
        await asyncio.sleep(0.2)
    soak.fail("agents still counted as connected %.0f s after every client left: /metrics %s, /v1/jobs %s" %
              (DISCONNECT_TIMEOUT_S, last[0] if last else "?", last[1] if last else "?"))
    return False


async def wait_settled(prismd):
    """Waits until prism_decisions_total holds still for 3 s (steps still open time out first)."""
    deadline = now() + SETTLE_TIMEOUT_S
    last, since = None, now()
    for _ in range(100000):
        _, text = await http_get(prismd.http_addr, "/metrics")
        d = metric_sum(text, "prism_decisions_total")
        if d != last:
            last, since = d, now()
        elif now() - since >= 3.0:
            return True
        if now() > deadline:
            return False
        await asyncio.sleep(0.2)
    return False


async def block_maps(soak, prismd):
    """job -> (map_version, decided_step, precisions) from GetBlockMap, and the REST map versions."""
    pb, grpc = soak.pb, soak.grpc
    out, rest = {}, {}
    async with grpc.aio.insecure_channel(prismd.grpc_addr) as channel:
        get = channel.unary_unary("/prism.v1.PolicyService/GetBlockMap",
                                  request_serializer=pb.BlockMapRequest.SerializeToString,
                                  response_deserializer=pb.BlockMap.FromString)
        for job in soak.jobs:
            try:
                m = await get(pb.BlockMapRequest(job_id=job), timeout=HTTP_TIMEOUT_S,
                              metadata=(("authorization", "Bearer " + soak.token[job]),))
                out[job] = (m.map_version, m.decided_step, tuple((b.block_id, b.precision) for b in m.blocks))
            except grpc.aio.AioRpcError as e:
                out[job] = None
                soak.fail("GetBlockMap %s: %s %s" % (job, e.code(), e.details()))
            status, body = await http_get(prismd.http_addr, "/v1/jobs/%s/blocks" % job)
            if status == 200:
                d = json.loads(body)
                rest[job] = (d.get("map_version"), tuple((b["id"], b["precision"]) for b in d.get("blocks", [])))
            else:
                rest[job] = (None, ())
    return out, rest


async def wait_up(prismd):
    deadline = now() + START_TIMEOUT_S
    for _ in range(100000):
        if prismd.proc.poll() is not None:
            return False
        status, _ = await http_get(prismd.http_addr, "/readyz", timeout=2)
        if status == 200:
            return True
        if now() > deadline:
            return False
        await asyncio.sleep(0.05)
    return False


def precision_names(pb, precisions):
    return ",".join(pb.Precision.Name(p).replace("PRECISION_", "").lower() for _, p in precisions)


async def idle_figures(soak, prismd):
    """prismd's figures once every client is gone, against those before the first client: its
    sockets must come back to the start's (+ FD_IDLE_SLACK), and its other fds to the start's plus
    one telemetry file per job (kept open by design) + FD_IDLE_SLACK; waited for with a bound, since
    a closed connection is noticed asynchronously (an SSE stream at its next keep-alive)."""
    start, start_kinds = soak.idle_start, soak.idle_kinds
    sock_bound = start_kinds.get("socket", 0) + FD_IDLE_SLACK
    other_bound = start[1] - start_kinds.get("socket", 0) + len(soak.jobs) + FD_IDLE_SLACK
    t_start = now()
    deadline = t_start + DISCONNECT_TIMEOUT_S
    p = kinds = first = None
    for _ in range(100000):
        p = proc_sample(prismd.proc.pid)
        kinds = fd_kinds(prismd.proc.pid)
        if p is None:
            break
        if first is None:
            first = (p[1], kinds)
        sockets = kinds.get("socket", 0)
        if (sockets <= sock_bound and p[1] - sockets <= other_bound) or now() > deadline:
            break
        await asyncio.sleep(0.2)
    if p is None:
        soak.fail("prismd is gone")
        return
    print("end: with every client gone: rss %.1f MiB, %d fds %s, %d threads, %.1f s after the last client left "
          "(at first look %d fds %s; before the first client: rss %.1f MiB, %d fds %s, %d threads)" %
          (p[0], p[1], kinds, p[2], now() - t_start, first[0], first[1], start[0], start[1], start_kinds, start[2]))
    try:
        db = os.path.getsize(os.path.join(prismd.dir, "data", "prism.db"))
        wal = os.path.getsize(os.path.join(prismd.dir, "data", "prism.db-wal"))
        print("end: prism.db %.2f MiB, its WAL %.2f MiB" % (db / 1048576.0, wal / 1048576.0))
    except OSError:
        pass
    sockets = kinds.get("socket", 0)
    if sockets > sock_bound:
        soak.fail("prismd holds %d sockets %.0f s after every client left; %d at start (+%d allowed)" %
                  (sockets, DISCONNECT_TIMEOUT_S, start_kinds.get("socket", 0), FD_IDLE_SLACK))
    if p[1] - sockets > other_bound:
        soak.fail("prismd holds %d fds other than sockets with every client gone; at most %d expected (%d at "
                  "start + %d jobs' telemetry files + %d)" % (p[1] - sockets, other_bound,
                                                            start[1] - start_kinds.get("socket", 0),
                                                            len(soak.jobs), FD_IDLE_SLACK))


async def history_check(soak, prismd, maps):
    """Every map version an agent saw, rebuilt block by block from prismd's switch history (GET
    /v1/jobs/J/blocks/B: the last HISTORY_ROWS switches, each with the map_version it went out in),
    for the versions that history still covers. Returns (checked versions, uncovered versions)."""
    pb = soak.pb
    checked = uncovered = 0
    for job in soak.jobs:
        m = maps.get(job)
        if not m or not soak.seen[job]:
            continue
        current = dict(m[2])
        history = {}
        for b in current:
            status, body = await http_get(prismd.http_addr, "/v1/jobs/%s/blocks/%d" % (job, b))
            if status != 200:
                soak.fail("GET /v1/jobs/%s/blocks/%d after restart: %s %s" % (job, b, status, body[:200]))
                return checked, uncovered
            rows = json.loads(body).get("history", [])
            history[b] = sorted(rows, key=lambda r: r["map_version"])
        for version, (_, precisions) in sorted(soak.seen[job].items()):
            if version > m[0]:
                continue  # already failed above
            ok = covered = True
            for block, precision in precisions:
                rows = history.get(block)
                if rows is None:
                    soak.fail("job %s: block %d, seen in map_version %d, is not in the map after restart" %
                              (job, block, version))
                    ok = False
                    continue
                want = pb.Precision.Name(precision).lower()
                if not rows:
                    have = pb.Precision.Name(current[block]).lower()
                elif len(rows) >= HISTORY_ROWS and version < rows[0]["map_version"]:
                    covered = False
                    continue
                else:
                    before = [r for r in rows if r["map_version"] <= version]
                    have = before[-1]["to"] if before else rows[0]["from"]
                if have != want:
                    ok = False
                    soak.fail("job %s map_version %d block %d: agents saw %s, prismd's switch history after kill -9 "
                              "gives %s" % (job, version, block, want, have))
            if not ok:
                continue
            if covered:
                checked += 1
            else:
                uncovered += 1
    return checked, uncovered


async def end_checks(soak, prismd):
    pb = soak.pb
    await wait_disconnected(soak, prismd)
    await idle_figures(soak, prismd)
    if not await wait_settled(prismd):
        print("end: decisions still moving %.0f s after the agents left" % SETTLE_TIMEOUT_S)
    before, _ = await block_maps(soak, prismd)
    seen_versions = sum(len(v) for v in soak.seen.values())
    print("end: the clients saw %d distinct map versions over %d jobs (highest per job: %s)" %
          (seen_versions, len(soak.jobs),
           " ".join("%d" % max(soak.seen[j], default=0) for j in soak.jobs)))
    t_kill = now()
    prismd.kill9()
    prismd.start()
    if not await wait_up(prismd):
        soak.fail("prismd did not come back on the same --data-dir after kill -9:\n" + prismd.log_tail())
        return
    print("end: kill -9, restarted on the same --data-dir, ready in %.2f s" % (now() - t_kill))
    after, rest = await block_maps(soak, prismd)
    exact = later = version0 = 0
    for job in soak.jobs:
        a, b = after.get(job), before.get(job)
        if a is None:
            continue
        if b is not None and b[0] == 0 and a[0] == 0 and a != b:
            version0 += 1  # no decision yet: nothing is durable before the first one (DESIGN 7)
        grpc_view = tuple((bid, pb.Precision.Name(p).lower()) for bid, p in a[2])
        if rest.get(job) != (a[0], grpc_view):
            soak.fail("job %s: REST shows map_version %s %s, GetBlockMap %d %s" %
                      (job, rest.get(job)[0], rest.get(job)[1], a[0], grpc_view))
        if b is not None and a != b and (b[0] > 0 or a[0] > 0):
            soak.fail("job %s: before kill -9 version %d [%s], after restart version %d [%s]" %
                      (job, b[0], precision_names(pb, b[2]), a[0], precision_names(pb, a[2])))
        seen = soak.seen[job]
        top = max(seen, default=0)
        top = max(top, soak.sse_max[job])
        if a[0] < top:
            soak.fail("job %s: a client saw map_version %d, after kill -9 prismd has %d" % (job, top, a[0]))
            continue
        hi = max(seen, default=0)
        if hi and a[0] == hi:
            if seen[hi][1] != a[2] or seen[hi][0] != a[1]:
                soak.fail("job %s map_version %d: agents saw step %d [%s], after kill -9 step %d [%s]" %
                          (job, hi, seen[hi][0], precision_names(pb, seen[hi][1]), a[1],
                           precision_names(pb, a[2])))
            else:
                exact += 1
        elif hi:
            later += 1
    if version0:
        print("end: %d jobs had no decision yet (map_version 0); after kill -9 they come back without their "
              "blocks (state is saved at decisions), which loses nothing an agent saw" % version0)
    checked, uncovered = await history_check(soak, prismd, after)
    print("end: after kill -9, every map version an agent saw rebuilt from the switch history: %d versions match, "
          "%d older than the last %d switches of a block (not checkable)" % (checked, uncovered, HISTORY_ROWS))
    print("end: after kill -9: %d jobs at exactly the highest map an agent saw (precisions equal), %d at a "
          "later version (decided after their last agent read), every job equal to its map before the kill"
          % (exact, later) if not soak.failures else
          "end: after kill -9: %d jobs matched the highest map an agent saw exactly, %d later" % (exact, later))


# ---------------------------------------------------------------- report


def report(soak, args):
    """Per-minute figures and the flatness check; returns False when flatness fails."""
    minute = args.minute_s
    rows = {}
    for s in soak.samples:
        m = int(s[0] // minute)
        rows.setdefault(m, []).append(s)
    print()
    print("# per %s: prismd's VmRSS, open fds and threads (min-max of the samples), agents connected"
          " (prismd's /metrics, min-max), and in the period: agent sessions started, decisions, map updates"
          " read, REST requests, SSE sessions; CPU seconds of prismd and of this client" %
          ("minute" if minute == 60 else "%g s" % minute))
    print("%-5s %-13s %-11s %-9s %-11s %8s %9s %8s %6s %5s %8s %8s" %
          ("min", "rss MiB", "fds", "threads", "connected", "sessions", "decisions", "updates", "rest", "sse",
           "cpu prismd", "cpu client"))
    prev = None
    per = []
    for m in sorted(rows):
        ss = rows[m]
        last = ss[-1]
        first_c = prev[8] if prev else {k: 0 for k in last[8]}
        first_d = prev[7] if prev else 0
        first_cpu = prev[4] if prev else 0
        first_own = prev[5] if prev else 0
        conn = [s[6] for s in ss if s[6] is not None]
        rss = [s[1] for s in ss]
        fds = [s[2] for s in ss]
        thr = [s[3] for s in ss]
        print("%-5d %5.1f-%-7.1f %4d-%-6d %3d-%-5d %4d-%-6d %8d %9d %8d %6d %5d %8.1f %8.1f" %
              (m + 1, min(rss), max(rss), min(fds), max(fds), min(thr), max(thr),
               min(conn) if conn else -1, max(conn) if conn else -1,
               last[8]["sessions"] - first_c["sessions"], (last[7] or 0) - (first_d or 0),
               last[8]["updates"] - first_c["updates"], last[8]["rest"] - first_c["rest"],
               last[8]["sse"] - first_c["sse"], last[4] - first_cpu, last[5] - first_own))
        per.append((m, max(rss), max(fds), max(thr)))
        prev = last
    c = soak.c
    print()
    print("totals: %d agent sessions (%d half-closed cleanly, %d cancelled, %d channel dropped), %d step reports, "
          "%d Welcomes, %d map updates read, %d REST requests (%d not 200), %d SSE sessions (%d events)" %
          (c["sessions"], c["halfclose"], c["cancel"], c["drop"], c["reports"], c["welcomes"], c["updates"],
           c["rest"], c["rest_bad"], c["sse"], c["sse_events"]))
    if soak.unexpected:
        print("agents ended unexpectedly %d times:" % c["unexpected"])
        for k, v in sorted(soak.unexpected.items(), key=lambda kv: -kv[1])[:20]:
            print("  %6d  %s" % (v, k))
    if args.quick:
        print("flatness: not judged in --quick (too short for a warm-up)")
        return True
    warm = [p for p in per if p[0] < args.warmup_minutes]
    judged = [p for p in per if p[0] >= len(per) - args.judge_minutes and p[0] >= args.warmup_minutes]
    if not warm or not judged:
        print("flatness: not judged (%d minutes; it needs more than --warmup-minutes %d)" %
              (len(per), args.warmup_minutes))
        return True
    ok = True
    for name, i, tol, slack in (("RSS MiB", 1, RSS_TOLERANCE, RSS_SLACK_MIB), ("fds", 2, FD_TOLERANCE, FD_SLACK),
                                ("threads", 3, THREAD_TOLERANCE, THREAD_SLACK)):
        w = max(p[i] for p in warm)
        j = max(p[i] for p in judged)
        bound = w * (1 + tol) + slack
        verdict = "flat" if j <= bound else "GREW"
        ok = ok and j <= bound
        print("flatness: %-8s warm-up (minutes 1-%d) max %.1f, last %d minutes max %.1f, bound %.1f "
              "(warm-up x %.2f + %g): %s" % (name, args.warmup_minutes, w, len(judged), j, bound, 1 + tol, slack,
                                             verdict))
    # The trend of RSS after warm-up, for the record (least squares over the samples).
    pts = [(s[0] / 60.0, s[1]) for s in soak.samples if s[0] >= args.warmup_minutes * minute]
    if len(pts) > 2:
        mx = sum(p[0] for p in pts) / len(pts)
        my = sum(p[1] for p in pts) / len(pts)
        sxx = sum((p[0] - mx) ** 2 for p in pts)
        slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else 0.0
        print("RSS trend after warm-up: %+.3f MiB per minute (least squares over %d samples)" % (slope, len(pts)))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prismd", help="path to the prismd binary")
    ap.add_argument("--quick", action="store_true", help="4 jobs x 5 ranks for 30 s, no flatness verdict")
    ap.add_argument("--build-dir", help="the build directory with python-gen/ (default: two levels above prismd)")
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the soak (default 10)")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=20, help="ranks per job = world_size (default 20)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks per job's layout (default 8)")
    ap.add_argument("--step-s", type=float, default=1.0, help="seconds per job step (default 1)")
    ap.add_argument("--min-steps", type=int, default=3, help="fewest steps an agent reports (default 3)")
    ap.add_argument("--max-steps", type=int, default=40, help="most steps an agent reports (default 40)")
    ap.add_argument("--gap-s", type=float, default=1.0, help="most seconds before an agent is replaced (default 1)")
    ap.add_argument("--rest-readers", type=int, default=4)
    ap.add_argument("--sse-clients", type=int, default=8)
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples of prismd (default 5)")
    ap.add_argument("--warmup-minutes", type=int, default=2)
    ap.add_argument("--judge-minutes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--config-extra", default="{}",
                    help="JSON object merged into prismd's policy config, e.g. '{\"warmup_steps\": 100000}'")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (data dir, prismd.log)")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.jobs, args.ranks, args.sample_s = 0.5, 4, 5, 1.0
        args.rest_readers, args.sse_clients, args.max_steps = 2, 2, 10
    args.seconds = args.minutes * 60
    args.minute_s = 10.0 if args.quick else 60.0
    if not (os.path.isfile(args.prismd) and os.access(args.prismd, os.X_OK)):
        print("bench_soak: %s is not an executable" % args.prismd, file=sys.stderr)
        return 2
    if args.jobs < 1 or args.ranks < 1 or args.blocks < 1 or args.min_steps < 1 or args.max_steps < args.min_steps:
        print("bench_soak: --jobs, --ranks, --blocks, --min-steps must be >= 1 and --max-steps >= --min-steps",
              file=sys.stderr)
        return 2
    build = args.build_dir or os.path.dirname(os.path.dirname(os.path.abspath(args.prismd)))
    sys.path.insert(0, os.path.join(build, "python-gen"))
    import grpc
    import grpc.aio  # noqa: F401
    from prism.v1 import prism_pb2 as pb

    config = {"warmup_steps": 4, "update_interval_steps": 2, "history_window": 2, "apply_lag_steps": 1,
              "min_steps_between_switches": 0, "hysteresis_margin": 0.05, "run_calibration": False,
              "step_timeout_ms": int(args.step_s * 500), "log_decisions": False}
    try:
        config.update(json.loads(args.config_extra))
    except (ValueError, TypeError, AttributeError):
        print("bench_soak: --config-extra: %r is not a JSON object" % args.config_extra, file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="prism-soak-")
    soak = Soak(args, pb, grpc)
    prismd = Prismd(args.prismd, workdir, config, soak.token)
    print("# prismd soak: %d jobs x %d ranks = %d agent slots, %d blocks, a step every %g s, agents live %d-%d "
          "steps; %d REST readers, %d SSE clients; %.1f minutes; %d online cores; config %s" %
          (args.jobs, args.ranks, args.jobs * args.ranks, args.blocks, args.step_s, args.min_steps,
           args.max_steps, args.rest_readers, args.sse_clients, args.minutes, os.cpu_count(), json.dumps(config)),
          flush=True)
    ok = False
    try:
        prismd.start()
        loop = asyncio.new_event_loop()
        if not loop.run_until_complete(wait_up(prismd)):
            soak.fail("prismd did not start:\n" + prismd.log_tail())
        else:
            loop.run_until_complete(soak.run(prismd))
            if prismd.proc.poll() is None:
                loop.run_until_complete(end_checks(soak, prismd))
        flat = report(soak, args)
        if soak.c["unexpected"]:
            soak.fail("agents ended %d times in a way they did not choose (above)" % soak.c["unexpected"])
        if not flat:
            soak.fail("RSS, fds or threads grew after warm-up (above)")
        ok = not soak.failures
        code = prismd.stop()
        if code not in (0, None) and prismd.proc.returncode != -signal.SIGKILL:
            soak.fail("prismd exited with %s after SIGTERM" % code)
            ok = False
        loop.close()
    finally:
        if prismd.proc and prismd.proc.poll() is None:
            prismd.proc.kill()
    if not ok:
        print("\nbench_soak: FAILED (%d):" % len(soak.failures))
        for f in soak.failures:
            print("  " + f)
        print("---- end of prismd's log (%s) ----\n%s" % (workdir, prismd.log_tail()))
    else:
        print("\nbench_soak: every check passed")
    if args.keep or not ok:
        print("scratch directory kept: %s" % workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
