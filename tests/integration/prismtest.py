"""What the Python integration tests share: free loopback ports, bounded waits, GET on loopback."""

import socket
import time
import urllib.error
import urllib.request

import openapi_check


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, timeout_s=20, every_s=0.05):
    """Polls predicate until it returns something true, and returns that; bounded in time and in
    count. AssertionError naming `what` when it never does."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / every_s) + 1):
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def http_get(addr, path, openapi=True):
    """(status, body) of GET http://addr/path; (None, "") when nothing answers. The answer is
    checked against prismd's OpenAPI document (openapi_check.py) unless openapi is False (an
    answer of something else than prismd: prism-agent's /metrics)."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
            status, headers, body = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, body = e.code, e.headers, e.read()
    except OSError:
        return None, ""
    if openapi:
        openapi_check.response("GET", path, _Head(status, headers), body)
    return status, body.decode()


class _Head:
    """An answer's status and headers, as openapi_check.response reads them."""

    def __init__(self, status, headers):
        self.status = status
        self.headers = headers
