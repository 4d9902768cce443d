"""Every HTTP answer of prismd that the integration tests receive, checked against prismd's OpenAPI
document (service/prismd/openapi.json) by openapi_check.mjs (Node, ajv): one Node process per test
process, started at the first check and fed one JSON line per answer.

check(...) raises AssertionError with the validator's message when an answer does not conform.
The helpers below (urlopen, response, raw) route the tests' own HTTP calls through it. Without
node or web/node_modules the first check fails with one line saying to run
scripts/install-deps.sh."""

import atexit
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "openapi_check.mjs")
DOCUMENT = os.path.join(SOURCE, "service", "prismd", "openapi.json")
INSTALL = "run scripts/install-deps.sh (it installs Node.js and runs npm ci in web/)"

_lock = threading.Lock()
_proc = None


def _start():
    node = shutil.which("node")
    if not node:
        raise AssertionError("openapi_check: node is not installed: " + INSTALL)
    if not os.path.isdir(os.path.join(SOURCE, "web", "node_modules")):
        raise AssertionError("openapi_check: %s/web/node_modules is missing: %s" % (SOURCE, INSTALL))
    # stderr to a file, not a pipe: whatever Node writes there can never block it.
    err = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
    proc = subprocess.Popen([node, SCRIPT, DOCUMENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, encoding="utf-8")
    proc.err = err
    atexit.register(_stop, proc)
    return proc


def _stop(proc):
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ask(line):
    """The validator's answer to one request line; starts it on first use."""
    global _proc
    with _lock:
        if _proc is None or _proc.poll() is not None:
            _proc = _start()
        try:
            _proc.stdin.write(line + "\n")
            _proc.stdin.flush()
            out = _proc.stdout.readline()
        except (BrokenPipeError, OSError):
            out = ""
        if not out:
            _proc.wait(timeout=10)
            _proc.err.seek(0)
            err = _proc.err.read().strip()
            _proc = None
            raise AssertionError(err or "openapi_check: the validator exited without an answer")
        return json.loads(out)


def _no_duplicate_keys(pairs):
    """json.loads's object hook: an object that names a key twice is refused (RFC 8259 4: its
    meaning depends on the parser)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen, dup = set(), set()
        for k, _ in pairs:
            (dup if k in seen else seen).add(k)
        raise ValueError("duplicate keys %s" % sorted(dup))
    return obj


def check(method, path, status, content_type, body, headers=None, listener="http"):
    """Raises AssertionError unless prismd's answer conforms to the document. body: str or bytes
    (already gunzipped); headers: {name: value} (any case); listener "health" for --health-listen."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    ct = (content_type or "").split(";")[0].strip().lower()
    if ct == "application/json" and method.upper() != "HEAD" and body:
        try:
            json.loads(body, object_pairs_hook=_no_duplicate_keys)
        except ValueError as e:
            raise AssertionError("openapi_check: %s %s -> %s: the body is not interoperable JSON (%s): %.300s"
                                 % (method, path, status, e, body)) from None
    # Only JSON bodies are validated: others (metrics, pages) are not shipped to the validator,
    # which keeps a poll of a 8 MB /metrics cheap; their emptiness is all it needs to know.
    is_json = ct == "application/json" or (ct.startswith("application/") and ct.endswith("+json"))
    line = json.dumps({"method": method, "path": path, "status": int(status), "content_type": content_type,
                       "body": body if is_json or not body else "", "body_omitted": bool(body) and not is_json,
                       "listener": listener,
                       "headers": {k.lower(): v for k, v in (headers or {}).items()}})
    answer = _ask(line)
    if not answer.get("ok"):
        raise AssertionError("openapi_check: " + answer.get("error", "?"))


def check_event(path, event, data):
    """Raises AssertionError unless one server-sent event of GET path (.../events) conforms:
    event its name, data its data line's text."""
    answer = _ask(json.dumps({"kind": "event", "method": "GET", "path": path, "event": event, "data": data}))
    if not answer.get("ok"):
        raise AssertionError("openapi_check: " + answer.get("error", "?"))


def sse_event(path, lines):
    """Checks one server-sent event given as its lines without their newlines ("event: map",
    "id: 3", "data: {...}"); an event without a name is a "message" (the SSE default)."""
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value[1:] if value.startswith(" ") else value)
    check_event(path, (fields.get("event") or ["message"])[0], "\n".join(fields.get("data", [])))


def _dechunked(body):
    """The body of a chunked transfer (RFC 9112 7.1), trailers dropped."""
    out, rest = b"", body
    for _ in range(1000000):
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


def _decoded(raw_body, headers):
    if (headers.get("Content-Encoding") or headers.get("content-encoding")) == "gzip" and raw_body:
        return gzip.decompress(raw_body)
    return raw_body


def response(method, path, resp, body, listener="http"):
    """Checks an http.client / urllib answer whose body (bytes, as sent) the caller read; returns
    body. For an event stream pass body=b"": its status and Content-Type are checked."""
    headers = dict(resp.getheaders()) if hasattr(resp, "getheaders") else dict(resp.headers.items())
    status = resp.status if getattr(resp, "status", None) is not None else resp.code
    check(method, path, status, headers.get("Content-Type") or headers.get("content-type"),
          _decoded(body, headers), headers, listener)
    return body


class Answer:
    """What urlopen returns: status, headers and the body as sent (bytes)."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def read(self):
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def urlopen(req, timeout=None, context=None, check_answer=True):
    """urllib.request.urlopen (with a Request or a URL) whose answer is read whole and checked
    (unless check_answer is False); an HTTP error status is an Answer too, not an exception."""
    if isinstance(req, str):
        req = urllib.request.Request(req)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            answer = Answer(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        answer = Answer(e.code, e.headers, e.read())
    if not check_answer:
        return answer
    path = req.selector
    headers = dict(answer.headers.items())
    check(req.get_method(), path, answer.status, headers.get("Content-Type"), _decoded(answer.body, headers), headers)
    return answer


def raw(request_bytes, status, headers, body, listener="http"):
    """Checks the answer to a request sent as raw bytes (its request line names method and
    target); headers with lower-case names, body bytes as sent."""
    line = request_bytes.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    method, target = line[0], line[1] if len(line) > 1 else "/"
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunked(body)
    check(method, target, status, headers.get("content-type"), _decoded(body, headers), headers, listener)


def main(argv):
    """python3 openapi_check.py ANSWERS.jsonl: checks every answer a test recorded (one line of
    check's arguments each, test_prismd.c's record_answer); exit status 1 naming each that fails."""
    if len(argv) != 2:
        print("usage: openapi_check.py ANSWERS.jsonl", file=sys.stderr)
        return 2
    failed = total = 0
    with open(argv[1], encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            a = json.loads(line)
            total += 1
            try:
                check(a["method"], a["path"], a["status"], a.get("content_type"), a.get("body", ""),
                      a.get("headers"), a.get("listener", "http"))
            except AssertionError as e:
                failed += 1
                print(e, file=sys.stderr)
    print("%d answers checked against %s, %d do not conform" % (total, DOCUMENT, failed))
    return 1 if failed or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
