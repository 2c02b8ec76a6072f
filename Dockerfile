# syntax=docker/dockerfile:1
#
# memcgate image: a static binary on distroless, running as a non-root user.
#   make image        (docker build with VERSION and REVISION from git; see Makefile)
#   docker build -t memcgate .
#   docker run --rm -p 8080:8080 -p 127.0.0.1:9090:9090 --add-host=host.docker.internal:host-gateway -e MEMCGATE_SERVERS=host.docker.internal:11211 memcgate
#   (--add-host: Linux has no host.docker.internal of its own; the memcached there must listen beyond 127.0.0.1)
# The build stage runs on the build host's platform and cross-compiles for
# the target one (docker buildx build --platform linux/amd64,linux/arm64 .).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
# What memcgate -version and memcgate_build_info report. The context has no
# .git (.dockerignore), so Go cannot stamp them: make image passes
# git describe --tags --always --dirty and the commit. Without them the
# binary says version "devel", revision "unknown"; the build still works.
ARG VERSION=
ARG REVISION=
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/memcgate ./cmd/memcgate

# distroless/static: CA certificates (for MEMCGATE_UPSTREAM_TLS), tzdata and
# /etc/passwd with the nonroot user (65532), no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/memcgate /memcgate
# The admin listener must be reachable from outside the container for
# Kubernetes probes and Prometheus, not on loopback as by default; the
# image's own HEALTHCHECK uses it too. Keep port 9090 off public networks
# (docs/security.md). The data listener is the default, :8080.
ENV MEMCGATE_ADMIN_ADDR=:9090
EXPOSE 8080 9090
# Numeric, so that Kubernetes runAsNonRoot can verify it.
USER 65532:65532
# No curl in the image: the binary asks its own admin listener. /readyz is
# 503 while no memcached node is reachable and while draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/memcgate", "healthcheck", "/readyz"]
# SIGTERM (the default) drains: /readyz 503 for MEMCGATE_DRAIN_DELAY, then
# in-flight requests get MEMCGATE_SHUTDOWN_TIMEOUT; give `docker stop` at
# least their sum (compose: stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/memcgate"]
