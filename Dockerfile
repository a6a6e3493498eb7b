# The knowtation-sidecar image: built with the Rust toolchain on Debian 12 (bookworm),
# run on distroless cc-debian12 (glibc 2.36, libgcc_s, the CA bundle, no shell) as
# uid/gid 65532. `deploy/verify-image` rebuilds and runs what this file describes without
# a container engine: it runs this build stage's RUN lines and assembles the runtime
# stage from its COPY lines, so keep RUN commands relative to WORKDIR. deploy/README.md
# says what is inside and why.

# Pinned by tag; a release build also pins the digest it resolved (`crane digest
# rust:<tag>`). Bookworm, so the binary needs no newer glibc than the runtime base has.
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
# Only what the build reads: the manifest and lock file, the build script, the sources
# (the demo's notes are embedded from src/), the workspace's other crates (the test kit
# is not built, but the workspace names it, so its manifest must be there), and
# benches/, whose [[bench]] targets Cargo.toml names and so must exist for the manifest
# to load.
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
# The commit `--version` and build_info name; the context has no .git, so pass it in:
# `docker build --build-arg KNOWTATION_SIDECAR_COMMIT="$(git rev-parse HEAD)" .`
# (unset: `unknown`).
ARG KNOWTATION_SIDECAR_COMMIT
# Then an empty directory to become the state directory (the runtime stage has no shell).
RUN cargo build --release --locked --bin knowtation-sidecar \
 && mkdir -m 0700 state

# Distroless cc for Debian 12, nonroot variant. Pinned by tag; a release build also pins
# the digest it resolved (`crane digest gcr.io/distroless/cc-debian12:nonroot`).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/knowtation-sidecar /usr/local/bin/knowtation-sidecar
# The default MCP tool policy (the config below points at it) and the container default
# configuration, read from the default path unless `--config` says otherwise.
COPY policy/mcp-tools.toml /etc/knowtation-sidecar/policy/mcp-tools.toml
COPY deploy/image/config.toml /etc/knowtation-sidecar/config.toml
# state.directory, owned by the sidecar's user (which keeps it at mode 0700): MCP sessions
# outlive a restart of the process, and of the container when a volume is mounted here.
COPY --from=build --chown=65532:65532 /src/state /var/lib/knowtation-sidecar
USER 65532:65532
EXPOSE 8080 9901
ENTRYPOINT ["/usr/local/bin/knowtation-sidecar"]
CMD ["serve"]
