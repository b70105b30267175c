# syntax=docker/dockerfile:1
#
# The compute image: `computed` (node daemon, router, installer), `computectl` and the static
# in-sandbox agent `sandbox-agent` (found next to `computed`), with gVisor's `runsc` from
# Debian's bookworm-backports (20240729; Debian packages only, no download site), which the node
# DaemonSet's init container (`computed install`) copies onto each gVisor node. Debian ships no
# `containerd-shim-runsc-v1`: nodes then run sandboxes through containerd's runc v2 shim and
# the daemon's runsc wrapper; GVISOR_SHIM_VERSION adds gVisor's own shim where a download is
# acceptable.
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
#   GVISOR_SHIM_VERSION  empty (the default): no shim. A gVisor release date (as in
#                    https://gvisor.dev/docs/user_guide/install/): its containerd-shim-runsc-v1
#                    is downloaded and verified against the release's .sha512.
#   RUST_IMAGE       builder image. Default rust:1-bookworm.
#   TARGETARCH       set by BuildKit (amd64 or arm64); picks gVisor's x86_64 or aarch64 build.
#
ARG IMAGE=ghcr.io/paper-board/computed:0.1.0
ARG GVISOR_SHIM_VERSION=
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

# ---- gVisor: runsc from bookworm-backports (the suite added from the image's own apt source) ----
# (image/node-backports lists it for scripts/build-node-image, which checks the same version.)
FROM debian:bookworm-slim AS gvisor
ARG GVISOR_SHIM_VERSION
ARG TARGETARCH
RUN set -eu; \
    uri=$(awk '$1 == "URIs:" {print $2; exit}' /etc/apt/sources.list.d/debian.sources); \
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$uri" > /etc/apt/sources.list.d/bookworm-backports.sources; \
    apt-get update; \
    apt-get install -y --no-install-recommends -t bookworm-backports runsc; \
    runsc --version | grep -q '20240729'; \
    mkdir -p /gvisor; cp /usr/bin/runsc /gvisor/runsc; \
    if [ -n "${GVISOR_SHIM_VERSION}" ]; then \
      apt-get install -y --no-install-recommends ca-certificates curl; \
      case "${TARGETARCH:-amd64}" in \
        amd64) arch=x86_64 ;; \
        arm64) arch=aarch64 ;; \
        *) echo "gVisor has no build for ${TARGETARCH}" >&2; exit 1 ;; \
      esac; \
      url="https://storage.googleapis.com/gvisor/releases/release/${GVISOR_SHIM_VERSION}/${arch}"; \
      cd /gvisor; \
      for f in containerd-shim-runsc-v1 containerd-shim-runsc-v1.sha512; do \
        curl -fsSL --retry 3 -o "$f" "$url/$f"; \
      done; \
      sha512sum -c containerd-shim-runsc-v1.sha512; rm containerd-shim-runsc-v1.sha512; \
      chmod 0755 containerd-shim-runsc-v1; \
    fi; \
    rm -rf /var/lib/apt/lists/*

# ---- the image ----
FROM debian:bookworm-slim
ARG IMAGE
LABEL org.opencontainers.image.ref.name="${IMAGE}" \
      org.opencontainers.image.title="computed" \
      org.opencontainers.image.description="gVisor compute service: node daemon, router, installer, computectl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.gvisor.version="20240729"
# The packages are image/node-packages (one a line, `#` comments: what computed runs, such as
# nsenter, mount, mkfs.ext4, busybox, ip, nft, conntrack, and ca-certificates), the list
# scripts/build-node-image installs too (the same image without Docker); image/node-backports
# names what the gvisor stage takes from bookworm-backports. Both stay in the image as the
# record of what it was built from.
COPY image/node-packages image/node-backports /usr/local/share/computed/
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       $(sed -e 's/#.*//' /usr/local/share/computed/node-packages) \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/computed /out/computectl /usr/local/bin/
COPY --from=build /out/sandbox-agent /usr/local/bin/
# runsc, and the shim when GVISOR_SHIM_VERSION asked for it.
COPY --from=gvisor /gvisor/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/computed"]
CMD ["node"]
