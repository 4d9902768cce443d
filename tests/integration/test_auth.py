#!/usr/bin/python3
"""prismd's one auth model (DESIGN 6) and the job lifecycle, end to end against the real prismd on
loopback: provisioned job tokens (directory as a Kubernetes Secret mounts it, JSON file, SIGHUP
reload), --require-provisioned-tokens, DELETE /v1/jobs/JOB, --job-idle-expiry (also across a
restart), the auth matrix of REST and gRPC with and without --require-read-token, and a second
agent for a taken rank.

gRPC through grpcio, REST through urllib and http.client. Every wait is bounded and waits for an
event (prismtest.wait_for); nothing sleeps a fixed time."""

import http.client
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
import openapi_check  # noqa: E402
from prismtest import wait_for  # noqa: E402
from test_grpc import BUILD, WAIT_S, Agent, Prismd, block_map  # noqa: E402
from prism.v1 import prism_pb2 as pb  # noqa: E402

ADMIN = "the-admin-token"
S = grpc.StatusCode


def metric(prismd, name):
    """The value of one sample of /metrics (name with its labels), or None."""
    status, text = prismd.http("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def job_ids(prismd, token=None):
    status, body = prismd.http("/v1/jobs", token=token)
    return [j["job_id"] for j in json.loads(body)["jobs"]] if status == 200 else None


def watch_status(prismd, job, token):
    """OK when a Watch of job (which has a map) delivers its first update, else its status code."""
    watch = prismd.channel.unary_stream("/prism.v1.PolicyService/Watch",
                                        request_serializer=pb.WatchRequest.SerializeToString,
                                        response_deserializer=pb.PrecisionUpdate.FromString)
    metadata = [("authorization", "Bearer " + token)] if token else None
    updates = watch(pb.WatchRequest(job_id=job, after_version=0), metadata=metadata, timeout=WAIT_S)
    try:
        next(updates)
        return S.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        updates.cancel()


def block_map_status(prismd, job, token):
    try:
        block_map(prismd, job, token)
        return S.OK
    except grpc.RpcError as e:
        return e.code()


def events_status(prismd, job, token):
    """The HTTP status of GET /v1/jobs/JOB/events (the stream is closed once its head is read)."""
    host, port = prismd.http_addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request("GET", "/v1/jobs/%s/events" % job,
                     headers={"Authorization": "Bearer " + token} if token else {})
        r = conn.getresponse()
        # A refusal is JSON and read whole; a stream is checked on its status and Content-Type.
        openapi_check.response("GET", "/v1/jobs/%s/events" % job, r, r.read() if r.status != 200 else b"")
        return r.status
    finally:
        conn.close()


class AuthTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prism-auth-test-")
        self.admin_file = os.path.join(self.dir, "admin-token")
        with open(self.admin_file, "w") as f:
            f.write(ADMIN + "\n")
        self.prismd = None
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.close()
        if self.prismd:
            code = self.prismd.stop()
            self.assertEqual(code, 0, self.prismd.logs())
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, *extra, reuse=None):
        self.prismd = Prismd(*extra, reuse=reuse)
        return self.prismd

    def agent(self, token=None):
        a = Agent(self.prismd, token)
        self.agents.append(a)
        return a

    def welcomed(self, job, token, rank=0, world=1):
        a = self.agent(token)
        a.hello(job, rank, world)
        self.assertEqual(a.next().WhichOneof("kind"), "welcome")
        return a

    def refused(self, job, token, rank=0, world=1):
        a = self.agent(token)
        a.hello(job, rank, world)
        return a.status()

    def decided(self, job, token):
        """An agent of a one-rank job whose map has version 1."""
        a = self.welcomed(job, token)
        a.step(1, (3.0, 1.0))
        a.step(2, (3.0, 1.0))
        self.assertEqual(a.next().update.map_version, 1)
        return a

    def secret_dir(self, tokens):
        """A directory laid out as a Kubernetes Secret volume: the keys are links into ..data,
        which links to a timestamped directory holding the files."""
        d = os.path.join(self.dir, "secret")
        stamp = os.path.join(d, "..2026_11_26_00_00_00.000000001")
        os.makedirs(stamp)
        for job, token in tokens.items():
            with open(os.path.join(stamp, job), "w") as f:
                f.write(token + "\n")
        os.symlink(os.path.basename(stamp), os.path.join(d, "..data"))
        for job in tokens:
            os.symlink(os.path.join("..data", job), os.path.join(d, job))
        return d

    def token_file(self, tokens, name="tokens.json"):
        path = os.path.join(self.dir, name)
        with open(path + ".tmp", "w") as f:
            json.dump(tokens, f) if isinstance(tokens, dict) else f.write(tokens)
        os.replace(path + ".tmp", path)
        return path

    # ---- item 6: provisioning ----

    def test_squatting_is_refused_under_require_provisioned_tokens(self):
        d = self.secret_dir({"job-a": "tok-a"})
        self.start("--job-tokens-dir", d, "--require-provisioned-tokens")
        # A squatter guessing the job id, with no token or a made-up one: refused.
        self.assertEqual(self.refused("job-a", None), S.UNAUTHENTICATED)
        self.assertEqual(self.refused("job-a", "squat"), S.PERMISSION_DENIED)
        # A job nobody provisioned cannot be created at all; the answers are those of a wrong or
        # missing token word for word, so they do not tell which job ids are provisioned.
        a = self.agent(None)
        a.hello("job-x", 0, 1)
        self.assertEqual(a.status(), S.UNAUTHENTICATED)
        b = self.agent("anything")
        b.hello("job-x", 0, 1)
        self.assertEqual(b.status(), S.PERMISSION_DENIED)
        c = self.agent(None)
        c.hello("job-a", 0, 1)
        d = self.agent("anything")
        d.hello("job-a", 0, 1)
        self.assertEqual((c.status(), d.status()), (S.UNAUTHENTICATED, S.PERMISSION_DENIED))
        self.assertEqual([x.done.details().replace("job-a", "job-x") for x in (c, d)],
                         [x.done.details() for x in (a, b)])
        self.assertEqual(job_ids(self.prismd), [])
        self.welcomed("job-a", "tok-a")
        wait_for("job-a listed", lambda: job_ids(self.prismd) == ["job-a"])
        self.assertEqual(metric(self.prismd, "prism_job_tokens_provisioned"), 1)

    def test_require_provisioned_tokens_needs_a_source(self):
        p = subprocess.run([os.path.join(BUILD, "service", "prismd"), "--require-provisioned-tokens"],
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual((p.returncode, p.stderr), (2, "prismd: --require-provisioned-tokens needs "
                                                       "--job-tokens-dir or --job-tokens-file\n"))

    def test_a_bad_token_file_is_an_error_naming_the_file_and_key(self):
        cases = [('{"job a": "t"}', 'key "job a": "job a" is not a job id'),
                 ('{"job-a": 5}', 'key "job-a": expected a string token'),
                 ('{"job-a": "two words"}', 'key "job-a": job job-a: the token must be 1 to 4096 printable'),
                 ('{"job-a": "t",\n "job-b": }', "line 2, column"),
                 ('["job-a"]', "expected a JSON object")]
        for text, message in cases:
            path = self.token_file(text)
            p = subprocess.run([os.path.join(BUILD, "service", "prismd"), "--job-tokens-file", path,
                                "--data-dir", os.path.join(self.dir, "data")],
                               capture_output=True, text=True, timeout=WAIT_S)
            self.assertEqual(p.returncode, 2, text)
            self.assertTrue(p.stderr.startswith("prismd: job tokens: " + path + ": "), p.stderr)
            self.assertIn(message, p.stderr, text)

    def test_a_provisioned_token_wins_over_trust_on_first_use(self):
        self.start()
        # Before provisioning, a squatter's first Hello set the job's token.
        self.welcomed("job-a", "squat").close()
        self.prismd.kill()
        path = self.token_file({"job-a": "tok-a"})
        self.start("--job-tokens-file", path, reuse=self.prismd)
        self.assertEqual(self.refused("job-a", "squat"), S.PERMISSION_DENIED)
        self.welcomed("job-a", "tok-a")
        self.assertEqual(block_map_status(self.prismd, "job-a", "squat"), S.PERMISSION_DENIED)
        self.assertEqual(self.prismd.http("/v1/jobs/job-a/config", "PATCH", "{}", "squat")[0], 403)
        self.assertEqual(self.prismd.http("/v1/jobs/job-a/config", "PATCH", "{}", "tok-a")[0], 200)

    def test_sighup_reloads_the_tokens_and_a_bad_reload_keeps_them(self):
        path = self.token_file({"job-a": "tok-a"})
        self.start("--job-tokens-file", path, "--require-provisioned-tokens", "--job-tokens-reload", "0")
        self.assertEqual(self.refused("job-b", "tok-b"), S.PERMISSION_DENIED)
        self.token_file({"job-a": "tok-a", "job-b": "tok-b"})
        self.prismd.proc.send_signal(signal.SIGHUP)
        wait_for("the reload", lambda: metric(self.prismd, 'prism_job_tokens_loads_total{outcome="ok"}') == 2)
        wait_for("two tokens in force", lambda: metric(self.prismd, "prism_job_tokens_provisioned") == 2)
        self.welcomed("job-b", "tok-b")
        # A broken file: logged, counted, and the tokens in force stay.
        self.token_file('{"job-b": ')
        self.prismd.proc.send_signal(signal.SIGHUP)
        wait_for("the failed reload",
                 lambda: metric(self.prismd, 'prism_job_tokens_loads_total{outcome="error"}') == 1)
        self.assertEqual(metric(self.prismd, "prism_job_tokens_provisioned"), 2)
        self.welcomed("job-b", "tok-b", rank=0)
        self.assertIn("cannot reload the job tokens", self.prismd.logs())

    # ---- item 6: DELETE and expiry ----

    def test_delete_needs_the_admin_token_frees_a_slot_and_survives_restart(self):
        self.start("--admin-token-file", self.admin_file, "--max-jobs", "1")
        a = self.decided("job-a", "tok-a")
        job_dir = os.path.join(self.prismd.dir, "data", "jobs", "job-a")
        wait_for("the job's telemetry file", lambda: os.listdir(job_dir) if os.path.isdir(job_dir) else None)
        self.assertEqual(self.refused("job-b", "tok-b"), S.RESOURCE_EXHAUSTED)
        host, port = self.prismd.http_addr.rsplit(":", 1)
        events = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
        events.request("GET", "/v1/jobs/job-a/events")
        stream = events.getresponse()
        openapi_check.response("GET", "/v1/jobs/job-a/events", stream, b"")
        self.assertEqual(stream.readline(), b"event: map\n")
        for token, status, code in [(None, 401, "unauthenticated"), ("tok-a", 403, "permission_denied"),
                                    ("wrong", 403, "permission_denied")]:
            got, body = self.prismd.http("/v1/jobs/job-a", "DELETE", token=token)
            self.assertEqual((got, json.loads(body)["error"]["code"]), (status, code), token)
        self.assertEqual(self.prismd.http("/v1/jobs/job-a", "DELETE", token=ADMIN),
                         (200, '{"job_id":"job-a","deleted":true}'))
        self.assertEqual(a.status(), S.NOT_FOUND)
        self.assertIn("job job-a was deleted", a.done.details())
        self.assertEqual(self.prismd.http("/v1/jobs/job-a", "DELETE", token=ADMIN)[0], 404)
        self.assertFalse(os.path.exists(job_dir))
        # The dashboard's event stream says so and ends (bounded: at most 100 lines to the end).
        lines = [stream.readline() for _ in range(100)]
        self.assertIn(b'data: {"job_id":"job-a"}\n', lines[lines.index(b"event: deleted\n"):])
        self.assertEqual(lines[-1], b"")
        events.close()
        # REST shows the snapshot published just after the change.
        wait_for("job-a gone from REST", lambda: self.prismd.http("/v1/jobs/job-a/blocks")[0] == 404)
        self.assertEqual(metric(self.prismd, 'prism_jobs_deleted_total{reason="admin"}'), 1)
        # The slot is free: a new job fits.
        self.decided("job-b", "tok-b")
        # kill -9 and restart: job-a stays deleted, job-b is back.
        for x in self.agents:
            x.close()
        self.agents = []
        self.prismd.kill()
        self.start("--admin-token-file", self.admin_file, "--max-jobs", "1", reuse=self.prismd)
        self.assertEqual(job_ids(self.prismd), ["job-b"])
        self.assertEqual(self.prismd.http("/v1/jobs/job-a/blocks")[0], 404)

    def test_prismctl_delete(self):
        self.start("--admin-token-file", self.admin_file)
        self.welcomed("job-a", "tok-a").close()
        prismctl = os.path.join(BUILD, "service", "prismctl")
        server = "http://" + self.prismd.http_addr
        env = dict(os.environ)
        env.pop("PRISM_TOKEN", None)
        p = subprocess.run([prismctl, "--server", server, "--token", "tok-a", "delete", "job-a"], env=env,
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual((p.returncode, p.stderr), (2, "prismctl: the server answered 403: job job-a: wrong token "
                                                       "(deleting a job needs the admin token)\n"))
        p = subprocess.run([prismctl, "--server", server, "--token", ADMIN, "delete", "job-a"], env=env,
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual((p.returncode, json.loads(p.stdout)), (0, {"job_id": "job-a", "deleted": True}))

    def test_idle_jobs_expire_and_connected_ones_do_not(self):
        self.start("--job-idle-expiry", "300ms")
        busy = self.welcomed("job-busy", "tok-b")
        idle = self.welcomed("job-idle", "tok-i")
        idle.step(1, (1.0, 1.0))
        wait_for("both jobs listed", lambda: job_ids(self.prismd) == ["job-busy", "job-idle"])
        idle.close()
        wait_for("job-idle to expire", lambda: job_ids(self.prismd) == ["job-busy"])
        self.assertEqual(metric(self.prismd, 'prism_jobs_deleted_total{reason="idle"}'), 1)
        self.assertIn('msg="job expired" job=job-idle', self.prismd.logs())
        # job-busy's agent has been connected all along, longer than the expiry: it stays.
        busy.step(1, (1.0, 1.0))
        self.assertEqual(job_ids(self.prismd), ["job-busy"])

    def test_idle_time_counts_across_a_restart(self):
        self.start("--job-idle-expiry", "0")
        self.welcomed("job-old", "tok-o").close()
        db = os.path.join(self.prismd.dir, "data", "prism.db")

        def saved_activity():
            with sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=WAIT_S) as c:
                rows = c.execute("SELECT last_active_ms FROM job_activity WHERE job_id='job-old'").fetchall()
            return rows[0][0] if rows else None
        wait_for("the activity saved at disconnect", saved_activity)
        self.prismd.kill()
        # The job was last active an hour ago; prismd restarts with a 30 min expiry.
        with sqlite3.connect(db, timeout=WAIT_S) as c:
            c.execute("UPDATE job_activity SET last_active_ms = ? WHERE job_id='job-old'",
                      (int(time.time() * 1000) - 3600 * 1000,))
        self.start("--job-idle-expiry", "30m", reuse=self.prismd)
        wait_for("job-old to expire after the restart", lambda: job_ids(self.prismd) == [])
        self.assertEqual(metric(self.prismd, 'prism_jobs_deleted_total{reason="idle"}'), 1)

    def test_a_job_with_no_saved_activity_gets_it_saved_at_restart(self):
        # A store from before job_activity (schema 1) has no row: the restart's time is saved
        # once, so the idle time of a prismd restarted more often than the expiry still counts.
        self.start("--job-idle-expiry", "0")
        self.welcomed("job-old", "tok-o").close()
        db = os.path.join(self.prismd.dir, "data", "prism.db")

        def saved_activity():
            with sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=WAIT_S) as c:
                rows = c.execute("SELECT last_active_ms FROM job_activity WHERE job_id='job-old'").fetchall()
            return rows[0][0] if rows else None
        wait_for("the activity saved at disconnect", saved_activity)
        self.prismd.kill()
        with sqlite3.connect(db, timeout=WAIT_S) as c:
            c.execute("DELETE FROM job_activity")
        before = int(time.time() * 1000)
        self.start("--job-idle-expiry", "30m", reuse=self.prismd)
        wait_for("the restart's time saved for job-old", saved_activity)
        self.assertGreaterEqual(saved_activity(), before)
        self.assertEqual(job_ids(self.prismd), ["job-old"])

    # ---- item 11: one auth model ----

    def matrix(self, require_read):
        """(token, operation) -> expected status, for job-a (token tok-a); job-b's token is
        "another job's". REST as HTTP codes, gRPC as status codes."""
        read_none = (401, S.UNAUTHENTICATED) if require_read else (200, S.OK)
        rows = {
            # token:    REST read,     events,        REST change, GetBlockMap,  Watch,         DELETE
            None:     (read_none[0], read_none[0], 401, read_none[1], read_none[1], 401),
            "tok-a":  (200, 200, 200, S.OK, S.OK, 403),
            "tok-b":  (403, 403, 403, S.PERMISSION_DENIED, S.PERMISSION_DENIED, 403),
            ADMIN:    (200, 200, 200, S.OK, S.OK, 200),
        }
        return rows

    def run_matrix(self, require_read):
        extra = ("--admin-token-file", self.admin_file) + (("--require-read-token",) if require_read else ())
        self.start(*extra)
        self.decided("job-a", "tok-a")
        self.decided("job-b", "tok-b")
        ops = [("REST read", lambda t: self.prismd.http("/v1/jobs/job-a/blocks", token=t)[0]),
               ("events", lambda t: events_status(self.prismd, "job-a", t)),
               ("REST change", lambda t: self.prismd.http("/v1/jobs/job-a/config", "PATCH", "{}", t)[0]),
               ("GetBlockMap", lambda t: block_map_status(self.prismd, "job-a", t)),
               ("Watch", lambda t: watch_status(self.prismd, "job-a", t)),
               ("DELETE", lambda t: self.prismd.http("/v1/jobs/job-a", "DELETE", token=t)[0])]
        # The admin row last: its DELETE removes the job.
        for token, expected in self.matrix(require_read).items():
            got = tuple(op(token) for _, op in ops)
            self.assertEqual(got, expected, "token %r (%s)" % (token, ", ".join(n for n, _ in ops)))
        # Open whatever the flag: health, readiness, metrics, the defaults.
        for path in ("/healthz", "/readyz", "/metrics", "/v1/config/defaults"):
            self.assertEqual(self.prismd.http(path)[0], 200, path)

    def test_auth_matrix_with_open_reads(self):
        self.run_matrix(require_read=False)
        wait_for("job-a deleted", lambda: job_ids(self.prismd) == ["job-b"])
        # The job list: open, also for a job's token; a token that opens nothing is refused.
        self.decided("job-c", "tok-c")
        wait_for("job-c listed", lambda: job_ids(self.prismd) == ["job-b", "job-c"])
        self.assertEqual(job_ids(self.prismd, "tok-c"), ["job-b", "job-c"])
        self.assertEqual(job_ids(self.prismd, ADMIN), ["job-b", "job-c"])
        self.assertEqual(self.prismd.http("/v1/jobs", token="nobody's")[0], 403)

    def test_auth_matrix_with_require_read_token(self):
        self.run_matrix(require_read=True)
        # The job list: the admin sees every job, a job's token its own, no token nothing.
        self.assertEqual(self.prismd.http("/v1/jobs")[0], 401)
        self.assertEqual(self.prismd.http("/v1/jobs", token="nobody's")[0], 403)
        wait_for("job-a deleted", lambda: job_ids(self.prismd, ADMIN) == ["job-b"])
        self.decided("job-c", "tok-c")
        wait_for("job-c listed", lambda: job_ids(self.prismd, ADMIN) == ["job-b", "job-c"])
        self.assertEqual(job_ids(self.prismd, "tok-c"), ["job-c"])
        self.assertEqual(job_ids(self.prismd, "tok-b"), ["job-b"])

    def test_a_second_agent_for_a_taken_rank_replaces_the_first(self):
        self.start()
        old = self.welcomed("job-r", "tok-r", rank=0, world=2)
        other = self.welcomed("job-r", "tok-r", rank=1, world=2)
        new = self.welcomed("job-r", "tok-r", rank=0, world=2)
        self.assertEqual(old.status(), S.ABORTED)
        self.assertEqual(old.done.details(), "replaced by a newer agent for rank 0")
        wait_for("the replacement counted", lambda: metric(self.prismd, "prism_agent_streams_replaced_total") == 1)
        self.prismd.json_until("/v1/jobs", lambda d: d["jobs"][0]["agents_connected"] == 2)
        # The job goes on with the newer agent: both ranks' reports complete step 1 and 2.
        for step in (1, 2):
            new.step(step, (3.0, 1.0))
            other.step(step, (3.0, 1.0))
        self.assertEqual(new.next().update.map_version, 1)
        self.assertEqual(other.next().update.map_version, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
