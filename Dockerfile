# The `tessera` binary in a small image. Build: docker build -t tessera .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin tessera

FROM debian:bookworm-slim
RUN useradd --system --home-dir /var/lib/tessera --create-home tessera
COPY --from=build /src/target/release/tessera /usr/local/bin/tessera
USER tessera
ENV TESSERA_LISTEN=0.0.0.0:8080 \
    TESSERA_DATA_DIR=/var/lib/tessera
EXPOSE 8080
ENTRYPOINT ["tessera"]
CMD ["serve"]
