#!/usr/bin/python3
"""prism-agent on its own: its command line, its local socket against bad frames, its backoff
while prismd is unreachable, /metrics, SIGTERM, and the hint table it keeps across its own
restart (fail-static). Real processes (prismd, prism-agent), a real libprism client through the
Python binding, raw frames on the Unix socket for what a client would never send. Every wait is
bounded; every process is stopped on every path."""

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

BUILD = os.path.abspath(os.environ.get("PRISM_BUILD_DIR", "build"))
SOURCE = os.path.abspath(os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(BUILD, "python-gen"))
sys.path.insert(0, os.path.join(SOURCE, "python"))

import prism  # noqa: E402
from prism.v1 import prism_pb2 as pb  # noqa: E402
from prismtest import free_port, http_get, wait_for  # noqa: E402

AGENT = os.path.join(BUILD, "agent", "prism-agent")
PRISMD = os.path.join(BUILD, "service", "prismd")
CONFIG = {"warmup_steps": 2, "update_interval_steps": 2, "history_window": 2, "apply_lag_steps": 2,
          "min_steps_between_switches": 0}
BLOCKS = [("b0", [(4, 4)]), ("b1", [(4, 4)]), ("b2", [(4, 4)]), ("b3", [(4, 4)])]


def run(*args, timeout=20):
    return subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=timeout)


def frame(msg):
    data = msg.SerializeToString()
    return struct.pack("<I", len(data)) + data


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


class AgentTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-agent-test-")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def prismd(self, grpc=None, http=None, config_values=None, extra=()):
        config = os.path.join(self.dir, "config.json")
        with open(config, "w") as f:
            json.dump(config_values or CONFIG, f)
        grpc = grpc or f"127.0.0.1:{free_port()}"
        http = http or f"127.0.0.1:{free_port()}"
        log = os.path.join(self.dir, "prismd.log")
        started = 0
        if os.path.exists(log):
            with open(log) as f:
                started = f.read().count('msg="listening"')
        p = Proc([PRISMD, "--grpc-listen", grpc, "--http-listen", http, "--data-dir", os.path.join(self.dir, "data"),
                  "--config", config, *extra], log)
        p.grpc, p.http = grpc, http
        self.procs.append(p)
        wait_for("prismd listening", lambda: p.text().count('msg="listening"') > started)
        return p

    def agent(self, prismd_target, *extra, name="agent", shared="shared"):
        metrics = f"127.0.0.1:{free_port()}"
        p = Proc([AGENT, "--prismd", prismd_target, "--dir", os.path.join(self.dir, shared), "--metrics-listen",
                  metrics, "--device", "cpu", "--profile-budget-ms", "100", *extra],
                 os.path.join(self.dir, f"{name}.log"))
        p.metrics = metrics
        self.procs.append(p)
        wait_for("the agent's /readyz", lambda: http_get(metrics, "/readyz", openapi=False)[0] == 200)
        return p

    def metric(self, agent, name):
        text = http_get(agent.metrics, "/metrics", openapi=False)[1]
        m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
        return float(m.group(1)) if m else None

    def client(self, job="j1", shared="shared"):
        c = prism.Client(job_id=job, rank=0, world_size=1, dir=os.path.join(self.dir, shared),
                         reconnect_interval_ms=50)
        c.register("m", BLOCKS)
        return c

    def stats(self, scale):
        return [{"l2_norm": scale[b], "max_abs": scale[b], "mean": 0.0, "variance": 0.01, "numel": 16,
                 "nonfinite": 0} for b in range(len(BLOCKS))]

    # ---- the command line ----

    def test_help_lists_every_option(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        for opt in ("--prismd", "--dir", "--token-file", "--tls-ca", "--node", "--max-blocks", "--backoff-initial-ms",
                    "--backoff-max-ms", "--heartbeat-ms", "--queue-bytes", "--max-message-bytes", "--metrics-listen",
                    "--device", "--device-class", "--profile-budget-ms", "--log-level", "--help", "--version"):
            self.assertIn(opt, r.stdout)
        self.assertEqual(run("--version").stdout, "prism-agent 0.1.0\n")

    def test_bad_options_name_the_option(self):
        cases = [
            (["--max-blocks", "0"], 'prism-agent: --max-blocks: "0" is not a whole number from 1 to 1048576\n'),
            (["--nope"], "prism-agent: --nope: unknown option (see --help)\n"),
            (["--dir"], "prism-agent: --dir: needs a value (see --help)\n"),
            (["--metrics-listen", "localhost:80"],
             'prism-agent: --metrics-listen: "localhost:80" is not ADDR:PORT (ADDR an IPv4 address a.b.c.d or an '
             'IPv6 address in brackets such as [::1]; PORT 1-65535)\n'),
            (["--device", "gpu"], 'prism-agent: --device: "gpu" is not auto, cpu or a CUDA device index\n'),
            (["--backoff-initial-ms", "500", "--backoff-max-ms", "100"],
             "prism-agent: --backoff-max-ms: 100 is below --backoff-initial-ms 500\n"),
            (["--device-class", "a b"], 'prism-agent: --device-class: "a b" is not 1 to 63 letters, digits, '
             "'-', '_' or '.'\n"),
            (["--log-level", "loud"], 'prism-agent: --log-level: "loud" is not one of debug, info, warn, error\n'),
            (["extra"], "prism-agent: extra: unexpected argument (options only; see --help)\n"),
        ]
        for args, message in cases:
            r = run(*args)
            self.assertEqual((r.returncode, r.stderr), (2, message), args)
        r = run("--token-file", os.path.join(self.dir, "missing"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("--token-file: ", r.stderr)
        self.assertIn(os.path.join(self.dir, "missing"), r.stderr)

    def test_second_agent_on_one_directory_is_refused(self):
        self.agent("127.0.0.1:1")
        r = run("--prismd", "127.0.0.1:1", "--dir", os.path.join(self.dir, "shared"), "--metrics-listen", "off",
                "--device", "cpu", "--profile-budget-ms", "100")
        self.assertEqual(r.returncode, 1)
        self.assertIn("another prism-agent is listening there", r.stderr)

    # ---- the local socket ----

    def test_bad_frames_close_their_connection_and_nothing_else(self):
        a = self.agent("127.0.0.1:1")
        path = os.path.join(self.dir, "shared", "prism-agent.sock")
        heartbeat = pb.AgentMessage(heartbeat=pb.Heartbeat(unix_time_ms=1))
        bad = [struct.pack("<I", 3) + b"\xff\xff\xff",          # not an AgentMessage
               struct.pack("<I", 0xFFFFFFFF),                     # longer than 64 MiB
               frame(heartbeat),                                  # a kind trainers do not send
               frame(pb.AgentMessage(hello=pb.Hello(rank=0)))]    # Hello without a job
        for i, data in enumerate(bad):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(path)
                s.sendall(data)
                self.assertEqual(s.recv(16), b"", f"bad frame {i} did not close its connection")
            wait_for(f"bad frame {i} counted",
                     lambda: self.metric(a, "prism_agent_trainer_frames_rejected_total") == i + 1)
        self.assertIn('reason="a frame longer than the 64 MiB limit"', a.text())
        # The agent still serves a real client.
        c = self.client()
        self.assertTrue(c.report_stats(0, self.stats([1, 1, 1, 1])))
        wait_for("the report", lambda: self.metric(a, "prism_agent_reports_received_total") == 1)
        c.close()

    # ---- prismd unreachable ----

    def test_backoff_while_prismd_is_unreachable(self):
        a = self.agent(f"127.0.0.1:{free_port()}", "--backoff-initial-ms", "100", "--backoff-max-ms", "400")
        c = self.client()
        for step in range(5):
            c.report_stats(step, self.stats([1, 1, 1, 1]))
        wait_for("attempts", lambda: (self.metric(a, "prism_agent_upstream_attempts_total") or 0) >= 3)
        time.sleep(1.5)
        attempts = self.metric(a, "prism_agent_upstream_attempts_total")
        # 1.5 s more at waits of 50-400 ms (jitter x0.5-x1 of 100, 200, 400, 400...): 3 to 30 attempts more.
        self.assertLessEqual(attempts, 3 + 30 + 5)
        self.assertLessEqual(self.metric(a, "prism_agent_upstream_backoff_seconds"), 0.4)
        self.assertGreaterEqual(self.metric(a, "prism_agent_upstream_backoff_seconds"), 0.05)
        self.assertEqual(self.metric(a, "prism_agent_upstream_connected"), 0)
        text = http_get(a.metrics, "/metrics", openapi=False)[1]
        self.assertIn('prism_agent_reports_dropped_total{reason="disconnected"} 5\n', text)
        self.assertIn('msg="cannot reach prismd; keeping the last map"', a.text())
        self.assertEqual(c.begin_step(5), 0)
        c.close()

    # ---- a whole round: map, ack, metrics, SIGTERM, restart ----

    def test_map_ack_metrics_and_restart_keep_the_map(self):
        d = self.prismd()
        a = self.agent(d.grpc)
        c = self.client()
        wait_for("welcome", lambda: self.metric(a, "prism_agent_upstream_connected") == 1)
        # Blocks 2 and 3 much quieter than 0 and 1: the first decision puts them low.
        for step in range(3):
            c.begin_step(step)
            self.assertTrue(c.report_stats(step, self.stats([10, 10, 0.1, 0.1])))
        wait_for("a map", lambda: self.metric(a, "prism_agent_map_version") == 1)
        effective = int(self.metric(a, "prism_agent_map_effective_step"))
        self.assertEqual(effective, 1 + CONFIG["apply_lag_steps"])
        self.assertEqual(c.begin_step(effective - 1), 0, "the map was used before its effective step")
        self.assertEqual(c.begin_step(effective), 1)
        self.assertEqual(c.precisions(), ["bf16", "bf16", "int8", "int8"])
        wait_for("the ack", lambda: http_get(a.metrics, "/metrics", openapi=False)[1].count(
            'prism_agent_messages_sent_total{kind="ack"} 1\n'))
        self.assertEqual(self.metric(a, "prism_agent_trainer_map_version"), 1)
        self.assertEqual(self.metric(a, "prism_agent_trainer_map_step"), effective)

        status, text = http_get(a.metrics, "/metrics", openapi=False)
        self.assertEqual(status, 200)
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
            self.assertTrue(name.startswith("prism_agent_"), name)
            suffix = "(_bucket|_sum|_count)" if kind == "histogram" else ""
            self.assertRegex(text, r"(?m)^%s%s(\{[^}]*\})? [0-9.e+-]+$" % (re.escape(name), suffix))
        self.assertEqual(http_get(a.metrics, "/healthz", openapi=False)[0], 200)
        self.assertEqual(http_get(a.metrics, "/nope", openapi=False)[0], 404)

        # SIGTERM: exit 0, the socket goes, the hint table stays.
        self.assertEqual(a.stop(), 0)
        self.assertIn('msg="stopped"', a.text())
        self.assertFalse(os.path.exists(os.path.join(self.dir, "shared", "prism-agent.sock")))
        self.assertTrue(os.path.exists(os.path.join(self.dir, "shared", "prism-hints")))
        self.assertEqual(c.begin_step(effective + 1), 1, "the trainer lost its map with the agent")

        # prismd gone too: a restarted agent still hands the kept map on, and the trainer keeps it.
        d.stop(signal.SIGKILL)
        a2 = self.agent(d.grpc, name="agent2")
        self.assertEqual(self.metric(a2, "prism_agent_map_version"), 1)
        self.assertEqual(c.begin_step(effective + 2), 1)
        self.assertEqual(c.precisions(), ["bf16", "bf16", "int8", "int8"])
        # prismd back: the agent reconnects, the trainer's client comes back by itself, and
        # the same map (version 1) is not written again.
        self.prismd(grpc=d.grpc)
        wait_for("the client reconnected", lambda: c.report_stats(9, self.stats([10, 10, 0.1, 0.1])))
        wait_for("welcome after the restarts", lambda: self.metric(a2, "prism_agent_upstream_connected") == 1)
        self.assertEqual(self.metric(a2, "prism_agent_maps_applied_total"), 0)
        self.assertEqual(self.metric(a2, "prism_agent_reports_received_total"), 1)
        self.assertEqual(c.counters()["reconnects"], 1)
        c.close()
        self.assertEqual(a2.stop(), 0)

    # ---- TLS and tokens ----

    def test_tls_and_job_tokens(self):
        cert, key = os.path.join(self.dir, "cert.pem"), os.path.join(self.dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        tokens = {}
        for name, value in (("a", "token-a\n"), ("b", "token-b")):
            tokens[name] = os.path.join(self.dir, f"token-{name}")
            with open(tokens[name], "w") as f:
                f.write(value)
        d = self.prismd(extra=("--tls-cert", cert, "--tls-key", key))
        # The job's first agent brings its token over TLS: welcomed.
        a = self.agent(d.grpc, "--tls-ca", cert, "--token-file", tokens["a"], name="agent-a", shared="a")
        ca = self.client(shared="a")
        ca.report_stats(0, self.stats([1, 1, 1, 1]))
        wait_for("a welcome over TLS", lambda: self.metric(a, "prism_agent_upstream_connected") == 1)
        # Another token for the same job: refused (PERMISSION_DENIED), never welcomed, retried.
        b = self.agent(d.grpc, "--tls-ca", cert, "--token-file", tokens["b"], "--backoff-max-ms", "200",
                       name="agent-b", shared="b")
        cb = self.client(shared="b")
        cb.report_stats(0, self.stats([1, 1, 1, 1]))
        wait_for("refusals", lambda: (self.metric(b, "prism_agent_upstream_failures_total") or 0) >= 2)
        self.assertEqual(self.metric(b, "prism_agent_upstream_welcomes_total"), 0)
        self.assertIn("code=7", b.text())
        self.assertIn("wrong or missing token", b.text())
        # Plaintext against a TLS prismd: never welcomed either.
        c = self.agent(d.grpc, "--token-file", tokens["a"], "--backoff-max-ms", "200", name="agent-c", shared="c")
        cc = self.client(shared="c")
        cc.report_stats(0, self.stats([1, 1, 1, 1]))
        wait_for("failures", lambda: (self.metric(c, "prism_agent_upstream_failures_total") or 0) >= 2)
        self.assertEqual(self.metric(c, "prism_agent_upstream_welcomes_total"), 0)
        self.assertEqual(self.metric(a, "prism_agent_upstream_connected"), 1)
        for cl in (ca, cb, cc):
            cl.close()

    # ---- prism.torch on top of it all ----

    @staticmethod
    def as_transferred(tensors, fmt):
        """The tensors as a block transfer in fmt delivers them, computed here with the kernels:
        one BF16 block of them all, quantized per 128, dequantized to BF16, cut and cast back."""
        import torch
        flat = torch.cat([t.detach().reshape(-1).to(torch.bfloat16) for t in tensors])
        codes, scales = prism.quantize(flat, fmt, "block", 128)
        back = prism.dequantize(codes, scales, fmt, numel=flat.numel(), dtype="bfloat16")
        out, at = [], 0
        for t in tensors:
            out.append(back[at:at + t.numel()].view(t.shape).to(t.dtype))
            at += t.numel()
        return out

    def test_torch_attachment_applies_the_map_to_the_weights_and_calibrates(self):
        import torch
        import prism.torch
        d = self.prismd(config_values=dict(CONFIG, mode="static", force_int8_blocks=[1]))
        self.agent(d.grpc)
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        pt = prism.torch.attach(blocks, job_id="t1", dir=os.path.join(self.dir, "shared"), model_id="t",
                                reconnect_interval_ms=50)
        x = torch.randn(4, 16)

        def model():
            return blocks[2](blocks[1](blocks[0](x)))

        version = 0
        for step in range(200):  # until the forced map is in effect (about 2 + 2 steps)
            version = pt.begin_step(step)
            if version:
                break
            model().sum().backward()
            pt.end_step(step, loss=1.0)
            time.sleep(0.02)
        self.assertEqual(version, 1)
        self.assertEqual(pt.precisions(), ["bf16", "int8", "bf16"])
        masters = {b: [p.detach().clone() for p in blocks[b].parameters()] for b in range(3)}
        # begin_step ran before the forward pass: block 1 has its int8 weights, exactly what the
        # kernels give for its parameters as one BF16 block, quantized and dequantized; blocks 0
        # and 2 have theirs unchanged.
        pt._restore_weights()
        masters = {b: [p.detach().clone() for p in blocks[b].parameters()] for b in range(3)}
        pt.begin_step(step)
        for p, want in zip(blocks[1].parameters(), self.as_transferred(masters[1], "int8")):
            self.assertTrue(torch.equal(p.detach(), want))
        self.assertFalse(torch.equal(blocks[1].weight.detach(), masters[1][0]))
        for b in (0, 2):
            for p, m in zip(blocks[b].parameters(), masters[b]):
                self.assertTrue(torch.equal(p.detach(), m))
        # end_step gives the optimizer the full-precision weights back, bit for bit.
        model().sum().backward()
        self.assertTrue(pt.end_step(step, loss=1.0))
        for b in range(3):
            for p, m in zip(blocks[b].parameters(), masters[b]):
                self.assertTrue(torch.equal(p.detach(), m))

        # Calibration: each block's output with int8 weights against bf16 ones, on its real inputs.
        errors = pt.calibrate(model, samples=2, fmt="int8")
        with torch.no_grad():
            inputs = [x, blocks[0](x), blocks[1](blocks[0](x))]
            for b in range(3):
                w, bias = blocks[b].weight, blocks[b].bias
                ref = torch.nn.functional.linear(inputs[b], w.to(torch.bfloat16).float(), bias.to(torch.bfloat16).float())
                low = torch.nn.functional.linear(inputs[b], *self.as_transferred([w, bias], "int8"))
                want = prism.relative_error(ref.reshape(-1).contiguous(), low.reshape(-1).contiguous())
                self.assertEqual(errors[b], want, f"block {b}")
                self.assertGreater(errors[b], 0)
        for b in range(3):
            for p, m in zip(blocks[b].parameters(), masters[b]):
                self.assertTrue(torch.equal(p.detach(), m), "calibrate changed the weights")
        self.assertEqual(pt.counters()["calibrations_sent"], 1)

        # Under torch.autocast, which caches each parameter's BF16 cast until its outermost region
        # ends: calibrate inside one region measures the weights it puts in place (not the cast
        # of the weights its capturing pass saw, which would give 0 for a Linear), the same
        # figures as each forward pass in a region of its own.
        def autocast():
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)

        with autocast():
            errors = pt.calibrate(model, samples=2, fmt="int8")
        with torch.no_grad():
            inputs = [x]
            for b in range(2):
                with autocast():
                    inputs.append(blocks[b](inputs[-1]))
            for b in range(3):
                w, bias = blocks[b].weight, blocks[b].bias
                with autocast():
                    ref = torch.nn.functional.linear(inputs[b], w.to(torch.bfloat16).float(),
                                                     bias.to(torch.bfloat16).float())
                with autocast():
                    low = torch.nn.functional.linear(inputs[b], *self.as_transferred([w, bias], "int8"))
                want = prism.relative_error(ref.float().reshape(-1).contiguous(), low.float().reshape(-1).contiguous())
                self.assertEqual(errors[b], want, f"block {b} under autocast")
                self.assertGreater(errors[b], 0)
        self.assertEqual(pt.counters()["calibrations_sent"], 2)
        # A map applied inside a region reaches the Linears: after a forward pass cached the
        # full-precision casts, begin_step puts block 1's int8 weights in, and the next pass in
        # the same region computes with them.
        with torch.no_grad():
            with autocast():
                full = model()
                pt.begin_step(step)
                mapped = model()
            with autocast():
                want = model()  # block 1 still holds its int8 weights; a region of its own
        self.assertTrue(torch.equal(mapped, want))
        self.assertFalse(torch.equal(mapped, full))
        pt._restore_weights()
        for b in range(3):
            for p, m in zip(blocks[b].parameters(), masters[b]):
                self.assertTrue(torch.equal(p.detach(), m))
        pt.close()

    def test_torch_attachment_calibrates_every_wanted_format_on_one_capture(self):
        """Under low_precision auto, calibrate() without a format measures each format prismd
        wants, on one capture, and reports each: the same figures as one call per format; prismd
        then tells the rank that none is wanted any more."""
        import torch
        import prism.torch
        d = self.prismd(config_values=dict(CONFIG, low_precision="auto", low_formats=["int4", "fp8_e4m3", "int8"]))
        self.agent(d.grpc)
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        pt = prism.torch.attach(blocks, job_id="t2", dir=os.path.join(self.dir, "shared"), model_id="t2",
                                reconnect_interval_ms=50)
        x = torch.randn(4, 16)

        def model():
            return blocks[2](blocks[1](blocks[0](x)))

        def state(ready):
            def poll():
                pt.begin_step(0)
                s = pt.client.state()
                return s if s["upstream_connected"] and ready(s) else None
            return wait_for("the rank's state", poll)

        self.assertEqual(state(lambda s: s["calibration_formats"])["calibration_formats"],
                         ["int4", "fp8_e4m3", "int8"])
        self.assertTrue(pt.calibration_wanted())
        got = pt.calibrate(model, samples=2)
        self.assertEqual(list(got), ["int4", "fp8_e4m3", "int8"])
        for fmt, errors in got.items():
            self.assertEqual(sorted(errors), [0, 1, 2])
            self.assertEqual(errors, pt.calibrate(model, samples=2, fmt=fmt), fmt)
        for b in range(3):
            self.assertGreater(got["int4"][b], got["int8"][b])
        self.assertEqual(pt.counters()["calibrations_sent"], 6)
        s = state(lambda s: not s["calibration_formats"])
        self.assertEqual((s["calibration_needed"], s["calibration_formats"]), (False, []))
        self.assertFalse(pt.calibration_wanted())
        pt.close()

    def test_torch_static_scales_saturate_and_the_block_goes_back_to_bf16(self):
        """scale_mode static: the transfer keeps the scales of the weights as attached; block 1
        goes low by score, then its weights grow 16x, its int8 images saturate, end_step reports
        the fractions, and the next decision sends it to bf16 with reason saturation, prismd
        showing the fraction the kernels give."""
        import torch
        import prism.torch
        # A long cooldown: the block's first assignment (low) is exempt, the saturation rule ignores
        # it, and it keeps the score rule from moving the block low again right after.
        d = self.prismd(config_values=dict(CONFIG, scale_mode="static", run_calibration=False,
                                           min_steps_between_switches=1000))
        self.agent(d.grpc)
        torch.manual_seed(1)
        blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        attached = prism.torch._flat_bf16(list(blocks[1].parameters()))
        pt = prism.torch.attach(blocks, job_id="t3", dir=os.path.join(self.dir, "shared"), model_id="t3",
                                reconnect_interval_ms=50)
        x = torch.randn(4, 16)

        def step(n):
            pt.begin_step(n)
            # Block 1's gradients 10^4 times smaller than the others': its score is low.
            (blocks[0](x).sum() + 1e-4 * blocks[1](x).sum() + blocks[2](x).sum()).backward()
            pt.end_step(n, loss=1.0)
            for p in blocks.parameters():
                p.grad = None
            time.sleep(0.02)

        n = 0
        while pt.precisions()[1] != "int8" and n < 200:
            step(n)
            n += 1
        self.assertEqual(pt.precisions()[1], "int8")
        self.assertEqual(pt.client.state()["scale_mode"], "static")
        with torch.no_grad():
            for p in blocks[1].parameters():
                p.mul_(16)
        grown = prism.torch._flat_bf16(list(blocks[1].parameters()))
        _, registered, _ = prism.quantize_counted(attached, "int8", "block", 128)
        _, _, counts = prism.quantize_scaled(grown, registered, "int8", "block", 128)
        self.assertGreater(counts.saturated, 0)
        start = n
        while pt.precisions()[1] != "bf16" and n < start + 200:
            step(n)
            n += 1
        self.assertEqual(pt.precisions()[1], "bf16")
        doc = json.loads(http_get(d.http, "/v1/jobs/t3/blocks")[1])
        self.assertEqual([b["reason"] for b in doc["blocks"] if b["id"] == 1], ["saturation"])
        # The steps' reports, as prismd recorded them: block 1's fractions while it was low are
        # those of the attached weights' own scales (0 saturated) and then exactly the kernels'.
        import test_trace_record
        with urllib.request.urlopen("http://%s/v1/jobs/t3/trace" % d.http, timeout=30) as answer:
            records = test_trace_record.decode(answer.read())
        seen = set()
        for r in records:
            if r.WhichOneof("record") != "step":
                continue
            for b in r.step.merged.blocks:
                if b.block_id == 1 and b.WhichOneof("optional_saturated_fraction"):
                    seen.add((b.saturated_fraction, b.underflowed_fraction))
        want = (counts.saturated / grown.numel(), counts.underflowed / grown.numel())
        self.assertIn(want, seen)
        self.assertEqual([f for f in seen if f != want and f[0] != 0.0], [])
        pt.close()

    def test_torch_ranks_roll_back_together_at_a_loss_spike(self):
        """Two torch ranks (an Attachment and an agent each) on one job: block 1 goes low at the
        first decision (step 1); at step 8 both report a loss 5 times W's median; prismd rolls
        block 1 back to bf16 (reason loss_spike, a decision of its own) and both ranks switch at
        its effective step, with the same map, and the same switches before it."""
        import torch
        import prism.torch
        d = self.prismd(config_values=dict(CONFIG, loss_spike_factor=2, loss_spike_window=8,
                                           loss_spike_hold_steps=1000, run_calibration=False))
        agents = [self.agent(d.grpc, name=f"agent{r}", shared=f"shared{r}") for r in range(2)]
        torch.manual_seed(2)
        models = [torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3)) for _ in range(2)]
        models[1].load_state_dict(models[0].state_dict())
        pts = [prism.torch.attach(models[r], job_id="t4", rank=r, world_size=2,
                                  dir=os.path.join(self.dir, f"shared{r}"), model_id="t4", reconnect_interval_ms=50)
               for r in range(2)]
        x = torch.randn(4, 16)

        def job():
            jobs = [j for j in json.loads(http_get(d.http, "/v1/jobs")[1])["jobs"] if j["job_id"] == "t4"]
            return jobs[0] if jobs else None

        # Every step below must reach prismd (the first decision needs steps 0 and 1 of both
        # ranks): each client connected to its agent, each agent to prismd, and prismd with both.
        def connected(pt):
            pt.client.begin_step(0)  # the client's state is that of its last begin_step
            s = pt.client.state()
            return s["connected"] and s["upstream_connected"]
        wait_for("both ranks connected through their agents",
                 lambda: all([connected(pt) for pt in pts]) and (job() or {}).get("agents_connected") == 2 or None)

        def step(n, loss):
            for r, pt in enumerate(pts):
                pt.begin_step(n)
                blocks = models[r]
                # Block 1's gradients 10^-4 times the others': low by score.
                (blocks[0](x).sum() + 1e-4 * blocks[1](x).sum() + blocks[2](x).sum()).backward()
                self.assertTrue(pt.end_step(n, loss=loss), f"rank {r} step {n} dropped")
                for p in blocks.parameters():
                    p.grad = None

        def block1():
            doc = json.loads(http_get(d.http, "/v1/jobs/t4/blocks")[1])
            return [b for b in doc["blocks"] if b["id"] == 1]

        def tables_have(version):
            for a in agents:
                wait_for("the map in the agent's table",
                         lambda a=a: (self.metric(a, "prism_agent_map_version") or 0) >= version or None)

        for n in (0, 1):  # the first decision (n = 2, step 1) puts block 1 low
            step(n, 1.0)
        wait_for("block 1 low", lambda: [b["precision"] for b in block1()] == ["int8"] or None)
        low = job()
        self.assertEqual(low["decided_step"], 1)
        tables_have(low["map_version"])
        for n in range(2, 8):  # W: the 8 losses of steps 0 to 7
            step(n, 1.0)
        self.assertEqual([pt.precisions()[1] for pt in pts], ["int8", "int8"])
        step(8, 5.0)  # n = 9: off the schedule; 8 - 1 <= 8
        wait_for("the rollback", lambda: [b["reason"] for b in block1()] == ["loss_spike"] or None)
        back = job()
        self.assertEqual((back["decided_step"], back["effective_step"]), (8, 8 + CONFIG["apply_lag_steps"]))
        tables_have(back["map_version"])
        # Up to the effective step and no further: the scheduled decision at step 9 takes effect
        # at step 11.
        for n in range(9, back["effective_step"] + 1):
            step(n, 1.0)
        # Every step of both ranks reached its agent and prismd.
        wait_for("the last step at prismd", lambda: job()["step"] == back["effective_step"] or None)
        for a in agents:
            self.assertEqual(self.metric(a, "prism_agent_reports_received_total"), back["effective_step"] + 1)
        for pt in pts:
            self.assertEqual(pt.switches[-1][:2], (back["effective_step"], back["map_version"]))
            self.assertEqual(pt.switches[-1][2][1], "bf16")
            self.assertEqual(pt.late_switches, 0)
        self.assertEqual(pts[0].switches, pts[1].switches)
        for pt in pts:
            pt.close()


if __name__ == "__main__":
    unittest.main()
