#!/usr/bin/env bash
# REST block-map throughput and latency (DESIGN 13: GET /v1/jobs/{job}/blocks for 1,000 blocks,
# >= 20,000 req/s, p99 < 5 ms, wrk on loopback).
#
# Starts the real prismd from BUILD (default build-release), makes one job of BLOCKS blocks
# through a decision over gRPC (Python grpcio, as the tests do), then runs wrk against the block
# map (plain, then gzip-compressed as clients that send Accept-Encoding: gzip get it) and, for
# comparison, /healthz (the cheapest answer prismd has: the HTTP stack's own cost).
#
# Napkin math: the block map of 1,000 blocks is ~190 KB of JSON, rendered once per snapshot and
# then copied per request; at 20,000 req/s that is ~3.8 GB/s through loopback on 2 cores shared
# by prismd and wrk, so copying and the kernel's socket path, not JSON, set the ceiling. Both the
# JSON and its gzip are made once per snapshot (each decision), not per request.
#
# usage: bench/bench_rest.sh [BUILD_DIR] [BLOCKS] [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-release}
blocks=${2:-1000}
seconds=${3:-10}
command -v wrk >/dev/null || { echo "bench_rest: wrk is missing (apt-get install wrk)" >&2; exit 1; }
[[ -x $build/service/prismd ]] || { echo "bench_rest: no $build/service/prismd; build it first" >&2; exit 1; }
[[ -f $build/python-gen/prism/v1/prism_pb2.py ]] || cmake --build "$build" --target python_proto >/dev/null

port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d /tmp/prism-bench-rest-XXXXXX)
grpc=127.0.0.1:$(port)
http=127.0.0.1:$(port)
echo '{"warmup_steps": 2, "update_interval_steps": 2}' >"$dir/config.json"
"$build/service/prismd" --grpc-listen "$grpc" --http-listen "$http" --data-dir "$dir/data" \
  --config "$dir/config.json" --log-level warn 2>"$dir/prismd.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT

PYTHONPATH="$build/python-gen" /usr/bin/python3 - "$grpc" "$blocks" <<'PY'
import queue, random, sys, grpc
from prism.v1 import prism_pb2 as pb
target, n = sys.argv[1], int(sys.argv[2])
ch = grpc.insecure_channel(target)
grpc.channel_ready_future(ch).result(timeout=10)
connect = ch.stream_stream("/prism.v1.PolicyService/Connect", request_serializer=pb.AgentMessage.SerializeToString,
                           response_deserializer=pb.ServiceMessage.FromString)
q = queue.Queue()
def requests():
    for _ in range(10):
        m = q.get()
        if m is None:
            return
        yield m
replies = connect(requests(), timeout=30)
q.put(pb.AgentMessage(hello=pb.Hello(job_id="bench", rank=0, world_size=1)))
next(replies)
rng = random.Random(7)  # varied norms, so scores have all their digits, as real ones do
for step in (1, 2):
    q.put(pb.AgentMessage(step_report=pb.StepReport(step=step, blocks=[
        pb.BlockGradStats(block_id=i, l2_norm=rng.uniform(0.2, 2.5), max_abs=1, numel=1 << 20) for i in range(n)])))
update = next(replies).update
print("bench_rest: job 'bench' with %d blocks, map_version %d" % (len(update.blocks), update.map_version))
q.put(None)
PY

url=http://$http/v1/jobs/bench/blocks
bytes=$(curl -sf "$url" | wc -c)
echo "bench_rest: GET /v1/jobs/bench/blocks answers $bytes bytes"
gz_bytes=$(curl -sf -H 'Accept-Encoding: gzip' "$url" | wc -c)
echo "bench_rest: the same with Accept-Encoding: gzip: $gz_bytes bytes"
run() {
  echo "== wrk -t2 -c16 -d${seconds}s --latency $*"
  wrk -t2 -c16 -d"${seconds}s" --latency "$@" | grep -E 'Requests/sec|Transfer/sec|  50%|  90%|  99%|Non-2xx|Socket errors'
}
run "$url"
run -H 'Accept-Encoding: gzip' "$url"
run "http://$http/healthz"
