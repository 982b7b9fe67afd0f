# Host-only image of the controller and worker (the NCCL build adds CUDA on top).
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN bash scripts/install_deps.sh && WSYNC_BUILD_DIR=/build bash scripts/build.sh

FROM debian:12
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-pull1.0 libgloo0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/tools/wsyncctl /usr/local/bin/
EXPOSE 50051 9464
