#!/usr/bin/python3
"""prismd's OpenAPI contract (issue 13, item 1) and the files it serves (item 2): the document
prismd serves is the file, byte for byte; every route prismd's code serves is in the document
and every route of the document is served; the document is well-formed OpenAPI 3.1; the
validator of the tests (openapi_check) refuses wrong answers and accepts right ones; / serves
the dashboard (or the page saying it was not built) with its Content-Type and gzip; the contract
and the page need no token, also under --require-read-token.

Runs the real prismd (test_grpc.py's Prismd) on free loopback ports; every wait is bounded."""

import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import openapi_check  # noqa: E402
from test_grpc import BUILD, WAIT_S, Agent, Prismd  # noqa: E402
from prismtest import wait_for  # noqa: E402

SOURCE = openapi_check.SOURCE
DOCUMENT = openapi_check.DOCUMENT
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def code_routes():
    """{(path template, method)} that prismd's code serves, read from http.c's route table and
    rest.c's prismd_rest_allowed (HEAD is answered as GET: only GET is listed)."""
    routes = set()
    http_c = read(os.path.join(SOURCE, "service", "prismd", "http.c"))
    table = re.search(r"prismd_routes\[\] = \{(.*?)\n\};", http_c, re.S).group(1)
    for path in re.findall(r'\{"(/[^"]*)", route_', table):
        routes.add((path, "get"))
    rest_c = read(os.path.join(SOURCE, "service", "prismd", "rest.c"))
    body = re.search(r"const char \*prismd_rest_allowed\(const char \*path\)\n\{(.*?)\n\}", rest_c, re.S).group(1)
    for cond, methods in re.findall(r'if \((.*?)\)\s*return "([A-Z, ]+)";', body, re.S):
        paths = re.findall(r'strcmp\(path, "([^"]+)"\)', cond)
        paths += ["/v1/jobs/{job}" + p for p in re.findall(r'strcmp\(rest, "([^"]+)"\)', cond)]
        paths += ["/v1/jobs/{job}%s{id}" % p for p in re.findall(r'strncmp\(rest, "([^"]+/)"', cond)]
        if "rest[0] == '\\0'" in cond:
            paths.append("/v1/jobs/{job}")
        assert paths, "a condition of prismd_rest_allowed this test cannot read: " + cond
        for p in paths:
            for m in methods.split(", "):
                if m != "HEAD":
                    routes.add((p, m.lower()))
    return routes


def get(addr, path, headers=None, method="GET"):
    """(status, headers, body bytes as sent) of one request, checked against the document."""
    req = urllib.request.Request("http://%s%s" % (addr, path), headers=headers or {}, method=method)
    answer = openapi_check.urlopen(req, timeout=WAIT_S)
    return answer.status, answer.headers, answer.body


