#!/usr/bin/python3
"""Starts a real prismd holding the numerics job of tests/integration/test_numerics_surfaces.py
(low_precision auto with blocks in int4, fp8_e4m3 and int8 over the run, pow2 scales, saturation
figures, a block rolled back by saturation and one by a loss spike), driven to its step 5 by a
grpcio rank; prints ONE JSON line {"http": ADDR, "job": ID} on stdout, then waits for stdin to
reach its end (the parent went away) or SIGTERM, stops prismd and exits 0. Bounded waits only."""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import test_grpc as g  # noqa: E402
import test_numerics_surfaces as ns  # noqa: E402


def main():
    prismd = g.Prismd(config_extra=ns.CONFIG)
    agent = None
    try:
        agent = ns.drive_job(prismd)
        prismd.json_until("/v1/jobs/job-n/blocks", lambda d: d["map_version"] == 3)
        signal.signal(signal.SIGTERM, lambda *_: sys.stdin.close())
        print(json.dumps({"http": prismd.http_addr, "job": "job-n"}), flush=True)
        try:
            sys.stdin.read()
        except (ValueError, OSError):
            pass
    finally:
        if agent:
            agent.close()
        prismd.stop()


if __name__ == "__main__":
    main()
