# Two stages: build with the Rust toolchain, run on a small Debian base as a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin knowtation-sidecar

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home sidecar
COPY --from=build /src/target/release/knowtation-sidecar /usr/local/bin/knowtation-sidecar
# The default MCP tool policy; point `mcp.policy_file` here (or at an edited copy).
COPY policy/mcp-tools.toml /etc/knowtation-sidecar/policy/mcp-tools.toml
USER 10001
ENTRYPOINT ["/usr/local/bin/knowtation-sidecar"]
