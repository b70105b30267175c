# syntax=docker/dockerfile:1
#
# The compute image: `computed` (node daemon, router, installer), `computectl` and the static
# in-sandbox agent `sandbox-agent` (found next to `computed`), with gVisor's
# `runsc` and `containerd-shim-runsc-v1`, which the node DaemonSet's init container
# (`computed install`) copies onto each gVisor node.
#
#   docker build -t ghcr.io/paper-board/computed:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/paper-board/computed:0.1.0 .
#
# Build arguments:
#   IMAGE            the reference this image is published as; recorded in the
#                    org.opencontainers.image.ref.name label. daemonset/base/*.yaml use the
#                    same reference (tests/manifests.rs checks that they agree; an overlay may
#                    rename it with kustomize's `images:`).
#                    Default ghcr.io/paper-board/computed:0.1.0.
#   GVISOR_VERSION   gVisor release whose runsc and shim are shipped (a date, as in
#                    https://gvisor.dev/docs/user_guide/install/). Default 20240212.
#   RUST_IMAGE       builder image. Default rust:1-bookworm.
#   TARGETARCH       set by BuildKit (amd64 or arm64); picks gVisor's x86_64 or aarch64 build.
#
# The binaries are verified against the release's .sha512 files; the build fails on a mismatch.

ARG IMAGE=ghcr.io/paper-board/computed:0.1.0
ARG GVISOR_VERSION=20240212
ARG RUST_IMAGE=rust:1-bookworm

# ---- build the binaries ----
FROM ${RUST_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
# Cargo.toml's [[bin]] targets outside src/ (tests/manifests.rs checks that each is copied).
COPY bench bench
# The agent crate (a workspace member) and its static build script.
COPY agent agent
COPY scripts/build-agent scripts/build-agent
# The target dir is a cache mount (kept between builds, not in the layer): copy the binaries out.
# The agent is linked statically (glibc, crt-static) so that it runs in images of any libc.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out \
    && cp target/release/computed target/release/computectl /out/ \
    && cp "$(scripts/build-agent)" /out/sandbox-agent

# ---- fetch and verify gVisor ----
FROM debian:bookworm-slim AS gvisor
ARG GVISOR_VERSION
ARG TARGETARCH
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /gvisor
RUN set -eu; \
    case "${TARGETARCH:-amd64}" in \
      amd64) arch=x86_64 ;; \
      arm64) arch=aarch64 ;; \
      *) echo "gVisor has no build for ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    url="https://storage.googleapis.com/gvisor/releases/release/${GVISOR_VERSION}/${arch}"; \
    for f in runsc runsc.sha512 containerd-shim-runsc-v1 containerd-shim-runsc-v1.sha512; do \
      curl -fsSL --retry 3 -o "$f" "$url/$f"; \
    done; \
    sha512sum -c runsc.sha512 containerd-shim-runsc-v1.sha512; \
    chmod 0755 runsc containerd-shim-runsc-v1

# ---- the image ----
FROM debian:bookworm-slim
ARG IMAGE
ARG GVISOR_VERSION
LABEL org.opencontainers.image.ref.name="${IMAGE}" \
      org.opencontainers.image.title="computed" \
      org.opencontainers.image.description="gVisor compute service: node daemon, router, installer, computectl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.gvisor.version="${GVISOR_VERSION}"
# util-linux + mount: nsenter (the installer's containerd restart), mount/losetup;
# e2fsprogs: mkfs.ext4 for workspace volumes; busybox-static: /bin/busybox, the sandboxes'
# init helper (init_helper); ca-certificates: registry pulls.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       util-linux mount e2fsprogs busybox-static ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/computed /out/computectl /usr/local/bin/
COPY --from=build /out/sandbox-agent /usr/local/bin/
COPY --from=gvisor /gvisor/runsc /gvisor/containerd-shim-runsc-v1 /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/computed"]
CMD ["node"]
