# Prism's one image: prismd (with its embedded dashboard), prismctl and prism-agent in
# /usr/local/bin, run as the unprivileged user prism (uid and gid 10001). The Helm chart
# (helm/prism) and the kustomize base (deploy/k8s) run every container from it, giving command and
# args explicitly; the default command below runs prismd as they do.
#   docker build -t prism .
#   docker run -p 8080:8080 -p 8081:8081 -p 50051:50051 -v prism-data:/var/lib/prism prism
# Images cannot be built on the project's CI machines (no container registry reachable there):
# tests/deploy/test_dockerfile.py checks this file against the built binaries and the chart
# instead, and deploy/README.md ("Image") says what it checks.

# Stage 1: build as CI does (scripts/test.sh's Release build): scripts/install-deps.sh installs
# the Debian packages and runs `npm ci` in web/ (the dashboard's bundler), then CMake.
FROM debian:12 AS build
COPY scripts/ /src/scripts/
COPY web/package.json web/package-lock.json /src/web/
RUN bash /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
# .dockerignore keeps build trees and node_modules out, so web/node_modules stays install-deps'.
COPY . /src
WORKDIR /src
# CUDA off: the image has no CUDA toolkit, so prism-agent profiles the CPU (--device auto finds no
# GPU); the benchmarks are not installed. The dashboard must be built: prismd embeds web/dist.
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DPRISM_CUDA=OFF -DPRISM_BENCH=OFF \
 && cmake --build /build -j"$(nproc)" --target prismd prismctl prism-agent \
 && test -f /build/web/dist/index.html \
 && install -D -m 0755 -t /out /build/service/prismd /build/service/prismctl /build/agent/prism-agent

# Stage 2: the runtime libraries only. The packages named are those of the libraries the three
# binaries link directly (readelf NEEDED); apt brings what those depend on; libc6 and zlib1g are
# debian:12-slim's own. tests/deploy/test_dockerfile.py checks every library ldd lists against it.
FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libjansson4 libprotobuf-c1 libmicrohttpd12 libsqlite3-0 libgrpc29 libcurl4 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 prism \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/prism --no-create-home \
      --shell /usr/sbin/nologin prism \
 && mkdir -p /var/lib/prism \
 && chown 10001:10001 /var/lib/prism \
 && chmod 0750 /var/lib/prism
COPY --from=build /out/prismd /out/prismctl /out/prism-agent /usr/local/bin/
# Numeric, so that Kubernetes can check runAsNonRoot against the image itself.
USER 10001:10001
WORKDIR /var/lib/prism
VOLUME ["/var/lib/prism"]
# 8080: HTTP (REST, /metrics, the dashboard); 8081: /healthz and /readyz only, for probes, on a
# listener the load on 8080 cannot starve; 50051: gRPC (agents).
EXPOSE 8080 8081 50051
# prismd listens on 127.0.0.1 by default; in a container that address is unreachable from
# outside, so the image listens on all interfaces and leaves access control to the network.
# The chart's prismd container runs the same command with these arguments and its ConfigMap's and
# Secrets' files added.
ENTRYPOINT ["prismd"]
CMD ["--data-dir=/var/lib/prism", "--http-listen=0.0.0.0:8080", "--grpc-listen=0.0.0.0:50051", "--health-listen=0.0.0.0:8081"]
