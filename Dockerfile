# syntax=docker/dockerfile:1
# tailcut in a container: a release build in a full Rust image, then the binary alone on a
# distroless base (glibc and CA roots, no shell, no package manager), run as a non-root user.
#
#   docker build -t tailcut .
#   docker run --rm -p 8080:8080 tailcut                       # the embedded simulated demo
#   docker run --rm -p 8080:8080 -e OPENAI_API_KEY \
#     -v $PWD/tailcut.toml:/etc/tailcut/tailcut.toml:ro tailcut \
#     serve --config /etc/tailcut/tailcut.toml --listen 0.0.0.0:8080
#
# See docs/deploy.md for secrets, health checks, drain, TLS and reverse proxies.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# Only the server (the benchmark crate is not shipped); --locked builds what Cargo.lock says.
# The release profile keeps line tables for profiling; the image ships a stripped binary.
ENV CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tailcut --bin tailcut \
    && cp target/release/tailcut /tailcut

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /tailcut /usr/local/bin/tailcut
# The shipped configs, for `--config /etc/tailcut/...` (or mount your own there).
COPY config/ /etc/tailcut/
ENV TAILCUT_LOG=info TAILCUT_LOG_FORMAT=json
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tailcut"]
# The embedded config serves only simulated routes (no provider keys to spend), so the demo
# may listen beyond loopback without [auth]. A config with real routes needs [auth] instead.
CMD ["serve", "--listen", "0.0.0.0:8080", "--allow-unauthenticated"]
