# prismd and prismctl in a small runtime image (CPU build: the service needs no GPU).
#   docker build -t prism .
#   docker run -p 8080:8080 -p 50051:50051 -v prism-data:/var/lib/prism prism

# Stage 1: build with the same dependency script as a developer machine.
FROM debian:12 AS build
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . /src
WORKDIR /src
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DPRISM_CUDA=OFF -DPRISM_BENCH=OFF \
 && cmake --build /build -j"$(nproc)" --target prismd prismctl \
 && install -D -m 0755 -t /out /build/service/prismd /build/service/prismctl

# Stage 2: the runtime libraries only, running as an unprivileged user.
FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libjansson4 libprotobuf-c1 libmicrohttpd12 libsqlite3-0 libgrpc29 libcurl4 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system prism \
 && useradd --system --gid prism --home-dir /var/lib/prism --shell /usr/sbin/nologin prism \
 && mkdir -p /var/lib/prism \
 && chown prism:prism /var/lib/prism
COPY --from=build /out/prismd /out/prismctl /usr/local/bin/
USER prism
WORKDIR /var/lib/prism
VOLUME ["/var/lib/prism"]
# 8080: HTTP (REST, /metrics, health, readiness); 8081: /healthz and /readyz only, for probes,
# on a listener the load on 8080 cannot starve; 50051: gRPC.
EXPOSE 8080 8081 50051
# prismd listens on 127.0.0.1 by default; in a container that address is unreachable from
# outside, so the image listens on all interfaces and leaves access control to the network.
ENTRYPOINT ["prismd", "--data-dir", "/var/lib/prism", "--http-listen", "0.0.0.0:8080", "--health-listen", "0.0.0.0:8081", "--grpc-listen", "0.0.0.0:50051"]
