# Image of the device plugin: `docker build -t gpu-sharing-plugin:0.1.0 .`
#
# It runs as root on purpose: a device plugin must create its gRPC sockets in kubelet's
# /var/lib/kubelet/device-plugins and connect to kubelet's own sockets there and in
# pod-resources, all owned by root and writable only by it. The DaemonSet takes everything else
# away: all capabilities dropped, no privilege escalation, read-only root filesystem, the
# RuntimeDefault seccomp profile. NVML comes from the host driver, injected by the NVIDIA
# container runtime (NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES below), not from this image.
#
# Every Python package the image installs, the build backend included, is pinned by
# constraints/docker.txt (`make lock` rewrites it), so a rebuild of a commit gets the same
# versions. PIP_CONSTRAINT, unlike -c, also reaches the isolated environment that builds this
# project's wheel.
FROM python:3.11.14-slim-bookworm AS build
WORKDIR /src
COPY constraints/docker.txt ./constraints/docker.txt
ENV PIP_CONSTRAINT=/src/constraints/docker.txt \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md LICENSE ./
COPY sharing_plugin ./sharing_plugin
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="gpu-sharing-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs: time-slicing, MIG and MPS from a validated, hot-reloaded ConfigMap" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels gpu-sharing-plugin \
    && rm -rf /wheels
# The root filesystem is read-only at run time: no .pyc writes, unbuffered logs.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER root
EXPOSE 9400
ENTRYPOINT ["sharing-plugin", "run"]
