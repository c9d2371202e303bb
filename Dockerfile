# syntax=docker/dockerfile:1
#
# Tollgate container image.
#
#   docker build -t tollgate .
#   docker run --rm -p 8080:8080 -p 8081:8081 \
#     -v "$PWD/config:/srv/runtime_data/current/config:ro" tollgate
#
# Rules are read from /srv/runtime_data/current/config (the reference
# service's default runtime path, so Kubernetes manifests written for
# envoyproxy/ratelimit mount their ConfigMap in the same place). The image
# ships config/example.yaml there so that it starts as is; mount your own
# directory over it. Arguments after the image name are passed to
# `tollgate serve`, e.g. `--redis-url redis://redis:6379`; every setting is
# also an environment variable (REDIS_URL, GRPC_PORT, PORT, LOG_LEVEL, ...).
#
# Needs BuildKit (the default builder of current Docker) for the cache mounts.

ARG RUST_VERSION=1
ARG DEBIAN_RELEASE=bookworm

# --- build -------------------------------------------------------------------
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
WORKDIR /src
# Everything Cargo.toml refers to (src/, benches/, ...); .dockerignore keeps
# target/ and .git out of the context.
COPY . .
# The registry and target/ live in cache mounts, so rebuilds after a source
# change only recompile Tollgate itself. The binary is copied out of the
# cache mount because the mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin tollgate \
 && install -D -m 0755 target/release/tollgate /out/tollgate

# --- run ---------------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim
# ca-certificates: for TLS connections to Redis (rediss://).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 tollgate \
 && useradd --system --uid 10001 --gid tollgate --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin tollgate \
 && ln -s /usr/local/bin/tollgate /bin/ratelimit
# /bin/ratelimit is the reference's binary path, which Envoy Gateway's Deployment and the
# reference's manifests run with no arguments: Tollgate then serves, configured by the
# environment as the reference is.
COPY --from=builder /out/tollgate /usr/local/bin/tollgate
COPY config/example.yaml /srv/runtime_data/current/config/example.yaml

# A numeric user, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# 8080: HTTP (/healthcheck, /json, /metrics); 8081: gRPC (RateLimitService, grpc.health.v1).
EXPOSE 8080 8081

# No curl in the slim image: bash's /dev/tcp sends the request. It checks
# 127.0.0.1:$PORT (8080 unless PORT is set); if you move the HTTP listener
# with --http-addr or bind HOST to a single non-loopback address, override
# this HEALTHCHECK (or use the gRPC health service from your orchestrator).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --start-interval=1s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${PORT:-8080} && printf 'GET /healthcheck HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && IFS= read -r -t 2 status <&3 && [[ $status == 'HTTP/1.'?' 200'* ]]"]

# Tollgate handles SIGTERM (graceful shutdown) itself, so it can be PID 1.
ENTRYPOINT ["tollgate", "serve"]
CMD []
