#!/usr/bin/python3
"""prismd's gRPC service end to end, driven by a client that is not ours: Python grpcio with
message classes that protoc generated from proto/prism/v1/prism.proto at build time.

Starts the real prismd on free loopback ports with a scratch data dir. Every wait is bounded
(WAIT_S) and every loop is bounded in count; prismd is stopped in every path."""

import gzip
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

BUILD = os.environ.get("PRISM_BUILD_DIR", "build")
sys.path.insert(0, os.path.join(BUILD, "python-gen"))

import grpc  # noqa: E402
import openapi_check  # noqa: E402
from prism.v1 import prism_pb2 as pb  # noqa: E402

WAIT_S = 10
CONFIG = {"warmup_steps": 2, "update_interval_steps": 2, "history_window": 2, "apply_lag_steps": 3,
          "min_steps_between_switches": 0}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prismd:
    """The real prismd on free loopback ports."""

    def __init__(self, *extra, reuse=None, config_extra=None, tls=None):
        """reuse: a stopped Prismd whose directory (data dir, config) this one starts on."""
        self.dir = reuse.dir if reuse else tempfile.mkdtemp(prefix="prism-grpc-test-")
        config = os.path.join(self.dir, "config.json")
        if not reuse:
            with open(config, "w") as f:
                json.dump(dict(CONFIG, **(config_extra or {})), f)
        self.grpc_addr = "127.0.0.1:%d" % free_port()
        self.http_addr = "127.0.0.1:%d" % free_port()
        self.log = open(os.path.join(self.dir, "prismd.log"), "a+")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "service", "prismd"), "--grpc-listen", self.grpc_addr,
             "--http-listen", self.http_addr, "--data-dir", os.path.join(self.dir, "data"),
             "--config", config, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.tls = tls  # (cert PEM path) when prismd serves TLS
        if tls:
            with open(tls, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self.channel = grpc.secure_channel(self.grpc_addr, creds,
                                               options=[("grpc.ssl_target_name_override", "localhost")])
        else:
            self.channel = grpc.insecure_channel(self.grpc_addr)
        grpc.channel_ready_future(self.channel).result(timeout=WAIT_S)

    def http(self, path, method="GET", body=None, token=None, openapi=True):
        """(status, body) of a request to prismd's HTTP side, checked against prismd's OpenAPI
        document (openapi_check.py) unless openapi is False: an answer that echoes what a test
        planted (telemetry lines prismd did not write)."""
        scheme = "https" if self.tls else "http"
        req = urllib.request.Request("%s://%s%s" % (scheme, self.http_addr, path), method=method,
                                     data=body.encode() if isinstance(body, str) else body)
        if token:
            req.add_header("Authorization", "Bearer " + token)
        context = ssl.create_default_context(cafile=self.tls) if self.tls else None
        if context:
            context.check_hostname = False  # the certificate names localhost; we dial 127.0.0.1
        answer = openapi_check.urlopen(req, timeout=WAIT_S, context=context, check_answer=openapi)
        return answer.status, answer.body.decode()

    def json_until(self, path, ready):
        """GETs path until ready(body) holds; REST shows a snapshot published just after each
        change, so a client that saw an update may ask a moment early. Bounded: 200 x 25 ms."""
        for _ in range(200):
            status, body = self.http(path)
            doc = json.loads(body)
            if status == 200 and ready(doc):
                return doc
            time.sleep(0.025)
        raise AssertionError("%s never became ready: %s" % (path, body))

    def kill(self):
        """kill -9: no chance to flush or say goodbye. The files stay for a restart."""
        self.channel.close()
        self.proc.kill()
        self.proc.wait(timeout=WAIT_S)
        self.log.close()

    def stop(self):
        """Stops prismd (SIGTERM), removes its files and returns its exit status."""
        self.channel.close()
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.last_log = self.logs()
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def logs(self):
        if self.log.closed:
            return getattr(self, "last_log", "")
        self.log.seek(0)
        return self.log.read()


class Agent:
    """One rank's Connect stream: messages go in through a queue, replies come back in order."""

    def __init__(self, prismd, token=None):
        self.outbox = queue.Queue()
        connect = prismd.channel.stream_stream(
            "/prism.v1.PolicyService/Connect",
            request_serializer=pb.AgentMessage.SerializeToString,
            response_deserializer=pb.ServiceMessage.FromString)
        metadata = [("authorization", "Bearer " + token)] if token else None
        self.replies = connect(self._requests(), metadata=metadata, timeout=60)
        self.inbox = queue.Queue()
        self.done = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _requests(self):
        for _ in range(100000):
            m = self.outbox.get()
            if m is None:
                return
            yield m

    def _read(self):
        try:
            for m in self.replies:
                self.inbox.put(m)
        except grpc.RpcError as e:
            self.done = e
        self.inbox.put(None)

    def send(self, **kind):
        self.outbox.put(pb.AgentMessage(**kind))

    def hello(self, job, rank, world_size):
        self.send(hello=pb.Hello(job_id=job, rank=rank, world_size=world_size, node="node-%d" % rank))

    def step(self, step, norms):
        self.send(step_report=pb.StepReport(step=step, blocks=[
            pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100) for i, n in enumerate(norms)]))

    def next(self):
        m = self.inbox.get(timeout=WAIT_S)
        if m is None:
            raise EOFError(self.done)
        return m

    def next_update(self):
        """The next map update, past the config messages before it (prismd sends one after a
        calibration report of a format it still wanted); at most 16 of them."""
        for _ in range(16):
            m = self.next()
            if m.WhichOneof("kind") != "config":
                return m.update
        raise AssertionError("16 config messages and no update")

    def status(self):
        """Waits for the stream to end and returns its gRPC status code."""
        for _ in range(1000):
            if self.inbox.get(timeout=WAIT_S) is None:
                break
        return self.done.code() if self.done else grpc.StatusCode.OK

    def close(self):
        self.outbox.put(None)


def block_map(prismd, job, token=None):
    get = prismd.channel.unary_unary("/prism.v1.PolicyService/GetBlockMap",
                                     request_serializer=pb.BlockMapRequest.SerializeToString,
                                     response_deserializer=pb.BlockMap.FromString)
    metadata = [("authorization", "Bearer " + token)] if token else None
    return get(pb.BlockMapRequest(job_id=job), metadata=metadata, timeout=WAIT_S)


def precisions(blocks):
    return [(b.block_id, b.precision) for b in blocks]


