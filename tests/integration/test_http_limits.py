#!/usr/bin/python3
"""prismd's HTTP limits against the lockouts of issue 12, item 1: slowloris connections and
event streams from one client address must not keep /healthz and /v1/jobs from answering others.

The attacker's sockets are bound to 127.0.0.2 (Linux routes all of 127/8 to lo) and prismd listens
on 127.0.0.1; probes come from 127.0.0.1. Every wait is bounded; counters in /metrics are asserted
exactly. Runs the real prismd (tests/integration/test_grpc.py's Prismd) on free loopback ports."""

import http.client
import json
import os
import resource
import select
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import openapi_check  # noqa: E402
from test_grpc import Agent, Prismd, free_port  # noqa: E402

WAIT_S = 30  # generous: CI runs on a loaded 2-core machine
PROBE_S = 10  # a probe's answer: generous, yet below the 30 s idle timeout that frees attackers' slots
ATTACKER = "127.0.0.2"


def raise_fd_limit(n):
    """Lets this process (and the prismd it starts) hold n descriptors, where the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connect_from(source, addr):
    host, port = addr.rsplit(":", 1)
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(WAIT_S)
    s.connect((host, int(port)))
    return s


def request(addr, path, source="127.0.0.1", method="GET", body=None, headers=None, timeout=WAIT_S,
            listener="http"):
    """(status, headers, body) of one request on a new connection from source; bounded in time.
    The answer is checked against prismd's OpenAPI document (listener "health": --health-listen)."""
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0))
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = openapi_check.response(method, path, r, r.read(), listener=listener)
        return r.status, dict(r.getheaders()), data.decode()
    finally:
        c.close()


def metrics(addr):
    """The samples of /metrics as {"name{labels}": value}."""
    status, _, text = request(addr, "/metrics")
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def refused(addr, reason, listener="http"):
    return metrics(addr)['prism_http_refused_total{listener="%s",reason="%s"}' % (listener, reason)]


def answers(addr):
    """True when GET /healthz on addr is answered 200 now (a closed or refused connection: False)."""
    try:
        return request(addr, "/healthz", timeout=PROBE_S)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def closed_by_peer(s):
    """True when the server has closed s (end of file or reset), without waiting."""
    poller = select.poll()
    poller.register(s, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        s.setblocking(False)
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def wait_for(what, predicate, timeout_s=WAIT_S, every_s=0.05):
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / every_s) + 1):
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(every_s)
    raise AssertionError("timed out after %s s waiting for %s" % (timeout_s, what))


