# Host-only image of the controller, the worker and wsyncctl. The GPU data
# plane (WSYNC_WITH_CUDA=ON) builds on an nvidia/cuda base instead; see docs/gpu.md.
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN bash scripts/install_deps.sh && BUILD_TYPE=Release WSYNC_BUILD_DIR=/build bash scripts/build.sh

FROM debian:12
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 libgloo0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/controller/server/wsync-controller /usr/local/bin/
COPY --from=build /build/worker/agent/wsync-worker /usr/local/bin/
COPY --from=build /build/tools/wsyncctl /usr/local/bin/
# gRPC API and /metrics of the controller; the worker's metrics port is set by flag.
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/wsync-controller"]