class GrpcTest(unittest.TestCase):
    def setUp(self):
        self.prismd = Prismd()
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def agent(self, token=None):
        a = Agent(self.prismd, token)
        self.agents.append(a)
        return a

    def test_two_jobs_every_rank_gets_each_update_with_the_same_effective_step(self):
        jobs = {"job-a": ("tok-a", [(2.0, 1.0), (4.0, 1.0)]),   # merged norms 3 and 1
                "job-b": ("tok-b", [(1.0, 2.0), (1.0, 4.0)])}   # merged norms 1 and 3
        ranks = {}
        for job, (token, _) in jobs.items():
            ranks[job] = [self.agent(token) for _ in range(2)]
            for rank, a in enumerate(ranks[job]):
                a.hello(job, rank, 2)
                w = a.next()
                self.assertEqual(w.WhichOneof("kind"), "welcome")
                self.assertEqual(w.welcome.config.warmup_steps, 2)
                self.assertEqual(w.welcome.config.apply_lag_steps, 3)
                self.assertEqual(w.welcome.map.map_version, 0)
                self.assertEqual(len(w.welcome.map.blocks), 0)
        for step in (1, 2):
            for job, (_, norms) in jobs.items():
                for rank, a in enumerate(ranks[job]):
                    a.step(step, norms[rank])
        # Step 2 is the first decision: rel 1.5 / 0.5, grad scores 0.75 / 0.25.
        expected = {"job-a": [(0, pb.BF16), (1, pb.INT8)], "job-b": [(0, pb.INT8), (1, pb.BF16)]}
        for job in jobs:
            updates = [a.next() for a in ranks[job]]
            for u in updates:
                self.assertEqual(u.WhichOneof("kind"), "update")
                self.assertEqual(u.update.job_id, job)
                self.assertEqual(u.update.map_version, 1)
                self.assertEqual(u.update.decided_step, 2)
                self.assertEqual(u.update.effective_step, 5)
                self.assertTrue(u.update.full)
                self.assertEqual(precisions(u.update.blocks), expected[job])
            self.assertEqual(updates[0].update, updates[1].update)
            m = block_map(self.prismd, job, jobs[job][0])
            self.assertEqual((m.job_id, m.map_version, m.decided_step, m.effective_step), (job, 1, 2, 5))
            self.assertEqual(precisions(m.blocks), expected[job])
            self.assertEqual(m.blocks[0].sensitivity, 0.75 if job == "job-a" else 0.25)
            self.assertEqual(m.blocks[0].reason, pb.REASON_NONE if job == "job-a" else pb.REASON_SCORE)

    def test_a_step_completes_on_its_timeout_when_a_rank_is_missing(self):
        self.prismd.stop()
        CONFIG["step_timeout_ms"] = 300
        try:
            self.prismd = Prismd()
        finally:
            del CONFIG["step_timeout_ms"]
        a = self.agent()
        a.hello("job-t", 0, 2)
        a.next()
        a.step(1, (3.0, 1.0))
        started = time.monotonic()
        a.step(2, (3.0, 1.0))
        u = a.next()  # rank 1 never reports: step 2 completes after 300 ms
        self.assertGreaterEqual(time.monotonic() - started, 0.25)
        self.assertEqual(u.update.decided_step, 2)
        self.assertEqual(precisions(u.update.blocks), [(0, pb.BF16), (1, pb.INT8)])

    def test_wrong_token_is_permission_denied(self):
        a = self.agent("right")
        a.hello("job-x", 0, 1)
        a.next()
        b = self.agent("wrong")
        b.hello("job-x", 0, 1)
        self.assertEqual(b.status(), grpc.StatusCode.PERMISSION_DENIED)
        with self.assertRaises(grpc.RpcError) as e:
            block_map(self.prismd, "job-x", "wrong")
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        # Reads need no token unless prismd runs with --require-read-token (DESIGN 6; test_auth.py).
        self.assertEqual(block_map(self.prismd, "job-x").job_id, "job-x")
        self.assertEqual(block_map(self.prismd, "job-x", "right").job_id, "job-x")

    def test_unknown_job_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as e:
            block_map(self.prismd, "no-such-job")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("no-such-job", e.exception.details())

    def test_unknown_job_without_auto_create_is_not_found(self):
        self.prismd.stop()
        self.prismd = Prismd("--auto-create", "false")
        a = self.agent()
        a.hello("job-new", 0, 1)
        self.assertEqual(a.status(), grpc.StatusCode.NOT_FOUND)

    def test_report_before_hello_is_failed_precondition(self):
        a = self.agent()
        a.step(1, (1.0,))
        self.assertEqual(a.status(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_bad_hello_is_invalid_argument(self):
        cases = [dict(job_id="", rank=0, world_size=1), dict(job_id="a b", rank=0, world_size=1),
                 dict(job_id="j", rank=2, world_size=2), dict(job_id="j0", rank=0, world_size=0)]
        for hello in cases:
            a = self.agent()
            a.send(hello=pb.Hello(**hello))
            self.assertEqual(a.status(), grpc.StatusCode.INVALID_ARGUMENT, hello)

    def test_malformed_report_gets_an_error_and_the_stream_goes_on(self):
        a = self.agent()
        a.hello("job-m", 0, 1)
        a.next()
        a.send(step_report=pb.StepReport(step=1, blocks=[
            pb.BlockGradStats(block_id=0, l2_norm=-1.0, max_abs=1.0, numel=4)]))
        e = a.next()
        self.assertEqual(e.WhichOneof("kind"), "error")
        self.assertEqual(e.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("l2_norm -1 is negative", e.error.message)
        a.send(step_report=pb.StepReport(step=1, blocks=[
            pb.BlockGradStats(block_id=0, l2_norm=1.0, max_abs=1.0, numel=4),
            pb.BlockGradStats(block_id=0, l2_norm=1.0, max_abs=1.0, numel=4)]))
        e = a.next()
        self.assertIn("block 0 appears twice", e.error.message)
        a.step(1, (3.0, 1.0))
        a.step(2, (3.0, 1.0))
        self.assertEqual(a.next().update.map_version, 1)

    def test_oversized_message_is_resource_exhausted(self):
        self.prismd.stop()
        self.prismd = Prismd("--max-message-bytes", "2048")
        a = self.agent()
        a.hello("job-big", 0, 1)
        a.next()
        a.step(1, [1.0] * 200)  # about 6 KB
        self.assertEqual(a.status(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.prismd.json_until("/v1/jobs", lambda d: True)
        for _ in range(200):  # counted, bounded wait for the snapshot
            metrics = self.prismd.http("/metrics")[1]
            if "prism_agent_streams_broken_total 1" in metrics:
                break
            time.sleep(0.025)
        self.assertIn("prism_agent_streams_broken_total 1\n", metrics)

    def test_too_many_blocks_is_refused_with_an_error(self):
        self.prismd.stop()
        self.prismd = Prismd("--max-blocks", "3")
        a = self.agent()
        a.hello("job-n", 0, 1)
        a.next()
        a.step(1, (1.0, 1.0, 1.0, 1.0))
        e = a.next()
        self.assertEqual(e.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        self.assertIn("limit", e.error.message)

    def test_watch_gets_the_current_map_then_each_update(self):
        a = self.agent()
        a.hello("job-w", 0, 1)
        a.next()
        a.step(1, (3.0, 1.0))
        a.step(2, (3.0, 1.0))
        self.assertEqual(a.next().update.map_version, 1)
        watch = self.prismd.channel.unary_stream("/prism.v1.PolicyService/Watch",
                                                 request_serializer=pb.WatchRequest.SerializeToString,
                                                 response_deserializer=pb.PrecisionUpdate.FromString)
        updates = watch(pb.WatchRequest(job_id="job-w", after_version=0), timeout=WAIT_S)
        first = next(updates)
        self.assertEqual((first.map_version, first.decided_step), (1, 2))
        # Block 1 turns sensitive: rel 1.5 fills its window, s = 0.75 >= 0.6 takes it back to
        # bf16 at step 4; block 0 (s = 0.25, not below 0.3 - 0.1) stays bf16.
        a.step(3, (1.0, 3.0))
        a.step(4, (1.0, 3.0))
        self.assertEqual(a.next().update.map_version, 2)
        second = next(updates)
        self.assertEqual((second.map_version, second.decided_step, second.effective_step), (2, 4, 7))
        self.assertEqual(precisions(second.blocks), [(0, pb.BF16), (1, pb.BF16)])
        updates.cancel()

    def test_readyz_is_ready_while_the_policy_thread_runs(self):
        status, body = self.prismd.http("/readyz")
        self.assertEqual((status, json.loads(body)["status"]), (200, "ready"))

    def test_sigterm_ends_streams_with_unavailable_and_exits_0(self):
        a = self.agent()
        a.hello("job-s", 0, 1)
        a.next()
        self.prismd.proc.send_signal(signal.SIGTERM)
        self.assertEqual(a.status(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(self.prismd.proc.wait(timeout=WAIT_S), 0)


    def test_restart_after_kill_9_keeps_map_versions_and_cooldowns(self):
        self.prismd.stop()
        self.prismd = Prismd(config_extra={"min_steps_between_switches": 4})
        a = self.agent("tok-k")
        a.hello("job-k", 0, 1)
        a.next()
        a.step(1, (3.0, 1.0))
        a.step(2, (3.0, 1.0))
        first = a.next().update
        self.assertEqual((first.map_version, first.decided_step), (1, 2))
        self.assertEqual(precisions(first.blocks), [(0, pb.BF16), (1, pb.INT8)])
        a.close()
        self.agents.remove(a)
        self.prismd.kill()
        self.prismd = Prismd(reuse=self.prismd)
        m = block_map(self.prismd, "job-k", "tok-k")
        self.assertEqual((m.map_version, m.decided_step, m.effective_step), (1, 2, 5))
        self.assertEqual(precisions(m.blocks), [(0, pb.BF16), (1, pb.INT8)])
        self.assertEqual(m.blocks[1].last_switch_step, 2)
        self.assertEqual(m.blocks[1].reason, pb.REASON_SCORE)
        # The token came back with the job.
        with self.assertRaises(grpc.RpcError) as e:
            block_map(self.prismd, "job-k", "other")
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        b = self.agent("tok-k")
        b.hello("job-k", 0, 1)
        w = b.next().welcome
        self.assertEqual(w.map.map_version, 1)
        self.assertEqual(precisions(w.map.blocks), [(0, pb.BF16), (1, pb.INT8)])
        b.step(2, (1.0, 30.0))  # already in the saved state: dropped as late
        # Block 1 turns sensitive, but its switch at step 2 holds it until step 6 (cooldown 4).
        for step in (3, 4, 5, 6):
            b.step(step, (1.0, 3.0))
        u = b.next().update
        self.assertEqual((u.map_version, u.decided_step, u.effective_step), (2, 6, 9))
        self.assertEqual(precisions(u.blocks), [(0, pb.BF16), (1, pb.BF16)])
        self.assertEqual(u.blocks[1].last_switch_step, 6)

    def test_calibration_is_cached_by_fingerprint(self):
        fingerprint = bytes(range(32))
        layout = pb.ModelLayout(fingerprint=fingerprint, model_id="m", blocks=[
            pb.BlockInfo(id=0, name="h.0", param_bytes_bf16=1000), pb.BlockInfo(id=1, name="h.1", param_bytes_bf16=3000)])
        a = self.agent()
        a.send(hello=pb.Hello(job_id="job-c1", rank=0, world_size=1, layout=layout))
        self.assertTrue(a.next().welcome.calibration_needed)
        a.send(calibration=pb.CalibrationReport(format=pb.INT8, samples=4, errors=[
            pb.BlockError(block_id=0, relative_error=0.01), pb.BlockError(block_id=1, relative_error=0.05)]))
        b = self.agent()
        b.send(hello=pb.Hello(job_id="job-c2", rank=0, world_size=1, layout=layout))
        w = b.next().welcome
        self.assertFalse(w.calibration_needed)
        self.assertEqual(len(w.cached_errors), 1)
        self.assertEqual(w.cached_errors[0].format, pb.INT8)
        self.assertEqual(sorted((e.block_id, e.relative_error) for e in w.cached_errors[0].errors),
                         [(0, 0.01), (1, 0.05)])
        # The cached error weighs in: block 1's grad score 0.25, error 0.05/0.05 -> s = 0.7*0.25 + 0.3 = 0.475
        # (ambiguous, so it stays bf16 and no update is sent: poll the map, bounded).
        b.step(1, (3.0, 1.0))
        b.step(2, (3.0, 1.0))
        for _ in range(200):
            m = block_map(self.prismd, "job-c2")
            if len(m.blocks) == 2 and m.blocks[1].HasField("sensitivity"):
                break
            time.sleep(0.05)
        self.assertEqual(precisions(m.blocks), [(0, pb.BF16), (1, pb.BF16)])
        self.assertAlmostEqual(m.blocks[1].sensitivity, 0.475, places=12)
        # REST names the blocks as the layout did.
        doc = self.prismd.json_until("/v1/jobs/job-c2/blocks", lambda d: len(d["blocks"]) == 2)
        self.assertEqual([b["name"] for b in doc["blocks"]], ["h.0", "h.1"])
        self.assertEqual(self.prismd.json_until("/v1/jobs/job-c2/blocks/1", lambda d: True)["name"], "h.1")

    def two_jobs_decided(self):
        """Two jobs of two ranks each, through their first decision (see the first test)."""
        norms = {"job-a": [(2.0, 1.0), (4.0, 1.0)], "job-b": [(1.0, 2.0), (1.0, 4.0)]}
        ranks = {job: [self.agent() for _ in range(2)] for job in norms}
        for job, agents in ranks.items():
            for rank, a in enumerate(agents):
                a.hello(job, rank, 2)
                a.next()
        for step in (1, 2):
            for job, agents in ranks.items():
                for rank, a in enumerate(agents):
                    a.step(step, norms[job][rank])
        for agents in ranks.values():
            for a in agents:
                self.assertEqual(a.next().update.map_version, 1)
        return ranks

    def test_rest_shows_the_same_map_as_grpc(self):
        self.two_jobs_decided()
        jobs = self.prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 2 and
                                      all(j["map_version"] == 1 for j in d["jobs"]))["jobs"]
        self.assertEqual([(j["job_id"], j["step"], j["map_version"], j["decided_step"], j["effective_step"],
                           j["agents_connected"], j["world_size"], j["blocks"]) for j in jobs],
                         [("job-a", 2, 1, 2, 5, 2, 2, 2), ("job-b", 2, 1, 2, 5, 2, 2, 2)])
        doc = self.prismd.json_until("/v1/jobs/job-a/blocks", lambda d: d["map_version"] == 1)
        self.assertEqual([(b["id"], b["name"], b["precision"], b["sensitivity"], b["grad_score"], b["error_score"],
                           b["relative_magnitude"], b["last_switch_step"], b["reason"], b["forced"])
                          for b in doc["blocks"]],
                         [(0, None, "bf16", 0.75, 0.75, None, 1.5, None, "none", False),
                          (1, None, "int8", 0.25, 0.25, None, 0.5, 2, "score", False)])
        t = doc["telemetry"]
        self.assertEqual((t["step_id"], t["blocks_bf16"], t["blocks_int8"], t["mean_sensitivity"],
                          t["precision_changes"], t["estimated_bandwidth_saving_pct"], t["map_version"]),
                         (2, 1, 1, 0.5, 1, 25.0, 1))
        one = self.prismd.json_until("/v1/jobs/job-b/blocks/0", lambda d: True)
        self.assertEqual((one["job_id"], one["id"], one["precision"]), ("job-b", 0, "int8"))
        self.assertEqual(one["history"], [{"step": 2, "from": "bf16", "to": "int8", "reason": "score",
                                           "map_version": 1}])
        config = self.prismd.json_until("/v1/jobs/job-a/config", lambda d: True)
        self.assertEqual((config["warmup_steps"], config["history_window"], config["bf16_threshold"]), (2, 2, 0.6))

    def test_rest_errors_have_a_status_and_the_error_body(self):
        self.two_jobs_decided()
        cases = [("GET", "/v1/jobs/nope/blocks", 404, "not_found", "job nope does not exist"),
                 ("GET", "/v1/jobs/job-a/blocks/x1", 400, "invalid_argument", "block id \"x1\" is not an integer"),
                 ("GET", "/v1/jobs/job-a/blocks/99", 404, "not_found", "job job-a has no block 99"),
                 ("GET", "/v1/jobs/job-a/nothing", 404, "not_found", "no route for GET /v1/jobs/job-a/nothing"),
                 ("DELETE", "/v1/jobs", 405, "method_not_allowed", "DELETE is not allowed on /v1/jobs")]
        for method, path, status, code, message in cases:
            got_status, body = self.prismd.http(path, method)
            self.assertEqual(got_status, status, path)
            err = json.loads(body)["error"]
            self.assertEqual(err["code"], code, path)
            self.assertIn(message, err["message"], path)

    def test_metrics_pass_promtool_and_count_what_happened(self):
        ranks = self.two_jobs_decided()
        ranks["job-a"][0].send(step_report=pb.StepReport(step=3, blocks=[
            pb.BlockGradStats(block_id=0, l2_norm=-1.0, max_abs=1.0, numel=4)]))
        self.assertEqual(ranks["job-a"][0].next().WhichOneof("kind"), "error")
        ranks["job-b"][1].step(1, (1.0, 1.0))  # step 1 is done: late
        bad = self.agent("x")
        bad.step(1, (1.0,))
        self.assertEqual(bad.status(), grpc.StatusCode.FAILED_PRECONDITION)

        def metrics():
            text = subprocess.run(["curl", "-sf", "http://%s/metrics" % self.prismd.http_addr],
                                  capture_output=True, text=True, timeout=WAIT_S, check=True).stdout
            return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#")), text

        for _ in range(200):
            values, text = metrics()
            if (values.get("prism_agent_streams_refused_total") == "1" and
                    values.get('prism_step_reports_total{outcome="late"}') == "1"):
                break
            time.sleep(0.025)
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                               timeout=WAIT_S)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        expected = {
            "prism_jobs": "2",
            'prism_agents_connected{job="job-a"}': "2",
            'prism_blocks{job="job-a",precision="int8"}': "1",
            'prism_blocks{job="job-b",precision="bf16"}': "1",
            'prism_precision_switches_total{job="job-b",reason="score"}': "1",
            'prism_block_sensitivity{job="job-a",block="0"}': "0.75",
            'prism_bandwidth_saving_percent{job="job-a"}': "25",
            'prism_last_step{job="job-b"}': "2",
            'prism_map_version{job="job-a"}': "1",
            'prism_step_reports_total{outcome="accepted"}': "8",
            'prism_step_reports_total{outcome="malformed"}': "1",
            'prism_step_reports_total{outcome="late"}': "1",
            "prism_block_records_received_total": "16",
            "prism_decisions_total": "2",
            "prism_map_updates_sent_total": "4",
            "prism_agent_streams_refused_total": "1",
            "prism_decision_duration_seconds_count": "2",
        }
        for key, value in expected.items():
            self.assertEqual(values.get(key), value, key)

    def one_job_decided(self, token="tok-r"):
        """job-r, one rank, norms 3 and 1: block 1 int8 at step 2 (map_version 1)."""
        a = self.agent(token)
        a.hello("job-r", 0, 1)
        a.next()
        a.step(1, (3.0, 1.0))
        a.step(2, (3.0, 1.0))
        self.assertEqual(a.next().update.map_version, 1)
        return a

    def test_config_patch_is_checked_then_applied_at_the_next_decision(self):
        a = self.one_job_decided()
        path = "/v1/jobs/job-r/config"
        cases = [(None, '{"warmup_steps": 3}', 401, "unauthenticated", "needs the job's or the admin bearer token"),
                 ("wrong", '{"warmup_steps": 3}', 403, "permission_denied", "wrong token"),
                 ("tok-r", '{"warmup_stepz": 3}', 400, "invalid_argument",
                  "warmup_stepz: unknown key (did you mean warmup_steps?)"),
                 ("tok-r", '{"history_window": 0}', 400, "invalid_argument", "history_window: 0 is outside [1, 1000]"),
                 ("tok-r", '{"int8_threshold": 0.7}', 400, "invalid_argument",
                  "int8_threshold: must be less than bf16_threshold"),
                 ("tok-r", '{"mode": ', 400, "invalid_argument", "body: line 1, column"),
                 ("tok-r", '[1]', 400, "invalid_argument", "body: expected a JSON object")]
        for token, body, status, code, message in cases:
            got, text = self.prismd.http(path, "PATCH", body, token)
            self.assertEqual(got, status, body)
            err = json.loads(text)["error"]
            self.assertEqual(err["code"], code, body)
            self.assertIn(message, err["message"], body)
        got, text = self.prismd.http(path, "PATCH", '{"low_precision": "fp8_e4m3", "history_window": 3}', "tok-r")
        self.assertEqual(got, 200, text)
        doc = json.loads(text)
        self.assertEqual((doc["job_id"], doc["applies"], doc["config"]["low_precision"],
                          doc["config"]["history_window"], doc["config"]["warmup_steps"]),
                         ("job-r", "at the next decision", "fp8_e4m3", 3, 2))
        # In force only from the next decision: the low block moves to the new format then.
        self.assertEqual(json.loads(self.prismd.http(path)[1])["low_precision"], "int8")
        a.step(3, (3.0, 1.0))
        a.step(4, (3.0, 1.0))
        # The decision that applies it pushes the new config first (issue 17), then its map.
        self.assertEqual(a.next().config.config.low_precision, pb.FP8_E4M3)
        u = a.next().update
        self.assertEqual((u.map_version, u.decided_step), (2, 4))
        self.assertEqual(precisions(u.blocks), [(0, pb.BF16), (1, pb.FP8_E4M3)])
        self.assertEqual(u.blocks[1].reason, pb.REASON_MODE)
        config = self.prismd.json_until(path, lambda d: d["low_precision"] == "fp8_e4m3")
        self.assertEqual(config["history_window"], 3)
        # The change is in the store: it survives kill -9.
        a.close()
        self.agents.remove(a)
        self.prismd.kill()
        self.prismd = Prismd(reuse=self.prismd)
        config = self.prismd.json_until(path, lambda d: True)
        self.assertEqual((config["low_precision"], config["history_window"]), ("fp8_e4m3", 3))

    def test_overrides_put_forces_blocks_at_the_next_decision(self):
        a = self.one_job_decided()
        path = "/v1/jobs/job-r/overrides"
        for body, message in [('{"force_bf16_blocks": [1], "force_int8_blocks": [1]}',
                               "force_int8_blocks: block 1 is also in force_bf16_blocks"),
                              ('{"force_bf16": [1]}', "force_bf16: unknown key"),
                              ('{"force_bf16_blocks": [-1]}', "force_bf16_blocks[0]: expected a block id")]:
            got, text = self.prismd.http(path, "PUT", body, "tok-r")
            self.assertEqual(got, 400, body)
            self.assertIn(message, json.loads(text)["error"]["message"])
        got, text = self.prismd.http(path, "PUT", '{"force_bf16_blocks": [1]}', "tok-r")
        self.assertEqual(got, 200, text)
        self.assertEqual(json.loads(text)["config"]["force_bf16_blocks"], [1])
        a.step(3, (3.0, 1.0))
        a.step(4, (3.0, 1.0))
        u = a.next().update
        self.assertEqual((u.map_version, u.decided_step), (2, 4))
        self.assertEqual(precisions(u.blocks), [(0, pb.BF16), (1, pb.BF16)])
        self.assertEqual(u.blocks[1].reason, pb.REASON_OVERRIDE)
        doc = self.prismd.json_until("/v1/jobs/job-r/blocks", lambda d: d["map_version"] == 2)
        self.assertEqual([b["forced"] for b in doc["blocks"]], [False, True])
        # PUT replaces both lists: an empty body lifts the override (the block stays bf16 by hysteresis).
        got, text = self.prismd.http(path, "PUT", "{}", "tok-r")
        self.assertEqual((got, json.loads(text)["config"]["force_bf16_blocks"]), (200, []))

    def test_admin_token_may_change_any_job(self):
        self.prismd.stop()
        admin = os.path.join(tempfile.mkdtemp(prefix="prism-admin-"), "admin-token")
        with open(admin, "w") as f:
            f.write("the-admin\n")
        self.prismd = Prismd("--admin-token-file", admin)
        self.one_job_decided()
        got, text = self.prismd.http("/v1/jobs/job-r/config", "PATCH", '{"warmup_steps": 4}', "the-admin")
        self.assertEqual(got, 200, text)
        got, _ = self.prismd.http("/v1/jobs/job-r/config", "PATCH", '{"warmup_steps": 4}', "not-the-admin")
        self.assertEqual(got, 403)
        shutil.rmtree(os.path.dirname(admin))

    def test_oversized_body_is_413(self):
        self.one_job_decided()
        got, text = self.prismd.http("/v1/jobs/job-r/config", "PATCH", "{" + " " * (1 << 20) + "}", "tok-r")
        self.assertEqual(got, 413)
        self.assertEqual(json.loads(text)["error"]["code"], "too_large")

    def test_telemetry_is_written_per_job_and_served(self):
        a = self.one_job_decided()
        a.step(3, (1.0, 3.0))
        a.step(4, (1.0, 3.0))
        self.assertEqual(a.next().update.map_version, 2)
        path = "/v1/jobs/job-r/telemetry"
        doc = self.prismd.json_until(path, lambda d: len(d["records"]) == 2)
        self.assertEqual(doc["job_id"], "job-r")
        first, second = doc["records"]
        self.assertEqual(sorted(first), sorted(["step_id", "timestamp", "blocks_bf16", "blocks_int8", "mean_sensitivity",
                                                "max_sensitivity", "min_sensitivity", "precision_changes",
                                                "estimated_bandwidth_saving_pct", "low_precision", "map_version",
                                                "block_details", "blocks_by_precision", "loss_spike"]))
        self.assertEqual((first["blocks_by_precision"], first["loss_spike"]),
                         ({"bf16": 1, "int8": 1, "fp8_e4m3": 0, "fp8_e5m2": 0, "int4": 0}, False))
        self.assertEqual((first["step_id"], first["blocks_int8"], first["precision_changes"],
                          first["estimated_bandwidth_saving_pct"], first["map_version"]), (2, 1, 1, 25.0, 1))
        self.assertEqual((second["step_id"], second["blocks_int8"], second["map_version"]), (4, 0, 2))
        self.assertEqual(second["block_details"]["1"], {"precision": "bf16", "sensitivity": 0.75, "grad_score": 0.75,
                                                        "error_score": None, "relative_magnitude": 1.5})
        self.assertLess(abs(first["timestamp"] - time.time()), 60)
        self.assertEqual([r["step_id"] for r in json.loads(self.prismd.http(path + "?since_step=3")[1])["records"]], [4])
        self.assertEqual([r["step_id"] for r in json.loads(self.prismd.http(path + "?limit=1")[1])["records"]], [2])
        status, body = self.prismd.http(path + "?limit=0")
        self.assertEqual((status, json.loads(body)["error"]["message"]), (400, 'limit: "0" is not an integer from 1 to 1000'))
        with open(os.path.join(self.prismd.dir, "data", "jobs", "job-r", "selective_precision_telemetry.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual([r["step_id"] for r in lines], [2, 4])

    def test_telemetry_carries_the_decision_steps_loss(self):
        # The dashboard's loss chart: a record has "loss" (the decision step's, the mean over the
        # ranks that sent one) when the step reported one, and no such key otherwise.
        a = self.one_job_decided()
        for step, loss in ((3, 7.0), (4, 2.5)):
            a.send(step_report=pb.StepReport(step=step, loss=loss, blocks=[
                pb.BlockGradStats(block_id=i, l2_norm=n, max_abs=1.0, numel=100) for i, n in enumerate((1.0, 3.0))]))
        self.assertEqual(a.next().update.map_version, 2)
        doc = self.prismd.json_until("/v1/jobs/job-r/telemetry", lambda d: len(d["records"]) == 2)
        first, second = doc["records"]
        self.assertEqual((first["step_id"], "loss" in first), (2, False))
        self.assertEqual((second["step_id"], second["loss"]), (4, 2.5))
        self.assertEqual(list(second)[-4:], ["loss", "block_details", "blocks_by_precision", "loss_spike"])

    def prismctl(self, *args, token=None):
        env = dict(os.environ, PRISM_SERVER="http://" + self.prismd.http_addr)
        env.pop("PRISM_TOKEN", None)
        if token:
            env["PRISM_TOKEN"] = token
        p = subprocess.run([os.path.join(BUILD, "service", "prismctl"), *args], capture_output=True, text=True,
                           timeout=WAIT_S, env=env)
        return p.returncode, p.stdout, p.stderr

    def test_prismctl_rest_commands(self):
        self.one_job_decided()
        self.prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1 and d["jobs"][0]["map_version"] == 1)
        code, out, err = self.prismctl("jobs")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines(), [
            "JOB                            STEP MAP_VERSION  AGENTS  WORLD  BLOCKS",
            "job-r                             2           1       1      1       2"])
        code, out, _ = self.prismctl("blocks", "job-r")
        self.assertEqual(code, 0)
        self.assertEqual(out.splitlines()[1:], [
            "0        bf16           0.7500     0.7500           -    1.5000           - none      no",
            "1        int8           0.2500     0.2500           -    0.5000           2 score     no",
            "map_version 1, step 2, last decision at step 2: 1 bf16, 1 low (int8), saving 25.0%"])
        code, out, _ = self.prismctl("config", "get", "job-r")
        self.assertEqual((code, json.loads(out)["warmup_steps"]), (0, 2))
        code, out, err = self.prismctl("config", "patch", "job-r", "bf16_threshold=0.7")
        self.assertEqual(code, 2)
        self.assertIn("the server answered 401", err)
        code, out, err = self.prismctl("--token", "tok-r", "config", "patch", "job-r", "bf16_threshold=0.7", "mode=static")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual((json.loads(out)["config"]["bf16_threshold"], json.loads(out)["config"]["mode"]), (0.7, "static"))
        code, out, err = self.prismctl("config", "patch", "job-r", "bf16_treshold=0.7", token="tok-r")
        self.assertEqual(code, 2)
        self.assertIn("bf16_treshold: unknown key (did you mean bf16_threshold?)", err)
        code, out, err = self.prismctl("overrides", "job-r", "--bf16", "0", "--low", "1", token="tok-r")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["config"]["force_int8_blocks"], [1])
        code, _, err = self.prismctl("overrides", "job-r", "--low", "1,x", token="tok-r")
        self.assertEqual(code, 2)
        self.assertIn("--bf16 and --low take block ids like 1,2,3", err)
        code, _, err = self.prismctl("blocks", "nope")
        self.assertEqual(code, 2)
        self.assertIn("the server answered 404: job nope does not exist", err)
        code, _, err = self.prismctl("--server", "http://127.0.0.1:1", "jobs")
        self.assertEqual(code, 1)
        self.assertIn("Couldn't connect", err)

    def test_block_map_is_gzip_compressed_for_clients_that_accept_it(self):
        self.one_job_decided()
        doc = self.prismd.json_until("/v1/jobs/job-r/blocks", lambda d: d["map_version"] == 1)
        req = urllib.request.Request("http://%s/v1/jobs/job-r/blocks" % self.prismd.http_addr,
                                     headers={"Accept-Encoding": "gzip"})
        with openapi_check.urlopen(req, timeout=WAIT_S) as r:
            self.assertEqual(r.headers["Content-Encoding"], "gzip")
            self.assertEqual(r.headers["Vary"], "Accept-Encoding")
            self.assertEqual(json.loads(gzip.decompress(r.read())), doc)
        req = urllib.request.Request("http://%s/v1/jobs" % self.prismd.http_addr,
                                     headers={"Accept-Encoding": "gzip;q=0"})
        with openapi_check.urlopen(req, timeout=WAIT_S) as r:
            self.assertIsNone(r.headers["Content-Encoding"])
            self.assertEqual(json.loads(r.read())["jobs"][0]["job_id"], "job-r")

    def test_tls_on_both_servers(self):
        self.prismd.stop()
        tls_dir = tempfile.mkdtemp(prefix="prism-tls-")
        cert, key = os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        try:
            self.prismd = Prismd("--tls-cert", cert, "--tls-key", key, tls=cert)
            a = self.agent("tok-t")
            a.hello("job-tls", 0, 1)
            self.assertEqual(a.next().WhichOneof("kind"), "welcome")
            self.assertEqual(block_map(self.prismd, "job-tls", "tok-t").job_id, "job-tls")
            doc = self.prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
            self.assertEqual(doc["jobs"][0]["job_id"], "job-tls")
            # Plain HTTP and plain gRPC get nowhere.
            with self.assertRaises(Exception):
                openapi_check.urlopen("http://%s/healthz" % self.prismd.http_addr, timeout=WAIT_S).read()
            plain = grpc.insecure_channel(self.prismd.grpc_addr)
            with self.assertRaises(grpc.FutureTimeoutError):
                grpc.channel_ready_future(plain).result(timeout=1)
            plain.close()
        finally:
            shutil.rmtree(tls_dir)

    def test_tls_needs_both_cert_and_key(self):
        p = subprocess.run([os.path.join(BUILD, "service", "prismd"), "--tls-cert", "/etc/hostname"],
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--tls-cert: /etc/hostname: not a PEM certificate", p.stderr)

    def test_service_config_file_sets_options_and_the_command_line_wins(self):
        self.prismd.stop()
        tmp = tempfile.mkdtemp(prefix="prism-service-")
        try:
            service = os.path.join(tmp, "prismd.json")
            with open(service, "w") as f:
                json.dump({"max-jobs": 1, "log-level": "warn", "http-listen": "127.0.0.1:1",
                           "auto-create": True}, f)
            # http-listen from the file (port 1) is overridden by the command line's.
            self.prismd = Prismd("--service-config", service)
            a = self.agent()
            a.hello("job-one", 0, 1)
            a.next()
            b = self.agent()
            b.hello("job-two", 0, 1)
            self.assertEqual(b.status(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(self.prismd.http("/healthz")[0], 200)
            self.assertNotIn("level=info", self.prismd.logs())
            for content, message in [('{"max-jobz": 1}', "prismd.json: max-jobz: not an option this file can set"),
                                     ('{"max-jobs": 0}', 'prismd.json: max-jobs: "0" is not an integer from 1'),
                                     ('{"max-jobs": [1]}', "prismd.json: max-jobs: expected a string, an integer"),
                                     ('{"max-jobs": 1,}', "prismd.json:1:"),
                                     ('{"require-read-token": 1}', "prismd.json: require-read-token: expected true or false"),
                                     ('{"help": true}', "prismd.json: help: not an option this file can set")]:
                with open(service, "w") as f:
                    f.write(content)
                p = subprocess.run([os.path.join(BUILD, "service", "prismd"), "--service-config", service],
                                   capture_output=True, text=True, timeout=WAIT_S)
                self.assertEqual(p.returncode, 2, content)
                self.assertIn(message, p.stderr, content)
        finally:
            shutil.rmtree(tmp)

    def test_service_config_file_sets_flags(self):
        self.prismd.stop()
        tmp = tempfile.mkdtemp(prefix="prism-service-")
        try:
            service = os.path.join(tmp, "prismd.json")
            with open(service, "w") as f:
                json.dump({"require-read-token": True}, f)
            self.prismd = Prismd("--service-config", service)
            self.assertEqual(self.prismd.http("/v1/jobs")[0], 401)
            self.prismd.stop()
            with open(service, "w") as f:
                json.dump({"require-read-token": False}, f)
            self.prismd = Prismd("--service-config", service)
            self.assertEqual(self.prismd.http("/v1/jobs")[0], 200)
        finally:
            shutil.rmtree(tmp)

    def test_an_agent_that_stops_reading_is_cut_off_and_others_go_on(self):
        self.prismd.stop()
        self.prismd = Prismd("--stream-buffer-bytes", "65536")
        # The stalled agent: sends, never reads (no reader thread), on a channel whose HTTP/2
        # window stays small (no BDP probing), so prismd's unsent updates pile up.
        channel = grpc.insecure_channel(self.prismd.grpc_addr, options=[("grpc.http2.bdp_probe", 0)])
        outbox = queue.Queue()
        connect = channel.stream_stream(
            "/prism.v1.PolicyService/Connect", request_serializer=pb.AgentMessage.SerializeToString,
            response_deserializer=pb.ServiceMessage.FromString)

        def requests():
            for _ in range(5000):
                m = outbox.get()
                if m is None:
                    return
                yield m
        replies = connect(requests(), timeout=120)
        outbox.put(pb.AgentMessage(hello=pb.Hello(job_id="job-stall", rank=0, world_size=1)))
        n = 2000
        # Norms 9 and 1 (rel 1.8 and 0.2, s 0.9 and 0.1: past both hysteresis bounds) that swap
        # every 2 steps flip every block at every decision: a full map of 2,000 blocks (tens of
        # KB) is queued to the agent at each one.
        for step in range(1, 401):
            flip = (step + 1) // 2 % 2
            outbox.put(pb.AgentMessage(step_report=pb.StepReport(step=step, blocks=[
                pb.BlockGradStats(block_id=i, l2_norm=9.0 if (i + flip) % 2 else 1.0, max_abs=1, numel=64)
                for i in range(n)])))
        # Meanwhile another job is served as usual.
        b = self.agent()
        b.hello("job-fine", 0, 1)
        self.assertEqual(b.next().WhichOneof("kind"), "welcome")
        outbox.put(None)
        code = None
        for _ in range(10000):
            try:
                next(replies)
            except StopIteration:
                break
            except grpc.RpcError as e:
                code = e.code()
                break
        channel.close()
        self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("stream fell too far behind", self.prismd.logs())
        self.assertEqual(self.prismd.http("/healthz")[0], 200)
        # The cut-off stream is gone at once, not when the peer reads again.
        self.prismd.json_until("/v1/jobs", lambda d: [j["agents_connected"] for j in d["jobs"]
                                                      if j["job_id"] == "job-stall"] == [0])

    def test_events_stream_one_map_event_per_version(self):
        a = self.agent()
        a.hello("job-e", 0, 1)
        a.next()
        self.prismd.json_until("/v1/jobs", lambda d: len(d["jobs"]) == 1)
        host, port = self.prismd.http_addr.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
        conn.request("GET", "/v1/jobs/job-e/events")
        r = conn.getresponse()
        openapi_check.response("GET", "/v1/jobs/job-e/events", r, b"")
        self.assertEqual((r.status, r.getheader("Content-Type")), (200, "text/event-stream"))

        def next_event():
            lines = []
            for _ in range(100):
                line = r.readline().decode()
                if line == "\n" and lines:
                    openapi_check.sse_event("/v1/jobs/job-e/events", lines)
                    return lines
                if line.strip() and not line.startswith(":"):
                    lines.append(line.rstrip("\n"))
            raise AssertionError("no event")

        first = next_event()
        self.assertEqual(first[:2], ["event: map", "id: 0"])
        self.assertEqual(json.loads(first[2][len("data: "):]),
                         {"job_id": "job-e", "map_version": 0, "decided_step": 0, "effective_step": 0, "blocks": 0,
                          "blocks_bf16": 0, "blocks_low": 0})
        a.step(1, (3.0, 1.0))
        a.step(2, (3.0, 1.0))
        second = next_event()
        self.assertEqual(second[:2], ["event: map", "id: 1"])
        self.assertEqual(json.loads(second[2][len("data: "):]),
                         {"job_id": "job-e", "map_version": 1, "decided_step": 2, "effective_step": 5, "blocks": 2,
                          "blocks_bf16": 1, "blocks_low": 1})
        conn.close()
        status, body = self.prismd.http("/v1/jobs/nope/events")
        self.assertEqual((status, json.loads(body)["error"]["code"]), (404, "not_found"))

    def test_nan_and_inf_figures_count_as_nonfinite_and_the_block_goes_bf16(self):
        a = self.one_job_decided()  # block 1 int8 at step 2
        nan, inf = float("nan"), float("inf")
        a.send(step_report=pb.StepReport(step=3, blocks=[
            pb.BlockGradStats(block_id=0, l2_norm=3.0, max_abs=1.0, numel=100),
            pb.BlockGradStats(block_id=1, l2_norm=nan, max_abs=inf, mean=nan, variance=nan, numel=100)]))
        a.step(4, (3.0, 1.0))
        u = a.next().update
        self.assertEqual((u.map_version, u.decided_step), (2, 4))
        self.assertEqual(precisions(u.blocks), [(0, pb.BF16), (1, pb.BF16)])
        self.assertEqual(u.blocks[1].reason, pb.REASON_NONFINITE)

    def test_an_agent_that_vanishes_is_forgotten_and_its_job_goes_on(self):
        gone = grpc.insecure_channel(self.prismd.grpc_addr)
        connect = gone.stream_stream("/prism.v1.PolicyService/Connect",
                                     request_serializer=pb.AgentMessage.SerializeToString,
                                     response_deserializer=pb.ServiceMessage.FromString)
        outbox = queue.Queue()

        def requests():  # never ends by itself: the agent is cut off, it does not hang up
            yield pb.AgentMessage(hello=pb.Hello(job_id="job-v", rank=1, world_size=2))
            outbox.get(timeout=WAIT_S)
        replies = connect(requests(), timeout=WAIT_S)
        self.assertEqual(next(replies).WhichOneof("kind"), "welcome")
        self.prismd.json_until("/v1/jobs", lambda d: d["jobs"] and d["jobs"][0]["agents_connected"] == 1)
        gone.close()  # no half-close, no goodbye: the connection just goes away
        outbox.put(None)
        self.prismd.json_until("/v1/jobs", lambda d: d["jobs"] and d["jobs"][0]["agents_connected"] == 0)
        a = self.agent()
        a.hello("job-v", 0, 2)
        a.next()
        self.prismd.json_until("/v1/jobs", lambda d: d["jobs"] and d["jobs"][0]["agents_connected"] == 1)

    def test_calibration_for_unknown_blocks_or_with_a_huge_fingerprint_is_refused(self):
        a = self.one_job_decided()  # blocks 0 and 1
        a.send(calibration=pb.CalibrationReport(format=pb.INT8, errors=[pb.BlockError(block_id=7, relative_error=0.1)]))
        e = a.next()
        self.assertEqual(e.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("block 7 is in no layout or report of the job", e.error.message)
        a.send(calibration=pb.CalibrationReport(format=pb.INT8, fingerprint=b"x" * 65,
                                                errors=[pb.BlockError(block_id=1, relative_error=0.1)]))
        self.assertIn("calibration.fingerprint: 65 bytes, at most 64", a.next().error.message)

    def test_calibration_naming_a_block_twice_is_refused(self):
        a = self.one_job_decided()  # blocks 0 and 1
        a.send(calibration=pb.CalibrationReport(format=pb.INT8, errors=[
            pb.BlockError(block_id=1, relative_error=0.1), pb.BlockError(block_id=0, relative_error=0.2),
            pb.BlockError(block_id=1, relative_error=0.3)]))
        e = a.next()
        self.assertEqual(e.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertEqual(e.error.message, "calibration.errors[2]: block 1 appears twice in the report")
        status, body = self.prismd.http("/v1/jobs/job-r/blocks")
        self.assertEqual(status, 200)

    def test_a_refused_hello_leaves_no_job_behind(self):
        a = self.agent()
        a.hello("job-none", 5, 2)
        self.assertEqual(a.status(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(json.loads(self.prismd.http("/v1/jobs")[1])["jobs"], [])

    def test_a_path_that_is_not_utf8_is_400(self):
        for path in ["/v1/jobs/%FF/blocks", "/nope%FF", "/v1/jobs/%C3/events"]:
            status, body = self.prismd.http(path)
            self.assertEqual((status, json.loads(body)["error"]["message"]), (400, "the request path is not valid UTF-8"))

    def test_runtime_hints_go_out_in_welcome_and_show_in_rest(self):
        doc = self.prismd.json_until("/v1/jobs", lambda d: True)
        a = self.agent()
        a.hello("job-h", 0, 1)
        w = a.next().welcome
        self.assertEqual((w.hints.max_inflight_h2d, w.hints.max_inflight_d2h, w.hints.prefetch_window,
                          w.hints.vram_pressure_threshold, w.hints.suppress_prefetch_in_backward,
                          w.hints.suppress_prefetch_in_optimizer, w.hints.map_version), (2, 2, 2, 0.8, True, True, 0))
        hints = self.prismd.json_until("/v1/jobs/job-h/hints", lambda d: d["hints"] is not None)["hints"]
        self.assertEqual(hints, {"map_version": 0, "max_inflight_h2d": 2, "max_inflight_d2h": 2, "prefetch_window": 2,
                                 "vram_pressure_threshold": 0.8, "suppress_prefetch_in_backward": True,
                                 "suppress_prefetch_in_optimizer": True})
        self.prismd.stop()
        self.prismd = Prismd("--hint-inflight-h2d", "4", "--hint-prefetch-window", "0", "--hint-vram-pressure", "0.9")
        b = self.agent()
        b.hello("job-h2", 0, 1)
        w = b.next().welcome
        self.assertEqual((w.hints.max_inflight_h2d, w.hints.prefetch_window, w.hints.vram_pressure_threshold),
                         (4, 0, 0.9))
        self.assertEqual(self.prismd.http("/v1/jobs/nope/hints")[0], 404)
        p = subprocess.run([os.path.join(BUILD, "service", "prismd"), "--hint-vram-pressure", "2"],
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual((p.returncode, p.stderr),
                         (2, 'prismd: --hint-vram-pressure: "2" is not a fraction from 0 to 1\n'))

if __name__ == "__main__":
    unittest.main(verbosity=2)
