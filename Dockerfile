# syntax=docker/dockerfile:1
# pyctl's container image: a multi-stage build.
#   builder: maturin builds the wheel (the Rust core as pyctl._core, and the Python package)
#   runtime: Python slim, the wheel installed, a non-root user, `pyctl run`
# Build: docker build -t pyctl:latest .   (deploy/base/deployment.yaml runs image pyctl:latest)

ARG PYTHON_VERSION=3.11

FROM rust:1-slim-bookworm AS builder
ARG PYTHON_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir "maturin>=1.16,<2.0"
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY rust ./rust
COPY pyctl ./pyctl
# abi3 wheel: one wheel for every CPython >= 3.11
RUN /opt/build/bin/maturin build --release --strip --out /dist

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=builder /dist /tmp/dist
# with the extra `agent` (nvidia-ml-py, grpcio, protobuf): the same image runs `pyctl agent`
RUN pip install "$(ls /tmp/dist/*.whl)[agent]" \
 && rm -rf /tmp/dist \
 && groupadd --system --gid 10001 pyctl \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin pyctl
# numeric, so that runAsNonRoot can verify it
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["pyctl"]
CMD ["run", "--no-live"]
