# syntax=docker/dockerfile:1
# Multi-stage: build with the locked dependency set, run as non-root on a minimal base.
# The production image is `serve`'s binary without the playground (the default `playground`
# feature is off), so it contains no API-server stand-in. tests/it/dockerfile.rs rebuilds this
# stage's COPY set in a temp dir and checks it with cargo, and holds the apt packages to
# scripts/deps.sh's QG_BUILD_PACKAGES.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Every file the workspace manifest names: the members' crates, the binary, and the benches the
# root package declares (cargo reads their paths even when it builds none of them).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
RUN cargo build --release --locked --no-default-features --bin quorumguard \
 && strip target/release/quorumguard

# distroless/cc has glibc and libgcc, which the binary links; nothing else (no shell).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/quorumguard /usr/local/bin/quorumguard
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/quorumguard"]
