# syntax=docker/dockerfile:1
# Host image: wsync-controller, wsync-worker (host memory over Gloo), wsyncctl
# and wsync-demo, running as the unprivileged user 10001. The GPU image (the
# worker's --device) is docker/Dockerfile.gpu. Build (docs/deployment.md):
#   docker build -t wsync:0.1.0 .
# tests/deploy/image_rootfs_test.sh checks the runtime stage without a
# container engine: a Debian 12 root with docker/runtime-packages.txt and the
# binaries below, running a controller and two workers.

FROM debian:12 AS build
# Packages first: a source change does not re-run apt.
COPY docker/build-packages.txt /tmp/build-packages.txt
RUN apt-get update -qq \
    && grep -v '^#' /tmp/build-packages.txt | xargs apt-get install -y -qq --no-install-recommends \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DWSYNC_BUILD_TESTS=OFF -DWSYNC_BUILD_PYTHON=OFF \
    && ninja -C /build wsync-controller wsync-worker wsyncctl wsync-demo

FROM debian:12
COPY docker/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -qq \
    && grep -v '^#' /tmp/runtime-packages.txt | xargs apt-get install -y -qq --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
    && groupadd --system --gid 10001 wsync \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/wsync --create-home \
         --shell /usr/sbin/nologin wsync
COPY --from=build /build/controller/server/wsync-controller /usr/local/bin/
COPY --from=build /build/worker/agent/wsync-worker /usr/local/bin/
COPY --from=build /build/tools/wsyncctl /usr/local/bin/
COPY --from=build /build/tools/demo/wsync-demo /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/wsync
# gRPC API and /metrics of the controller; a worker's metrics port is its --metrics_port.
EXPOSE 50051 9464
# The controller's grpc.health.v1 (exit 0 only when SERVING). Set
# WSYNC_HEALTH_ADDRESS to where it listens and WSYNC_HEALTH_FLAGS to e.g.
# "--controller_ca=/etc/wsync/tls/ca.crt" for a TLS controller; containers
# running a worker disable it (--no-healthcheck).
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD /usr/local/bin/wsyncctl health --controller="${WSYNC_HEALTH_ADDRESS:-127.0.0.1:50051}" \
      ${WSYNC_HEALTH_FLAGS:-} || exit 1
ENTRYPOINT ["/usr/local/bin/wsync-controller"]
