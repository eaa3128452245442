# The `tessera` and `tessera-agent` binaries and the portal's browser half in a small image. Build: docker build -t tessera .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/* && \
    npm ci --prefix xtask --no-audit --no-fund && \
    rustup target add wasm32-unknown-unknown && cargo xtask site --locked && \
    cargo build --release --locked --bin tessera --bin tessera-agent

FROM debian:bookworm-slim
# A fixed, numeric user: Kubernetes checks `runAsNonRoot` against it (deploy/kubernetes/tessera-server.yaml).
RUN useradd --system --uid 999 --user-group --home-dir /var/lib/tessera --create-home tessera
COPY --from=build /src/target/release/tessera /src/target/release/tessera-agent /usr/local/bin/
COPY --from=build /src/target/site/pkg/ /usr/local/share/tessera/site/
USER 999:999
ENV TESSERA_LISTEN=0.0.0.0:8080 \
    TESSERA_DATA_DIR=/var/lib/tessera \
    TESSERA_SITE_DIR=/usr/local/share/tessera/site
EXPOSE 8080
ENTRYPOINT ["tessera"]
CMD ["serve"]