class HttpLimitsTest(unittest.TestCase):
    def start(self, *extra):
        self.prismd = Prismd(*extra)
        self.addCleanup(self.stop)
        return self.prismd

    def stop(self):
        for s in getattr(self, "sockets", []):
            s.close()
        code = self.prismd.stop()
        self.assertEqual(code, 0, self.prismd.logs())

    def attack(self, n, addr=None, source=ATTACKER, first=b"GET /hea"):
        """n connections from source, each with the start of a request line and nothing more."""
        self.sockets = getattr(self, "sockets", [])
        opened = []
        for _ in range(n):
            s = connect_from(source, addr or self.prismd.http_addr)
            s.sendall(first)
            opened.append(s)
        self.sockets += opened
        return opened

    def assert_probes_answer(self, addr=None):
        addr = addr or self.prismd.http_addr
        status, _, body = request(addr, "/healthz", timeout=PROBE_S)
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        status, _, body = request(addr, "/v1/jobs", timeout=PROBE_S)
        self.assertEqual(status, 200, body)

    def test_one_address_is_held_to_its_connection_limit_and_probes_answer(self):
        p = self.start("--http-max-connections-per-address", "8", "--http-request-timeout", "0")
        attackers = self.attack(20)
        wait_for("12 refusals", lambda: refused(p.http_addr, "per_address") == 12)
        wait_for("12 attacker sockets closed", lambda: sum(closed_by_peer(s) for s in attackers) == 12)
        self.assertEqual(sum(not closed_by_peer(s) for s in attackers), 8)
        self.assert_probes_answer()
        self.assertEqual(refused(p.http_addr, "per_address"), 12)

    def test_1100_connections_from_one_address_at_the_default_limits(self):
        """The attack as it was found, at prismd's defaults: 64 per address are held, the rest
        closed at once; the 64 keep trickling bytes of their headers (so the 30 s idle timeout
        never fires) and are cut at the 10 s request deadline; probes from another address
        answer throughout."""
        if raise_fd_limit(4096) < 1300:
            self.skipTest("the descriptor limit is below 1300")
        p = self.start()
        attackers = self.attack(1100)
        self.assert_probes_answer()
        wait_for("1036 refusals", lambda: refused(p.http_addr, "per_address") >= 1036)
        self.assertEqual(refused(p.http_addr, "per_address"), 1100 - 64)
        held = wait_for("1036 attacker sockets closed",
                        lambda: (lambda left: len(left) == 64 and left)([s for s in attackers if not closed_by_peer(s)]))
        start = time.monotonic()
        for _ in range(int(2 * WAIT_S / 0.5)):
            held = [s for s in held if not closed_by_peer(s)]
            if not held or time.monotonic() - start > 2 * WAIT_S:
                break
            for s in held:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            self.assert_probes_answer()
            time.sleep(0.5)  # the attacker's pace, not a wait for prismd
        self.assertEqual(held, [], "attackers still held after %s s" % (2 * WAIT_S))
        wait_for("64 deadline cuts", lambda: refused(p.http_addr, "request_deadline") >= 64)
        self.assertEqual(refused(p.http_addr, "request_deadline"), 64)
        self.assertEqual(refused(p.http_addr, "per_address"), 1100 - 64)

    def test_slowloris_is_cut_at_the_request_deadline_however_it_trickles(self):
        """Each attacker connection sends one more byte of its headers every 0.2 s, so the idle
        timeout never fires; the 1 s request deadline closes them all, and each is counted."""
        p = self.start("--http-request-timeout", "1")
        attackers = self.attack(20)
        start = time.monotonic()
        open_ = list(attackers)
        for _ in range(int(WAIT_S / 0.2)):
            open_ = [s for s in open_ if not closed_by_peer(s)]
            if not open_ or time.monotonic() - start > WAIT_S:
                break
            for s in open_:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            status, _, _ = request(p.http_addr, "/healthz", timeout=PROBE_S)
            self.assertEqual(status, 200)
            time.sleep(0.2)  # the attacker's pace, not a wait for prismd
        self.assertEqual(open_, [], "connections still open after %s s" % WAIT_S)
        wait_for("20 deadline cuts", lambda: refused(p.http_addr, "request_deadline") >= 20)
        self.assertEqual(refused(p.http_addr, "request_deadline"), 20)
        self.assertEqual(refused(p.http_addr, "per_address"), 0)
        # A request that arrives whole, in pieces but in time, is answered.
        s = connect_from(ATTACKER, p.http_addr)
        self.sockets.append(s)
        for piece in (b"GET /hea", b"lthz HTTP/1.1\r\n", b"Host: x\r\n\r\n"):
            s.sendall(piece)
        answer = b""
        for _ in range(100):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer)
        self.assertTrue(answer.endswith(b'{"status":"ok"}'), answer)

    def open_stream(self, job, source=ATTACKER):
        """(status, headers, socket, first bytes) of GET /v1/jobs/JOB/events from source."""
        s = connect_from(source, self.prismd.http_addr)
        self.sockets = getattr(self, "sockets", []) + [s]
        s.sendall(b"GET /v1/jobs/%s/events HTTP/1.1\r\nHost: x\r\n\r\n" % job.encode())
        data = b""
        for _ in range(1000):
            if b"\r\n\r\n" in data and (not data.startswith(b"HTTP/1.1 200") or b"event: map" in data or
                                        b"\n\n" in data.split(b"\r\n\r\n", 1)[1]):
                break
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if not data.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in data:
                head, rest = data.split(b"\r\n\r\n", 1)
                length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")]
                if length and len(rest) >= length[0]:
                    break
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(l.split(": ", 1) for l in lines[1:])
        return int(lines[0].split()[1]), headers, s, rest

    def make_job(self, job):
        a = Agent(self.prismd)
        self.addCleanup(a.close)
        a.hello(job, 0, 1)
        a.next()
        wait_for("job %s in REST" % job, lambda: request(self.prismd.http_addr, "/v1/jobs/%s/config" % job)[0] == 200)

    def assert_refused_stream(self, status, headers, rest, what):
        self.assertEqual(status, 503)
        self.assertEqual(headers.get("Retry-After"), "10")
        self.assertEqual(headers.get("Content-Type"), "application/json")
        error = json.loads(rest)["error"]
        self.assertEqual(error["code"], "unavailable")
        self.assertIn(what, error["message"])

    def test_event_streams_are_capped_per_job_at_the_defaults(self):
        p = self.start()
        self.make_job("job-e")
        for _ in range(32):
            status, _, _, first = self.open_stream("job-e")
            self.assertEqual(status, 200)
            self.assertIn(b"event: map", first)
        status, headers, _, rest = self.open_stream("job-e")
        self.assert_refused_stream(status, headers, rest, "--http-max-event-streams-per-job")
        self.assertEqual(refused(p.http_addr, "event_streams_per_job"), 1)
        self.assertEqual(refused(p.http_addr, "event_streams"), 0)
        self.assertEqual(metrics(p.http_addr)["prism_http_event_streams"], 32)
        self.assert_probes_answer()

    def test_event_streams_are_capped_in_total_below_the_connection_limit(self):
        p = self.start("--http-max-event-streams", "6", "--http-max-event-streams-per-job", "4")
        self.make_job("job-a")
        self.make_job("job-b")
        streams = []
        for job in ("job-a",) * 4:
            status, _, s, _ = self.open_stream(job)
            self.assertEqual(status, 200, job)
            streams.append(s)
        status, headers, _, rest = self.open_stream("job-a")
        self.assert_refused_stream(status, headers, rest, "--http-max-event-streams-per-job")
        for job in ("job-b",) * 2:
            status, _, s, _ = self.open_stream(job)
            self.assertEqual(status, 200, job)
            streams.append(s)
        status, headers, _, rest = self.open_stream("job-b")
        self.assert_refused_stream(status, headers, rest, "--http-max-event-streams")
        self.assertEqual(refused(p.http_addr, "event_streams_per_job"), 1)
        self.assertEqual(refused(p.http_addr, "event_streams"), 1)
        self.assert_probes_answer()
        # A stream that ends gives its place back (prismd notices at its next keep-alive).
        streams[0].close()
        self.sockets.remove(streams[0])
        status = wait_for("a place for job-b", lambda: self.open_stream("job-b")[0] == 200, timeout_s=60,
                          every_s=1)
        self.assertTrue(status)

    def test_health_listener_answers_while_the_main_listener_is_full(self):
        """Six addresses fill the main listener's 20 connections; the health listener, with its
        own connections and thread, still answers probes, and holds one address to its limit."""
        health = "127.0.0.1:%d" % free_port()
        p = self.start("--http-max-connections", "20", "--http-max-connections-per-address", "4",
                       "--http-max-event-streams", "8", "--http-request-timeout", "0", "--health-listen", health,
                       "--health-max-connections", "8", "--health-max-connections-per-address", "2")
        for i in range(2, 8):
            self.attack(4, source="127.0.0.%d" % i)
        self.assertFalse(answers(p.http_addr))  # the main listener is full: a probe is closed at once
        status, _, body = request(health, "/healthz", timeout=PROBE_S, listener="health")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        status, _, body = request(health, "/readyz", timeout=PROBE_S, listener="health")
        self.assertEqual((status, json.loads(body)["status"]), (200, "ready"))
        status, _, body = request(health, "/v1/jobs", listener="health")
        self.assertEqual((status, json.loads(body)["error"]["code"]), (404, "not_found"))
        # One address against the health listener: 2 held, 3 refused, probes still answered.
        self.attack(5, addr=health)
        status, _, _ = request(health, "/healthz", timeout=PROBE_S, listener="health")
        self.assertEqual(status, 200)
        # /metrics is the main listener's, full until the attackers go.
        main_attackers = self.sockets[:24]
        for s in main_attackers:
            s.close()
        self.sockets = self.sockets[24:]
        turned_away = []  # probes closed at once while prismd was still closing the attackers'

        def free_again():
            ok = answers(p.http_addr)
            turned_away.extend([] if ok else [1])
            return ok
        wait_for("the main listener free again", free_again)
        self.assertEqual(refused(p.http_addr, "per_address", listener="health"), 3)
        self.assertEqual(refused(p.http_addr, "max_connections", listener="http"), 4 + 1 + len(turned_away))
        self.assertEqual(refused(p.http_addr, "per_address", listener="http"), 0)

    def test_limits_that_do_not_fit_are_refused_at_start(self):
        binary = os.path.join(os.environ.get("PRISM_BUILD_DIR", "build"), "service", "prismd")
        import subprocess
        for args, text in ((["--http-max-connections", "100", "--http-max-connections-per-address", "100"],
                            "--http-max-connections-per-address (100) must be below --http-max-connections (100)"),
                           (["--http-max-connections", "100", "--http-max-event-streams", "100"],
                            "--http-max-event-streams (100) must be below --http-max-connections (100)"),
                           (["--health-max-connections", "4", "--health-max-connections-per-address", "4"],
                            "--health-max-connections-per-address (4) must be below --health-max-connections (4)")):
            r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=WAIT_S)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(text, r.stderr)

    def test_help_shows_every_limit_with_its_default(self):
        binary = os.path.join(os.environ.get("PRISM_BUILD_DIR", "build"), "service", "prismd")
        import subprocess
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=WAIT_S).stdout
        entries = {}  # option name: its entry's text (the first line, then the indented ones)
        name = None
        for line in out.splitlines():
            head = line.lstrip()
            if head.startswith("--") and len(line) - len(head) < 10:
                name = head[2:].split()[0].split("=")[0]
                entries[name] = head
            elif name and line.startswith(" " * 10):
                entries[name] += " " + head
            else:
                name = None
        for option, default in (("http-max-connections", "1024"), ("http-max-connections-per-address", "64"),
                                ("http-request-timeout", "10"), ("http-idle-timeout", "30"),
                                ("http-max-url-bytes", "8192"), ("http-max-header-bytes", "16384"),
                                ("http-max-event-streams", "256"), ("http-max-event-streams-per-job", "32"),
                                ("health-max-connections", "16"), ("health-max-connections-per-address", "4")):
            self.assertIn("(default: %s)" % default, entries[option], option)


if __name__ == "__main__":
    unittest.main(verbosity=2)
