# Builds the compute binaries. The full node image (runsc binaries, installer entrypoint) comes
# with the packaging issue; this stage is what it will build on.
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
RUN cargo build --release --bins

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends busybox-static ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/computed /src/target/release/computectl /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/computed"]
CMD ["node"]
