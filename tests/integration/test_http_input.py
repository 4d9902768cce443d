#!/usr/bin/python3
"""prismd's HTTP input handling (issue 12, items 9 and 10): requests written as raw bytes on a
socket, and the status and exact JSON error code (DESIGN 6: {"error":{"code","message"}}) that
each gets. Runs the real prismd (tests/integration/test_grpc.py's Prismd) on free loopback ports;
every wait is bounded."""

import json
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import openapi_check  # noqa: E402
from test_grpc import Agent, Prismd  # noqa: E402

WAIT_S = 30


def raw(addr, data):
    """(status, headers, body bytes) of the answer to data, sent as it is on a new connection."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(data)
        answer = b""
        for _ in range(100000):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (l.split(": ", 1) for l in lines[1:])}
    status = int(lines[0].split()[1])
    openapi_check.raw(data, status, headers, body)
    return status, headers, body


def get(target, headers=b""):
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"


def patch(target, body, token=None):
    auth = b"Authorization: Bearer " + token.encode() + b"\r\n" if token else b""
    return (b"PATCH " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
            auth + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class HttpInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prismd = Prismd()
        cls.agent = Agent(cls.prismd)
        cls.agent.hello("job-i", 0, 1)
        cls.agent.next()
        for _ in range(400):
            if raw(cls.prismd.http_addr, get(b"/v1/jobs/job-i/config"))[0] == 200:
                break

    @classmethod
    def tearDownClass(cls):
        cls.agent.close()
        code = cls.prismd.stop()
        assert code == 0, cls.prismd.logs()

    def send(self, data):
        return raw(self.prismd.http_addr, data)

    def assert_error(self, data, status, code, message=None):
        got, headers, body = self.send(data)
        self.assertEqual(got, status, body[:300])
        self.assertEqual(headers.get("content-type"), "application/json", body[:300])
        error = json.loads(body)["error"]
        self.assertEqual(error["code"], code)
        if message:
            self.assertIn(message, error["message"])
        return error

    def refusals(self, reason):
        status, _, body = self.send(get(b"/metrics"))
        self.assertEqual(status, 200)
        key = 'prism_http_refused_total{listener="http",reason="%s"} ' % reason
        return int(next(l for l in body.decode().splitlines() if l.startswith(key)).split()[-1])

    def config(self):
        status, _, body = self.send(get(b"/v1/jobs/job-i/config"))
        self.assertEqual(status, 200)
        return json.loads(body)

    # ---- item 10: encoded NUL, invalid UTF-8, JSON bodies for protocol-level errors ----

    def test_an_encoded_nul_in_the_path_is_refused_and_nothing_is_applied(self):
        before = self.config()["warmup_steps"]
        self.assert_error(patch(b"/v1/jobs/job-i/config%00garbage", b'{"warmup_steps": 77}'), 400,
                          "invalid_argument", "%00")
        self.assertEqual(self.config()["warmup_steps"], before)
        self.assert_error(get(b"/v1/jobs%00/x"), 400, "invalid_argument", "encoded NUL")
        self.assert_error(get(b"/healthz%00"), 400, "invalid_argument", "encoded NUL")

    def test_an_encoded_nul_in_the_query_is_refused(self):
        self.assert_error(get(b"/v1/jobs/job-i/telemetry?limit=5%00x"), 400, "invalid_argument", "encoded NUL")

    def test_every_invalid_utf8_in_the_path_is_400(self):
        for bad in (b"%FF", b"%C0%AF", b"%C1%BF",  # not UTF-8; overlong 2-byte forms
                    b"%E0%80%AF", b"%E0%9F%BF",  # overlong 3-byte forms
                    b"%F0%80%80%AF", b"%F0%8F%BF%BF",  # overlong 4-byte forms
                    b"%ED%A0%80", b"%ED%BF%BF",  # surrogates U+D800, U+DFFF
                    b"%F4%90%80%80", b"%F5%80%80%80", b"%F8%88%80%80%80",  # above U+10FFFF
                    b"%80", b"%C3", b"%E2%82",  # a lone continuation byte, cut sequences
                    b"\xe0\x80\xaf", b"\xed\xa0\x80"):  # the same sent unencoded
            with self.subTest(bad=bad):
                self.assert_error(get(b"/v1/jobs/" + bad + b"/config"), 400, "invalid_argument",
                                  "not valid UTF-8")

    def test_a_control_character_in_the_path_is_400(self):
        for bad in (b"%01", b"%1F", b"%7F", b"%0A", b"%0D", b"\x01", b"\x7f"):
            with self.subTest(bad=bad):
                self.assert_error(get(b"/v1/jobs/j" + bad + b"/config"), 400, "invalid_argument",
                                  "contains a control character")

    def test_valid_utf8_in_the_path_is_looked_up(self):
        for good in (b"%C3%A9", b"%E2%82%AC", b"%F0%9F%98%80", b"%EF%BF%BF", b"%F4%8F%BF%BF", b"%ED%9F%BF"):
            with self.subTest(good=good):
                self.assert_error(get(b"/v1/jobs/" + good + b"/config"), 404, "not_found")

    def test_a_target_over_the_url_limit_is_json_414(self):
        before = self.refusals("url_too_long")
        self.assert_error(get(b"/v1/jobs/" + b"a" * 9000), 414, "uri_too_long", "--http-max-url-bytes")
        self.assertEqual(self.refusals("url_too_long"), before + 1)

    def test_headers_over_the_limit_are_json_431(self):
        before = self.refusals("headers_too_large")
        self.assert_error(get(b"/healthz", b"X-Big: " + b"a" * 20000 + b"\r\n"), 431, "headers_too_large",
                          "--http-max-header-bytes")
        many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(200))
        self.assert_error(get(b"/healthz", many), 431, "headers_too_large")
        self.assertEqual(self.refusals("headers_too_large"), before + 2)

    def test_a_body_over_1_mib_is_json_413(self):
        before = self.refusals("body_too_large")
        self.assert_error(patch(b"/v1/jobs/job-i/config", b" " * ((1 << 20) + 1)), 413, "too_large")
        self.assertEqual(self.refusals("body_too_large"), before + 1)

    def test_what_libmicrohttpd_answers_itself_keeps_its_status(self):
        """Requests libmicrohttpd refuses before prismd sees them (an HTTP version it does not
        speak; a request line past its 128 KiB buffer) keep libmicrohttpd's own body; the status
        is still the right one."""
        self.assertEqual(self.send(b"GET /healthz HTTP/2.0\r\nHost: x\r\nConnection: close\r\n\r\n")[0], 505)
        self.assertEqual(self.send(get(b"/" + b"a" * 200000))[0], 414)

    def test_events_need_a_job_id_between_jobs_and_events(self):
        # /v1/jobs/events is the job path of a job named "events" (GET there: 405, DELETE only),
        # never an event stream; before, it read as the events of job "events" (a 404 here).
        status, headers, _ = self.send(get(b"/v1/jobs/events"))
        self.assertEqual((status, headers.get("allow")), (405, "DELETE"))
        self.assert_error(get(b"/v1/jobs/job-i/x/events"), 404, "not_found")

    # ---- item 9: telemetry_file is checked when it is set ----

    def test_an_unusable_telemetry_file_is_refused_naming_the_key(self):
        data_dir = os.path.join(self.prismd.dir, "data")
        os.makedirs(os.path.join(data_dir, "jobs", "job-i", "a-directory"), exist_ok=True)
        before = self.config()["telemetry_file"]
        for name, why in (("t" * 300, "longer than 255 bytes"), ("t" * 256, "longer than 255 bytes"),
                          ("../escape.jsonl", "contains '/'"), ("sub/t.jsonl", "contains '/'"), ("..", "directory"),
                          (".", "directory"), ("", "is empty"), ("bad\nname", "control character"),
                          ("a-directory", "cannot be opened for append")):
            with self.subTest(name=name[:20]):
                error = self.assert_error(patch(b"/v1/jobs/job-i/config", json.dumps({"telemetry_file": name}).encode()),
                                          400, "invalid_argument", "telemetry_file")
                self.assertIn(why, error["message"])
        self.assertEqual(self.config()["telemetry_file"], before)

    def test_a_fifo_as_telemetry_file_is_refused_without_blocking(self):
        # Opening a FIFO for writing waits for a reader: the check must not open what is not a
        # regular file (before, an HTTP thread hung there for good).
        job_dir = os.path.join(self.prismd.dir, "data", "jobs", "job-i")
        os.makedirs(job_dir, exist_ok=True)
        os.mkfifo(os.path.join(job_dir, "a-fifo"))
        error = self.assert_error(patch(b"/v1/jobs/job-i/config", b'{"telemetry_file": "a-fifo"}'),
                                  400, "invalid_argument", "telemetry_file")
        self.assertIn("not a regular file", error["message"])

    def test_a_usable_telemetry_file_is_taken_and_the_check_leaves_no_file(self):
        name = "t" * 255
        status, _, body = self.send(patch(b"/v1/jobs/job-i/config", json.dumps({"telemetry_file": name}).encode()))
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["config"]["telemetry_file"], name)  # from the next decision on
        self.assertFalse(os.path.exists(os.path.join(self.prismd.dir, "data", "jobs", "job-i", name)))
        status, _, body = self.send(patch(b"/v1/jobs/job-i/config",
                                          b'{"telemetry_file": "selective_precision_telemetry.jsonl"}'))
        self.assertEqual(status, 200, body)


if __name__ == "__main__":
    unittest.main(verbosity=2)
