#!/usr/bin/python3
"""prism-agent and libprism's side of hybrid plans (issue 15 item 4), with real processes.

- `--profile-file`: every bad key, type and number exits 2 at start with
  `prism-agent: --profile-file FILE: KEY: PROBLEM` (line and column for JSON that does not parse);
  a good file is the DeviceProfile of the agent's Hello exactly (missing keys 0, the class from
  --device-class when the file has none), and reaches a real prismd's GET /v1/jobs/{job}/ranks
  unchanged; memory_bytes is taken exactly (2^63 - 1, 2^53 + 1).
- Compute plans: a fake prismd (Python grpcio, the PolicyService Connect stream) sends maps with
  and without a ComputePlan to a real prism-agent; a real libprism client (ctypes on
  libprism.so, the C API of include/prism/client.h) sees each plan exactly from its map's
  effective step, a map without a plan runs every block high, a plan in a format the agent does
  not take or of another device class is ignored and counted by reason, a Welcome that repeats
  the held map without a plan withdraws its plan, a trainer that ran without a plan file takes
  the plan once the agent makes the file; the agent's /metrics says which plan it wrote last; the layout's
  cost figures reach prismd in Hello; staged tensor statistics reach prismd unchanged in the
  next StepReport.

The client is driven through the C calls themselves (ctypes, with the binding's declarations of
its structs and prototypes from prism.client and prism._lib, whose ABI lib/abi.c and
test_python_kernels pin), not through prism.Client. Every wait is bounded; every process is
stopped on every path."""

