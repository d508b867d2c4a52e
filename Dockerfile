# syntax=docker/dockerfile:1
# gpu-exporter image: docker build -t gpu-exporter .
#
# Two stages on the same slim Python base. "build" turns the project and its runtime
# dependencies into wheels; "runtime" installs exactly those wheels into a virtualenv, without
# the index, and copies nothing else: no sources, no compilers, no test tools.
# tests/test_dockerfile.py runs these RUN lines (without Docker) and checks the result.
#
# NVML (libnvidia-ml.so.1) and the /dev/nvidia* devices are not in the image: the NVIDIA
# container toolkit injects them at run time (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES,
# set below and in deploy/k8s/base/daemonset.yaml).

ARG PYTHON_VERSION=3.11
ARG WHEELHOUSE=/wheels

FROM python:${PYTHON_VERSION}-slim AS build
ARG WHEELHOUSE
# ARGs, unlike ENV, are seen by RUN and do not stay in the image.
ARG PIP_NO_CACHE_DIR=1
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_exporter/ gpu_exporter/
# The project's wheel and one wheel for every runtime dependency ([project] dependencies only;
# the test extras are never installed).
RUN python -m pip wheel --wheel-dir "$WHEELHOUSE" .

FROM python:${PYTHON_VERSION}-slim AS runtime
ARG WHEELHOUSE
ARG PIP_NO_CACHE_DIR=1
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_ROOT_USER_ACTION=ignore
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter and alerting daemon for NVIDIA GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV VIRTUAL_ENV=/opt/gpu-exporter
# The wheelhouse is bind-mounted from the build stage, so no wheel stays in a layer. The venv
# gets no pip of its own; the base image's pip installs into it, from the wheelhouse only.
# (PATH gets the venv only afterwards: `python` here is the base image's, which has pip.)
RUN --mount=type=bind,from=build,source=${WHEELHOUSE},target=${WHEELHOUSE} \
    python -m venv --without-pip "$VIRTUAL_ENV" \
    && python -m pip --python "$VIRTUAL_ENV/bin/python" install --no-index --find-links "$WHEELHOUSE" gpu-exporter
ENV PATH="${VIRTUAL_ENV}/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# A fixed, high, numeric UID/GID, so that Kubernetes' runAsNonRoot can verify it. `docker run` and
# deploy/k8s/components/non-root run as it; the base DaemonSet runs as uid 0 with no capabilities,
# for the kubelet's root-only pod-resources socket (README, "Running on Kubernetes").
RUN groupadd --system --gid 65532 gpu-exporter \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpu-exporter
USER 65532:65532
EXPOSE 9445
# Kubernetes ignores HEALTHCHECK and uses the DaemonSet's probes; this serves `docker run`.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9445/healthz', timeout=3)"]
ENTRYPOINT ["gpu-exporter"]