class DocumentTest(unittest.TestCase):
    """The document on its own: no prismd needed."""

    def test_every_route_of_the_code_is_in_the_document_and_back(self):
        doc = json.loads(read(DOCUMENT))
        documented = {(p, m) for p, item in doc["paths"].items() for m in METHODS if m in item}
        served = code_routes()
        # Served by http.c outside its route table: the event streams' opening, the embedded files.
        served |= {("/v1/jobs/{job}/events", "get"), ("/v1/openapi.json", "get"), ("/", "get"), ("/{asset}", "get")}
        self.assertIn(("/v1/jobs/{job}/telemetry", "get"), served)  # the parse found rest.c's routes
        self.assertIn(("/v1/config/defaults", "get"), served)  # and http.c's
        self.assertEqual(sorted(served - documented), [], "routes prismd serves that the document lacks")
        missing = documented - served
        # GET /v1/jobs/{job}/ranks is written into the contract first (plan13); rest.c serves it
        # once the ranks change lands, and from then on this holds it like every other route.
        if "/ranks" not in read(os.path.join(SOURCE, "service", "prismd", "rest.c")):
            missing.discard(("/v1/jobs/{job}/ranks", "get"))
        self.assertEqual(sorted(missing), [], "routes of the document prismd does not serve")

    def test_the_jobs_rank_counts_are_required(self):
        """plan13: each job of GET /v1/jobs has ranks_lagging and ranks_not_acked."""
        job = json.loads(read(DOCUMENT))["components"]["schemas"]["Job"]
        counts = ["ranks_lagging", "ranks_not_acked"]
        self.assertEqual([k for k in counts if k not in job["required"]], [])

    def test_the_document_is_well_formed(self):
        doc = json.loads(read(DOCUMENT))
        self.assertEqual(doc["openapi"], "3.1.0")
        # Every $ref resolves, every schema compiles (ajv, strict), every path parameter is
        # declared, every operation has described responses.
        self.assertEqual(subprocess.run(["node", openapi_check.SCRIPT, "--self-check", DOCUMENT], capture_output=True,
                                        text=True, timeout=60).stderr, "")
        # The dashboard's types come from it.
        tool = os.path.join(SOURCE, "web", "node_modules", ".bin", "openapi-typescript")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "api.d.ts")
            run = subprocess.run([tool, DOCUMENT, "-o", out], capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            types = read(out)
        for name in ("JobList", "BlockMap", "Ranks", "Telemetry", "MapEvent", "DecisionEvent", "DeletedEvent", "Error"):
            self.assertIn("        %s: {" % name, types)
        for path, item in doc["paths"].items():
            for m in METHODS:
                if m in item:
                    self.assertTrue(item[m]["responses"], "%s %s" % (m, path))
                    self.assertTrue(item[m].get("operationId"), "%s %s" % (m, path))

    def test_the_validator_refuses_wrong_answers(self):
        job = {"job_id": "j", "step": 4, "map_version": 1, "decided_step": 2, "effective_step": 3,
               "agents_connected": 1, "world_size": 1, "blocks": 2, "loss_spikes": 0, "loss_spike_decisions": 0,
               "blocks_rolled_back": 0, "ranks_lagging": 0, "ranks_not_acked": 0,
               "precisions": {"bf16": 1, "fp8_e4m3": 0, "fp8_e5m2": 0, "int8": 1, "int4": 0},
               "bandwidth_saving_pct": 25.0, "last_decision_step": 4, "last_decision_unix": 1764150000.125,
               "blocks_by_precision": {"bf16": 1, "int8": 1, "fp8_e4m3": 0, "fp8_e5m2": 0, "int4": 0}}
        ok = json.dumps({"jobs": [job]})
        openapi_check.check("GET", "/v1/jobs", 200, "application/json", ok)
        openapi_check.check("GET", "/v1/jobs", 200, "application/json", json.dumps({"jobs": [dict(job, step=None)]}))
        openapi_check.check("GET", "/v1/jobs", 200, "application/json", json.dumps({"jobs": [dict(
            job, bandwidth_saving_pct=None, last_decision_step=None, last_decision_unix=None,
            blocks_by_precision=None)]}))
        openapi_check.check("HEAD", "/v1/jobs", 200, "application/json", "")
        error = json.dumps({"error": {"code": "not_found", "message": "job x does not exist"}})
        openapi_check.check("GET", "/v1/jobs/x/blocks", 404, "application/json", error)
        openapi_check.check("GET", "/nope/at/all", 404, "application/json", error)
        openapi_check.check("POST", "/v1/jobs", 405, "application/json",
                            json.dumps({"error": {"code": "method_not_allowed", "message": "m"}}), {"Allow": "GET, HEAD"})
        wrong = [
            ("a missing required field", ("GET", "/v1/jobs", 200, "application/json",
                                          json.dumps({"jobs": [{k: v for k, v in job.items() if k != "world_size"}]})),
             "required property 'world_size'"),
            ("a wrong type", ("GET", "/v1/jobs", 200, "application/json", json.dumps({"jobs": [dict(job, step="4")]})),
             "/jobs/0/step must be integer,null"),
            ("a number for an integer", ("GET", "/v1/jobs", 200, "application/json",
                                         json.dumps({"jobs": [dict(job, blocks=2.5)]})), "/jobs/0/blocks must be integer"),
            ("a precision missing", ("GET", "/v1/jobs", 200, "application/json",
                                     json.dumps({"jobs": [dict(job, precisions={"bf16": 2})]})),
             "required property 'fp8_e4m3'"),
            ("a field the document does not know", ("GET", "/v1/jobs", 200, "application/json",
                                                    json.dumps({"jobs": [dict(job, colour="red")]})),
             "must NOT have additional properties"),
            ("an undocumented status", ("GET", "/v1/jobs", 418, "application/json", error), "status 418 is not documented"),
            ("an undocumented method", ("POST", "/v1/jobs", 200, "application/json", ok), "status 200 is not documented"),
            ("a wrong Content-Type", ("GET", "/v1/jobs", 200, "text/plain", ok), "Content-Type \"text/plain\""),
            ("a body that is not JSON", ("GET", "/v1/jobs", 200, "application/json", "{jobs"), "not interoperable JSON"),
            ("duplicate keys", ("GET", "/v1/jobs", 200, "application/json", '{"jobs":[],"jobs":[]}'), "duplicate keys"),
            ("an error body of another shape", ("GET", "/v1/jobs/x/blocks", 404, "application/json",
                                                json.dumps({"error": "not found"})), "/error must be object"),
            ("an unknown error code", ("GET", "/v1/jobs/x/blocks", 404, "application/json",
                                       json.dumps({"error": {"code": "nope", "message": "m"}})), "must be equal to one"),
            ("a 405 without Allow", ("POST", "/v1/jobs", 405, "application/json",
                                     json.dumps({"error": {"code": "method_not_allowed", "message": "m"}})),
             "header Allow is missing"),
        ]
        for what, args, message in wrong:
            with self.subTest(what):
                with self.assertRaises(AssertionError) as caught:
                    openapi_check.check(*args)
                self.assertIn(message, str(caught.exception))
        openapi_check.check_event("/v1/jobs/j/events", "deleted", '{"job_id":"j"}')
        with self.assertRaises(AssertionError) as caught:
            openapi_check.check_event("/v1/jobs/j/events", "map", '{"job_id":"j"}')
        self.assertIn("required property 'map_version'", str(caught.exception))
        openapi_check.check_event("/v1/jobs/j/events", "decision", '{"job_id":"j","step":6,"map_version":1}')
        with self.assertRaises(AssertionError) as caught:
            openapi_check.check_event("/v1/jobs/j/events", "decision", '{"job_id":"j","step":6}')
        self.assertIn("required property 'map_version'", str(caught.exception))


class ServedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="prism-openapi-test-")
        cls.admin = os.path.join(cls.dir, "admin-token")
        with open(cls.admin, "w") as f:
            f.write("admin-secret\n")
        cls.prismd = Prismd("--require-read-token", "--admin-token-file", cls.admin)

    @classmethod
    def tearDownClass(cls):
        code = cls.prismd.stop()
        assert code == 0, cls.prismd.logs()

    def test_the_served_document_is_the_file_and_needs_no_token(self):
        with open(DOCUMENT, "rb") as f:
            expected = f.read()
        status, headers, body = get(self.prismd.http_addr, "/v1/openapi.json")
        self.assertEqual((status, headers["Content-Type"]), (200, "application/json"))
        self.assertEqual(body, expected)
        status, headers, body = get(self.prismd.http_addr, "/v1/openapi.json", {"Accept-Encoding": "gzip"})
        self.assertEqual((status, headers["Content-Encoding"]), (200, "gzip"))
        self.assertEqual(gzip.decompress(body), expected)
        # Job data still needs a token here.
        self.assertEqual(get(self.prismd.http_addr, "/v1/jobs")[0], 401)

    def test_root_serves_the_dashboard_or_the_page_that_says_it_was_not_built(self):
        status, headers, page = get(self.prismd.http_addr, "/")
        self.assertEqual((status, headers["Content-Type"], headers["Cache-Control"]),
                         (200, "text/html; charset=utf-8", "no-cache"))
        # The page loads only prismd's own files and is never framed; no answer is sniffed.
        self.assertEqual((headers["X-Content-Type-Options"], headers["Content-Security-Policy"]),
                         ("nosniff", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                          "img-src 'self' data:; connect-src 'self'; base-uri 'self'; form-action 'none'; "
                          "frame-ancestors 'none'"))
        status, headers, _ = get(self.prismd.http_addr, "/v1/openapi.json")
        self.assertEqual((status, headers["X-Content-Type-Options"], headers["Content-Security-Policy"]),
                         (200, "nosniff", "frame-ancestors 'none'"))
        dist_index = os.path.join(BUILD, "web", "dist", "index.html")
        if os.path.exists(dist_index):
            with open(dist_index, "rb") as f:
                self.assertEqual(page, f.read())
        else:
            with open(os.path.join(SOURCE, "service", "prismd", "fallback.html"), "rb") as f:
                self.assertEqual(page, f.read())
            self.assertIn(b"the dashboard was not built", page)
            self.assertIn(b"scripts/install-deps.sh", page)
        status, headers, body = get(self.prismd.http_addr, "/", {"Accept-Encoding": "gzip"})
        self.assertEqual((status, headers["Content-Encoding"], headers["Vary"]), (200, "gzip", "Accept-Encoding"))
        self.assertEqual(gzip.decompress(body), page)
        self.assertEqual(get(self.prismd.http_addr, "/index.html")[2], page)
        self.assertEqual(get(self.prismd.http_addr, "/", {"Accept-Encoding": "gzip;q=0"})[2], page)
        status, headers, body = get(self.prismd.http_addr, "/", method="HEAD")
        self.assertEqual((status, body), (200, b""))

    def test_the_dashboard_files_are_served_by_name(self):
        dist = os.path.join(BUILD, "web", "dist")
        if not os.path.isdir(dist):
            self.skipTest("the dashboard was not built (no Node.js or web/node_modules)")
        types = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".html": "text/html; charset=utf-8"}
        for name in sorted(os.listdir(dist)):
            ext = os.path.splitext(name)[1]
            if ext in types:
                with self.subTest(name):
                    status, headers, body = get(self.prismd.http_addr, "/" + name)
                    self.assertEqual((status, headers["Content-Type"]), (200, types[ext]))
                    with open(os.path.join(dist, name), "rb") as f:
                        self.assertEqual(body, f.read())

    def test_other_paths_and_methods_keep_their_json_errors(self):
        status, headers, body = get(self.prismd.http_addr, "/nope.js")
        self.assertEqual((status, json.loads(body)["error"]["code"]), (404, "not_found"))
        for path in ("/", "/v1/openapi.json"):
            status, headers, body = get(self.prismd.http_addr, path, method="DELETE")
            self.assertEqual((status, headers["Allow"], json.loads(body)["error"]["code"]),
                             (405, "GET, HEAD", "method_not_allowed"))

    def test_real_answers_conform(self):
        """A job with a decision, read through every GET route with the admin token: each answer
        is checked by Prismd.http."""
        a = Agent(self.prismd, token="tok-o")
        try:
            a.hello("job-o", 0, 1)
            a.next()
            for step in range(1, 5):
                a.step(step, (3.0, 1.0))
            # A decision: the blocks have scores and the telemetry a record.
            doc = wait_for("the job's first decision", lambda: (lambda r: json.loads(r[1]) if r[0] == 200 and
                           json.loads(r[1])["map_version"] >= 1 else None)(
                               self.prismd.http("/v1/jobs/job-o/blocks", token="admin-secret")))
            self.assertEqual(doc["map_version"], 1, doc)
            for path in ("/v1/jobs", "/v1/jobs/job-o/blocks", "/v1/jobs/job-o/blocks/0", "/v1/jobs/job-o/blocks/9",
                         "/v1/jobs/job-o/blocks/x", "/v1/jobs/job-o/config", "/v1/jobs/job-o/telemetry?limit=2",
                         "/v1/jobs/job-o/telemetry?limit=0", "/v1/jobs/job-o/hints", "/v1/jobs/nope/config",
                         "/v1/config/defaults", "/metrics", "/healthz", "/readyz"):
                with self.subTest(path):
                    status, _ = self.prismd.http(path, token="admin-secret")
                    self.assertIn(status, (200, 400, 404))
            self.assertEqual(self.prismd.http("/v1/jobs/job-o/blocks")[0], 401)
            self.assertEqual(self.prismd.http("/v1/jobs/job-o/blocks", token="wrong")[0], 403)
            self.assertEqual(self.prismd.http("/v1/jobs/job-o/overrides", "PUT", '{"force_bf16_blocks":[0]}',
                                              token="tok-o")[0], 200)
            self.assertEqual(self.prismd.http("/v1/jobs/job-o/config", "PATCH", '{"nope":1}', token="tok-o")[0], 400)
        finally:
            a.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