import concurrent.futures
import ctypes
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(BUILD, "python-gen"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
from prism import _lib  # noqa: E402
from prism import client as prism_client  # noqa: E402
from prism._lib import Error, GradStats  # noqa: E402
from prism.client import (BlockLayout, BlockTensorStats, ClientCounters, ClientOptions, ClientPlan,  # noqa: E402
                          ModelLayout, QuantConfig)
from prism.v1 import prism_pb2 as pb  # noqa: E402
from prismtest import free_port, http_get, wait_for  # noqa: E402

AGENT = os.path.join(BUILD, "agent", "prism-agent")
PRISMD = os.path.join(BUILD, "service", "prismd")
LIBRARY = os.environ.get("PRISM_LIBRARY") or os.path.join(BUILD, "lib", "libprism.so")
T4 = os.path.join(SOURCE, "examples", "hybrid", "t4-16gb.profile.json")
V100 = os.path.join(SOURCE, "examples", "hybrid", "v100-32gb.profile.json")

BF16, INT8, FP8_E4M3, FP8_E5M2 = 0, 1, 2, 3

# ---- libprism's client through ctypes (include/prism/client.h), as the binding declares it ------

COUNTERS = tuple(name for name, _ in ClientCounters._fields_)

assert ctypes.sizeof(BlockLayout) == 56 and ctypes.sizeof(BlockTensorStats) == 64
assert ctypes.sizeof(ClientPlan) == 168 and ctypes.sizeof(ClientCounters) == 152

_vp = ctypes.c_void_p
_lib.load(LIBRARY)
LIB = prism_client._dll()

# Four blocks of one 8x8 weight each, with cost figures.
COSTS = [(1000, 2000, 3000), (1 << 40, 0, 7), (0, 5, 0), (123456789, 987654321, 18446744073709551615)]


class Client:
    """A libprism client of 4 blocks (COSTS), rank 0 of 1."""

    def __init__(self, shared, job="j1"):
        self.h = _vp()
        err = Error()
        opts = ClientOptions(dir=shared.encode(), job_id=job.encode(), rank=0, world_size=1, reconnect_interval_ms=50)
        assert LIB.prism_client_open(ctypes.byref(opts), ctypes.byref(self.h), ctypes.byref(err)) == 0, err.message
        self.shape = (ctypes.c_uint64 * 3)(2, 8, 8)
        self.blocks = (BlockLayout * 4)(*[
            BlockLayout(name=f"b{i}".encode(), param_bytes_bf16=128, shape=self.shape, shape_len=3, flops=f,
                        activation_bytes_bf16=a, state_bytes=s) for i, (f, a, s) in enumerate(COSTS)])
        layout = ModelLayout(model_id=b"hybrid-test@1", quant=QuantConfig(format=INT8, granularity=0, block_size=0),
                             blocks=self.blocks, n_blocks=4)
        assert LIB.prism_client_register(self.h, ctypes.byref(layout), ctypes.byref(err)) == 0, err.message

    def close(self):
        if self.h:
            LIB.prism_client_close(self.h)
            self.h = None

    def report(self, step):
        ids = (ctypes.c_uint32 * 1)(0)
        st = (GradStats * 1)(GradStats(l2_norm=1.0, max_abs=0.5, mean=0.0, variance=0.25, numel=64, nonfinite=0))
        return LIB.prism_client_report_step(self.h, step, None, ids, st, 1, None) == 0

    def stage(self, entries):
        arr = (BlockTensorStats * len(entries))(*[BlockTensorStats(**e) for e in entries])
        err = Error()
        assert LIB.prism_client_stage_tensor_stats(self.h, arr, len(entries), ctypes.byref(err)) == 0, err.message

    def begin_step(self, step):
        return LIB.prism_client_begin_step(self.h, step)

    def compute(self):
        return [LIB.prism_client_compute_precision(self.h, b) for b in range(4)]

    def plan(self):
        p = ClientPlan()
        assert LIB.prism_client_get_plan(self.h, ctypes.byref(p), None) == 0
        return p

    def counters(self):
        n = ClientCounters()
        assert LIB.prism_client_get_counters(self.h, ctypes.byref(n), None) == 0
        return {name: getattr(n, name) for name in COUNTERS}


# ---- a fake prismd: the Connect stream, scripted by the test ----------------------------------


class FakePrismd:
    """PolicyService.Connect on a loopback port. Every AgentMessage received goes into `received`;
    each stream answers its Hello with `welcome` and then sends what the test puts in `outbox`."""

    def __init__(self, welcome):
        self.welcome = welcome
        self.received = queue.Queue()
        self.outbox = queue.Queue()
        self.stopping = threading.Event()
        self.kick = threading.Event()  # set: the open stream ends (OK), the agent connects again
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.stream_stream_rpc_method_handler(
            self._connect, request_deserializer=pb.AgentMessage.FromString,
            response_serializer=pb.ServiceMessage.SerializeToString)
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("prism.v1.PolicyService", {"Connect": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"
        self.server.start()

    def _connect(self, requests, context):
        said_hello, ended = threading.Event(), threading.Event()

        def read():
            try:
                for m in requests:
                    self.received.put(m)
                    if m.WhichOneof("kind") == "hello":
                        said_hello.set()
            except grpc.RpcError:
                pass  # the agent ended the stream
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        for _ in range(2000):  # 100 s at most
            if said_hello.wait(0.05) or self.stopping.is_set():
                break
        if not said_hello.is_set():
            return
        yield pb.ServiceMessage(welcome=self.welcome)
        while not self.stopping.is_set() and not ended.is_set() and context.is_active():
            if self.kick.is_set():
                self.kick.clear()
                return
            try:
                yield self.outbox.get(timeout=0.05)
            except queue.Empty:
                pass

    def next(self, kind, timeout_s=20):
        """The next message of that kind (others are skipped)."""
        return wait_for(f"a {kind} from the agent", lambda: self._take(kind), timeout_s=timeout_s)

    def _take(self, kind):
        try:
            while True:
                m = self.received.get_nowait()
                if m.WhichOneof("kind") == kind:
                    return m
        except queue.Empty:
            return None

    def stop(self):
        self.stopping.set()
        self.server.stop(grace=None).wait(10)


def update(version, effective, plan=None):
    u = pb.PrecisionUpdate(job_id="j1", map_version=version, decided_step=max(0, effective - 2), effective_step=effective,
                           full=True, blocks=[pb.BlockPrecision(block_id=b, precision=BF16) for b in range(4)])
    if plan is not None:
        u.compute_plan.CopyFrom(plan)
    return u


class Proc:
    def __init__(self, argv, log):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fd)
        finally:
            os.close(fd)
        self.log = log

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                return self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        return self.p.returncode

    def text(self):
        with open(self.log) as f:
            return f.read()


def profile_dict(p):
    """A DeviceProfile message as the profile file's object."""
    return {"device_class": p.device_class, "device_name": p.device_name, "memory_bytes": p.memory_bytes,
            "bf16_ops_per_second": p.bf16_ops_per_second, "fp16_ops_per_second": p.fp16_ops_per_second,
            "int8_ops_per_second": p.int8_ops_per_second, "fp8_ops_per_second": p.fp8_ops_per_second,
            "quantize_cost": {"fixed_seconds": p.quantize_cost.fixed_seconds,
                              "seconds_per_byte": p.quantize_cost.seconds_per_byte},
            "cast_cost": {"fixed_seconds": p.cast_cost.fixed_seconds, "seconds_per_byte": p.cast_cost.seconds_per_byte},
            "h2d_bytes_per_second": p.h2d_bytes_per_second}


class AgentPlansTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-agent-plans-")
        self.procs, self.clients, self.fakes = [], [], []

    def tearDown(self):
        for c in self.clients:
            c.close()
        for p in self.procs:
            p.stop(signal.SIGKILL)
        for f in self.fakes:
            f.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent(self, target, *extra, name="agent"):
        metrics = f"127.0.0.1:{free_port()}"
        p = Proc([AGENT, "--prismd", target, "--dir", os.path.join(self.dir, "shared"), "--metrics-listen", metrics,
                  "--backoff-initial-ms", "50", "--backoff-max-ms", "200", *extra],
                 os.path.join(self.dir, f"{name}.log"))
        p.metrics = metrics
        self.procs.append(p)
        wait_for("the agent's /readyz", lambda: http_get(metrics, "/readyz", openapi=False)[0] == 200)
        return p

    def metric(self, agent, name):
        text = http_get(agent.metrics, "/metrics", openapi=False)[1]
        m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
        return float(m.group(1)) if m else None

    def client(self):
        c = Client(os.path.join(self.dir, "shared"))
        self.clients.append(c)
        return c

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # ---- --profile-file ----

    def test_bad_profile_files_exit_2_naming_the_key(self):
        good = {"device_class": "t4", "device_name": "Tesla T4", "memory_bytes": 17179869184,
                "bf16_ops_per_second": 0, "fp16_ops_per_second": 6.5e13, "int8_ops_per_second": 1.3e14,
                "fp8_ops_per_second": 0, "quantize_cost": {"fixed_seconds": 1e-5, "seconds_per_byte": 4.7e-12},
                "cast_cost": {"fixed_seconds": 1e-5, "seconds_per_byte": 6.3e-12}, "h2d_bytes_per_second": 1.2e10}
        numbers = ["bf16_ops_per_second", "fp16_ops_per_second", "int8_ops_per_second", "fp8_ops_per_second",
                   "h2d_bytes_per_second"]
        cases = []  # (file text, the message after "FILE: ")
        for key in numbers:
            cases.append(({**good, key: -1}, f"{key}: -1 is negative"))
            cases.append(({**good, key: "1e9"}, f"{key}: expected a number, got a string"))
            cases.append(({**good, key: True}, f"{key}: expected a number, got a boolean"))
            cases.append(({**good, key: None}, f"{key}: expected a number, got null"))
        cases += [
            ({**good, "memory_bytes": -16}, "memory_bytes: -16 is negative"),
            ({**good, "memory_bytes": 1.5}, "memory_bytes: 1.5 is not a whole number of bytes below 2^53 "
                                            "(write a larger count as an integer)"),
            ({**good, "memory_bytes": 1e19}, "memory_bytes: 1e+19 is not a whole number of bytes below 2^53 "
                                             "(write a larger count as an integer)"),
            ({**good, "memory_bytes": 9007199254740992.0}, "memory_bytes: 9.0072e+15 is not a whole number of "
                                                           "bytes below 2^53 (write a larger count as an integer)"),
            ({**good, "memory_bytes": -1.0}, "memory_bytes: -1 is negative"),
            ({**good, "memory_bytes": [1]}, "memory_bytes: expected a number, got an array"),
            ({**good, "device_class": 4}, "device_class: expected a string, got a number"),
            ({**good, "device_class": ""}, "device_class: \"\" is not 1 to 63 letters, digits, '-', '_' or '.'"),
            ({**good, "device_class": "t4 16gb"},
             "device_class: \"t4 16gb\" is not 1 to 63 letters, digits, '-', '_' or '.'"),
            ({**good, "device_class": "x" * 64}, "device_class: 64 bytes, at most 63"),
            ({**good, "device_name": {"a": 1}}, "device_name: expected a string, got an object"),
            ({**good, "device_name": "n" * 256}, "device_name: 256 bytes, at most 255"),
            ({**good, "gpu_count": 1}, "gpu_count: unknown key"),
            ({**good, "device": "cpu"}, "device: unknown key"),
        ]
        for cost in ("quantize_cost", "cast_cost"):
            cases += [
                ({**good, cost: 1e-5}, f"{cost}: expected an object, got a number"),
                ({**good, cost: {"fixed_seconds": 1e-5, "per_byte": 1e-12}}, f"{cost}.per_byte: unknown key"),
                ({**good, cost: {"fixed_seconds": -1e-5}}, f"{cost}.fixed_seconds: -1e-05 is negative"),
                ({**good, cost: {"seconds_per_byte": "x"}}, f"{cost}.seconds_per_byte: expected a number, got a string"),
            ]
        cases = [(json.dumps(doc), want) for doc, want in cases]
        cases += [
            ("[1, 2]", "the file: expected an object, got an array"),
            ('{"device_class": "t4",\n "memory_bytes": }', "line 2 column 18: unexpected token near '}'"),
            ('{"memory_bytes": NaN}', "line 1 column 20: invalid token near 'NaN'"),
            ('{"fp16_ops_per_second": 1e999}', "line 1 column 29: real number overflow near '1e999'"),
            ('{"memory_bytes": 9223372036854775808}',
             "line 1 column 36: too big integer near '9223372036854775808'"),
            ('{"device_class": "a", "device_class": "b"}',
             "line 1 column 36: duplicate object key near '\"device_class\"'"),
            ("", "line 1 column 0: '[' or '{' expected near end of file"),
        ]
        for i, (text, want) in enumerate(cases):
            path = self.write(f"bad{i}.json", text)
            r = subprocess.run([AGENT, "--profile-file", path, "--dir", os.path.join(self.dir, "never")],
                               capture_output=True, text=True, timeout=20)
            with self.subTest(want=want):
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stderr, f"prism-agent: --profile-file {path}: {want}\n")
                self.assertEqual(r.stdout, "")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "never")), "a bad profile started the agent")
        missing = os.path.join(self.dir, "missing.json")
        r = subprocess.run([AGENT, "--profile-file", missing], capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"prism-agent: --profile-file {missing}: unable to open {missing}: "
                                   "No such file or directory\n")
        r = subprocess.run([AGENT, "--profile-file="], capture_output=True, text=True, timeout=20)
        self.assertEqual((r.returncode, r.stderr), (2, "prism-agent: --profile-file: the file name is empty\n"))
        r = subprocess.run([AGENT, "--help"], capture_output=True, text=True, timeout=20)
        self.assertIn("--profile-file FILE", r.stdout)

    def test_profile_file_is_the_hello_profile_exactly(self):
        with open(T4) as f:
            t4 = json.load(f)
        fake = FakePrismd(pb.Welcome(config=pb.PolicyConfig()))
        self.fakes.append(fake)
        a = self.agent(fake.target, "--profile-file", T4, "--device-class", "ignored-when-the-file-has-one")
        c = self.client()
        hello = fake.next("hello").hello
        self.assertEqual(profile_dict(hello.device), t4)
        self.assertEqual([(b.flops, b.activation_bytes_bf16, b.state_bytes) for b in hello.layout.blocks], COSTS)
        self.assertIn('msg="device profile read"', a.text())
        c.close()
        self.assertEqual(a.stop(), 0)

        # A sparse file: missing figures are 0, the class is --device-class's, else the name's.
        sparse = self.write("sparse.json", json.dumps({"device_name": "Play Device 7", "memory_bytes": 1024,
                                                       "quantize_cost": {"seconds_per_byte": 2e-12}}))
        fake2 = FakePrismd(pb.Welcome(config=pb.PolicyConfig()))
        self.fakes.append(fake2)
        a = self.agent(fake2.target, "--profile-file", sparse, "--device-class", "play.7", name="agent2")
        c = self.client()
        d = fake2.next("hello").hello.device
        want = {"device_class": "play.7", "device_name": "Play Device 7", "memory_bytes": 1024,
                "bf16_ops_per_second": 0.0, "fp16_ops_per_second": 0.0, "int8_ops_per_second": 0.0,
                "fp8_ops_per_second": 0.0, "quantize_cost": {"fixed_seconds": 0.0, "seconds_per_byte": 2e-12},
                "cast_cost": {"fixed_seconds": 0.0, "seconds_per_byte": 0.0}, "h2d_bytes_per_second": 0.0}
        self.assertEqual(profile_dict(d), want)
        c.close()
        self.assertEqual(a.stop(), 0)
        fake3 = FakePrismd(pb.Welcome(config=pb.PolicyConfig()))
        self.fakes.append(fake3)
        a = self.agent(fake3.target, "--profile-file", sparse, name="agent3")
        c = self.client()
        self.assertEqual(fake3.next("hello").hello.device.device_class, "gpu-play-device-7")

    def test_profile_file_reaches_prismds_ranks_unchanged(self):
        with open(V100) as f:
            v100 = json.load(f)
        config = self.write("config.json", json.dumps({"warmup_steps": 2, "update_interval_steps": 2}))
        grpc_addr, http_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        d = Proc([PRISMD, "--grpc-listen", grpc_addr, "--http-listen", http_addr, "--data-dir",
                  os.path.join(self.dir, "data"), "--config", config], os.path.join(self.dir, "prismd.log"))
        self.procs.append(d)
        wait_for("prismd listening", lambda: 'msg="listening"' in d.text())
        self.agent(grpc_addr, "--profile-file", V100)
        self.client()

        def device():
            status, body = http_get(http_addr, "/v1/jobs/j1/ranks")
            if status != 200:
                return None
            return json.loads(body)["ranks"][0]["device"]

        got = wait_for("rank 0's device in prismd", device)
        shown = {k: v for k, v in v100.items() if k not in ("quantize_cost", "cast_cost")}
        self.assertEqual(got, shown)

    # ---- compute plans ----

    def test_plans_reach_the_trainer_with_their_maps(self):
        fake = FakePrismd(pb.Welcome(config=pb.PolicyConfig(low_precision=INT8), map=update(1, 0)))
        self.fakes.append(fake)
        a = self.agent(fake.target, "--profile-file", T4)
        c = self.client()
        fake.next("hello")
        wait_for("map 1", lambda: self.metric(a, "prism_agent_map_version") == 1)
        self.assertEqual(self.metric(a, "prism_agent_plan_map_version"), 0)
        self.assertEqual(c.begin_step(0), 1)
        self.assertEqual(c.compute(), [BF16] * 4)
        self.assertFalse(c.plan().has_plan)

        plan = pb.ComputePlan(device_class="t4-16gb", low_format=INT8, high_format="fp16", low_blocks=[1, 3],
                              predicted_iteration_seconds=0.5, compute_seconds=0.375)
        fake.outbox.put(pb.ServiceMessage(update=update(2, 5, plan)))
        wait_for("map 2", lambda: self.metric(a, "prism_agent_map_version") == 2)
        self.assertEqual(self.metric(a, "prism_agent_plan_map_version"), 2)
        self.assertEqual(self.metric(a, "prism_agent_plan_low_blocks"), 2)
        self.assertEqual(self.metric(a, "prism_agent_plans_written_total"), 1)
        self.assertEqual(c.begin_step(4), 1, "map 2 before its effective step")
        self.assertEqual(c.compute(), [BF16] * 4, "the plan before its map's effective step")
        self.assertEqual(c.begin_step(5), 2)
        self.assertEqual(c.compute(), [BF16, INT8, BF16, INT8])
        p = c.plan()
        self.assertEqual((p.has_plan, p.high_fp16, p.low_format, p.map_version, p.low_blocks),
                         (True, True, INT8, 2, 2))
        self.assertEqual((p.predicted_iteration_seconds, p.compute_seconds, p.device_class),
                         (0.5, 0.375, b"t4-16gb"))
        self.assertEqual(c.counters()["plans_applied"], 1)

        # Tensor statistics staged by the trainer reach prismd unchanged with the next report.
        stats = [{"block_id": 2, "x_l2": 3.5, "x_max_abs": 0.25, "x_numel": 4096, "w_l2": 1.75, "w_max_abs": 0.125,
                  "w_numel": 64, "y_numel": 8192},
                 {"block_id": 0, "x_l2": 0.0, "x_max_abs": 0.0, "x_numel": 0, "w_l2": 2.5, "w_max_abs": 0.5,
                  "w_numel": 64, "y_numel": 0}]
        c.stage(stats)
        self.assertTrue(wait_for("a report written", lambda: c.report(5)))
        report = fake.next("step_report").step_report
        self.assertEqual(report.step, 5)
        got = [{k: getattr(t, k) for k in stats[0]} for t in report.tensor_stats]
        self.assertEqual(got, stats)
        self.assertEqual(c.counters()["tensor_stats_sent"], 2)
        self.assertTrue(c.report(6))
        self.assertEqual(len(fake.next("step_report").step_report.tensor_stats), 0)

        # A map without a plan: every block high from its effective step; the agent's gauges
        # still name the plan it wrote last.
        fake.outbox.put(pb.ServiceMessage(update=update(3, 7)))
        wait_for("map 3", lambda: self.metric(a, "prism_agent_map_version") == 3)
        self.assertEqual(c.begin_step(6), 2)
        self.assertEqual(c.compute(), [BF16, INT8, BF16, INT8])
        self.assertEqual(c.begin_step(7), 3)
        self.assertEqual(c.compute(), [BF16] * 4)
        self.assertFalse(c.plan().has_plan)
        self.assertEqual(self.metric(a, "prism_agent_plan_map_version"), 2)

        # A plan in a low format the agent does not take (fp8_e5m2): ignored and counted, the map
        # still applies; a plan of fp8_e4m3 with a block past --max-blocks drops that block.
        bad = pb.ComputePlan(device_class="t4-16gb", low_format=FP8_E5M2, high_format="bf16", low_blocks=[0])
        fake.outbox.put(pb.ServiceMessage(update=update(4, 9, bad)))
        wait_for("map 4", lambda: self.metric(a, "prism_agent_map_version") == 4)
        self.assertEqual(self.metric(a, 'prism_agent_plans_ignored_total{reason="low_format"}'), 1)
        self.assertEqual(self.metric(a, 'prism_agent_plans_ignored_total{reason="device_class"}'), 0)
        self.assertEqual(self.metric(a, 'prism_agent_plans_ignored_total{reason="file"}'), 0)
        self.assertEqual(c.begin_step(9), 4)
        self.assertEqual(c.compute(), [BF16] * 4)
        fp8 = pb.ComputePlan(device_class="t4-16gb", low_format=FP8_E4M3, high_format="bf16",
                             low_blocks=[0, 2, 70000])
        fake.outbox.put(pb.ServiceMessage(update=update(5, 11, fp8)))
        wait_for("map 5", lambda: self.metric(a, "prism_agent_map_version") == 5)
        self.assertEqual(self.metric(a, "prism_agent_plan_low_blocks"), 2)
        self.assertEqual(self.metric(a, "prism_agent_map_entries_ignored_total"), 1)
        self.assertEqual(c.begin_step(11), 5)
        self.assertEqual(c.compute(), [FP8_E4M3, BF16, FP8_E4M3, BF16])
        p = c.plan()
        self.assertEqual((p.high_fp16, p.low_format, p.low_blocks), (False, FP8_E4M3, 2))
        self.assertEqual(c.counters()["plans_applied"], 2)

        # The agent restarts with the table and the plan file kept: a new trainer finds both.
        c.close()
        self.assertEqual(a.stop(), 0)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "shared", "prism-hints.plans")))
        a2 = self.agent(fake.target, "--profile-file", T4, name="agent2")
        self.assertEqual(self.metric(a2, "prism_agent_plan_map_version"), 5)
        self.assertEqual(self.metric(a2, "prism_agent_plan_low_blocks"), 2)
        self.assertEqual(self.metric(a2, "prism_agent_plans_written_total"), 0)
        c2 = self.client()
        self.assertEqual(c2.begin_step(11), 5)
        self.assertEqual(c2.compute(), [FP8_E4M3, BF16, FP8_E4M3, BF16])
        c2.close()
        self.assertEqual(a2.stop(), 0)

        # The plan file lost, the hint table kept (as after a rolling upgrade from an agent without
        # plans): a trainer already running at map 5 without a plan file; prismd's Welcome
        # repeats the held map with its plan, the new agent writes the plan again (the map is not
        # written again), and the running trainer maps the new file within its reconnect
        # interval and takes the plan of the map in use.
        os.unlink(os.path.join(self.dir, "shared", "prism-hints.plans"))
        c3 = self.client()
        self.assertEqual(c3.begin_step(11), 5)
        self.assertEqual(c3.compute(), [BF16] * 4)
        self.assertEqual(c3.counters()["hint_open_failures"], 0)
        fake.welcome = pb.Welcome(config=pb.PolicyConfig(), map=update(5, 11, fp8))
        a3 = self.agent(fake.target, "--profile-file", T4, name="agent3")
        self.assertEqual(self.metric(a3, "prism_agent_plan_map_version"), 0)
        c3.report(11)  # connects: the Hello brings the Welcome
        wait_for("the plan written again", lambda: self.metric(a3, "prism_agent_plan_map_version") == 5)
        self.assertEqual(self.metric(a3, "prism_agent_maps_applied_total"), 0)

        def taken():
            return c3.begin_step(12) == 5 and c3.compute() == [FP8_E4M3, BF16, FP8_E4M3, BF16]

        wait_for("the running trainer takes the plan of its map", taken)
        p = c3.plan()
        self.assertEqual((p.has_plan, p.map_version, p.low_blocks), (True, 5, 2))
        self.assertEqual(c3.counters()["plans_applied"], 1)

    def test_welcome_carries_a_plan(self):
        plan = pb.ComputePlan(device_class="t4-16gb", low_format=INT8, high_format="fp16", low_blocks=[0],
                              predicted_iteration_seconds=1.0, compute_seconds=0.75)
        fake = FakePrismd(pb.Welcome(config=pb.PolicyConfig(), map=update(3, 4, plan)))
        self.fakes.append(fake)
        a = self.agent(fake.target, "--profile-file", T4)
        c = self.client()
        wait_for("map 3", lambda: self.metric(a, "prism_agent_map_version") == 3)
        self.assertEqual(self.metric(a, "prism_agent_plan_map_version"), 3)
        self.assertEqual(c.begin_step(3), 0)
        self.assertEqual(c.compute(), [BF16] * 4)
        self.assertEqual(c.begin_step(4), 3)
        self.assertEqual(c.compute(), [INT8, BF16, BF16, BF16])

    def test_another_classs_plan_is_ignored_and_a_withdrawn_plan_is_cleared(self):
        plan = pb.ComputePlan(device_class="t4-16gb", low_format=INT8, high_format="fp16", low_blocks=[0, 2],
                              predicted_iteration_seconds=1.0, compute_seconds=0.75)
        fake = FakePrismd(pb.Welcome(config=pb.PolicyConfig(), map=update(3, 4, plan)))
        self.fakes.append(fake)
        a = self.agent(fake.target, "--profile-file", T4)
        c = self.client()
        wait_for("map 3", lambda: self.metric(a, "prism_agent_map_version") == 3)
        self.assertEqual(c.begin_step(4), 3)
        self.assertEqual(c.compute(), [INT8, BF16, INT8, BF16])

        # Another class's plan with map 4: the map applies, the plan is not written (every block
        # high from map 4's effective step), counted by reason, both classes logged.
        v100 = pb.ComputePlan(device_class="v100-32gb", low_format=INT8, high_format="bf16", low_blocks=[1])
        fake.outbox.put(pb.ServiceMessage(update=update(4, 6, v100)))
        wait_for("map 4", lambda: self.metric(a, "prism_agent_map_version") == 4)
        self.assertEqual(self.metric(a, 'prism_agent_plans_ignored_total{reason="device_class"}'), 1)
        self.assertEqual(self.metric(a, 'prism_agent_plans_ignored_total{reason="low_format"}'), 0)
        self.assertEqual(self.metric(a, "prism_agent_plans_written_total"), 1)
        self.assertEqual(self.metric(a, "prism_agent_plan_map_version"), 3)
        line = [ln for ln in a.text().splitlines() if "another device class" in ln]
        self.assertEqual(len(line), 1, a.text())
        self.assertIn("plan_class=v100-32gb", line[0])
        self.assertIn("agent_class=t4-16gb", line[0])
        self.assertEqual(c.begin_step(6), 4)
        self.assertEqual(c.compute(), [BF16] * 4)
        self.assertFalse(c.plan().has_plan)

        # Map 5 with this class's plan, then prismd repeats map 5 in a Welcome without a plan:
        # the plan the file holds for it is withdrawn, and the trainer, already at map 5, runs
        # every block high from its next step.
        fake.outbox.put(pb.ServiceMessage(update=update(5, 8, plan)))
        wait_for("map 5", lambda: self.metric(a, "prism_agent_plan_map_version") == 5)
        self.assertEqual(c.begin_step(8), 5)
        self.assertEqual(c.compute(), [INT8, BF16, INT8, BF16])
        fake.welcome = pb.Welcome(config=pb.PolicyConfig(), map=update(5, 8))
        fake.kick.set()
        wait_for("the plan withdrawn", lambda: self.metric(a, "prism_agent_plans_withdrawn_total") == 1)
        self.assertEqual(self.metric(a, "prism_agent_upstream_welcomes_total"), 2)
        self.assertEqual(self.metric(a, "prism_agent_plan_map_version"), 0)
        self.assertEqual(self.metric(a, "prism_agent_plan_low_blocks"), 0)
        self.assertEqual(self.metric(a, "prism_agent_maps_applied_total"), 3)
        self.assertEqual(c.begin_step(9), 5)
        self.assertEqual(c.compute(), [BF16] * 4)
        p = c.plan()
        self.assertEqual((p.has_plan, p.map_version), (False, 5))
        # A second Welcome without a plan: nothing left to withdraw.
        fake.kick.set()
        wait_for("a third Welcome", lambda: self.metric(a, "prism_agent_upstream_welcomes_total") == 3)
        self.assertEqual(self.metric(a, "prism_agent_plans_withdrawn_total"), 1)

    def test_a_held_maps_plan_that_changes_in_a_welcome_is_rewritten(self):
        plan = pb.ComputePlan(device_class="t4-16gb", low_format=INT8, high_format="fp16", low_blocks=[0],
                              predicted_iteration_seconds=1.0, compute_seconds=0.75)
        fake = FakePrismd(pb.Welcome(config=pb.PolicyConfig(), map=update(3, 4, plan)))
        self.fakes.append(fake)
        a = self.agent(fake.target, "--profile-file", T4)
        c = self.client()
        wait_for("map 3", lambda: self.metric(a, "prism_agent_plan_map_version") == 3)
        self.assertEqual(c.begin_step(4), 3)
        self.assertEqual(c.compute(), [INT8, BF16, BF16, BF16])
        # prismd repeats map 3 with another plan (the pair it saved): the slot is rewritten.
        other = pb.ComputePlan(device_class="t4-16gb", low_format=INT8, high_format="fp16", low_blocks=[1, 2],
                               predicted_iteration_seconds=1.0, compute_seconds=0.5)
        fake.welcome = pb.Welcome(config=pb.PolicyConfig(), map=update(3, 4, other))
        fake.kick.set()
        wait_for("the plan rewritten", lambda: self.metric(a, "prism_agent_plans_written_total") == 2)
        self.assertEqual(self.metric(a, "prism_agent_plan_low_blocks"), 2)
        self.assertEqual(c.begin_step(5), 3)
        self.assertEqual(c.compute(), [BF16, INT8, INT8, BF16])
        # Only an entry figure differs (the same blocks): rewritten too.
        changed = pb.ComputePlan(device_class="t4-16gb", low_format=INT8, high_format="fp16", low_blocks=[1, 2],
                                 predicted_iteration_seconds=2.0, compute_seconds=0.5)
        fake.welcome = pb.Welcome(config=pb.PolicyConfig(), map=update(3, 4, changed))
        fake.kick.set()
        wait_for("the figures rewritten", lambda: self.metric(a, "prism_agent_plans_written_total") == 3)
        # The same plan again: nothing written.
        fake.kick.set()
        wait_for("a fourth Welcome", lambda: self.metric(a, "prism_agent_upstream_welcomes_total") == 4)
        self.assertEqual(self.metric(a, "prism_agent_plans_written_total"), 3)
        self.assertEqual(c.begin_step(6), 3)
        self.assertEqual(c.compute(), [BF16, INT8, INT8, BF16])

    def test_memory_bytes_is_read_exactly(self):
        for i, (text, want) in enumerate([('{"memory_bytes": 9223372036854775807}', 9223372036854775807),
                                          ('{"memory_bytes": 9007199254740993}', 9007199254740993),
                                          ('{"memory_bytes": 1e15}', 1000000000000000),
                                          ('{"memory_bytes": 0}', 0)]):
            path = self.write(f"memory{i}.json", text)
            fake = FakePrismd(pb.Welcome(config=pb.PolicyConfig()))
            self.fakes.append(fake)
            a = self.agent(fake.target, "--profile-file", path, "--device-class", "play", name=f"agent{i}")
            metrics = http_get(a.metrics, "/metrics", openapi=False)[1]
            with self.subTest(text=text):
                self.assertIn(f"\nprism_agent_device_memory_bytes {want}\n", metrics)
            c = self.client()
            with self.subTest(text=text, where="hello"):
                self.assertEqual(fake.next("hello").hello.device.memory_bytes, want)
            c.close()
            self.assertEqual(a.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
