# syntax=docker/dockerfile:1
# Multi-stage: build with the locked dependency set, run as non-root on a minimal base.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --bin quorumguard \
 && strip target/release/quorumguard

# distroless/cc has glibc and libgcc, which the binary links; nothing else (no shell).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/quorumguard /usr/local/bin/quorumguard
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/quorumguard"]
