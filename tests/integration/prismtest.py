"""What the Python integration tests share: free loopback ports, bounded waits, GET on loopback."""

import socket
import time
import urllib.error
import urllib.request


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


def http_get(addr, path):
    """(status, body) of GET http://addr/path; (None, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""
