# syntax=docker/dockerfile:1.7
# The eventfleet operator: `eventfleet operator` (Kopf), deployed by the Helm chart.
#
#   docker build -f images/operator.Dockerfile -t eventfleet/operator:0.1.0 .
#
# Same base and layout as the server image; only the `[operator]` extra is installed.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN python -m venv --without-pip /opt/eventfleet/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server/ server/
COPY operator/ operator/
COPY spark/ spark/
RUN pip --python /opt/eventfleet/venv/bin/python install --no-cache-dir --compile ".[operator]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="eventfleet operator" \
      org.opencontainers.image.description="Kopf operator for EventServer fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && groupadd --system --gid 10001 eventfleet \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin eventfleet
COPY --from=build /opt/eventfleet/venv /opt/eventfleet/venv
# The operator keeps no state on disk (Kopf stores its progress in annotations on the
# objects), so with readOnlyRootFilesystem it only ever needs /tmp.
ENV PATH=/opt/eventfleet/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
# Kopf's liveness endpoint (the chart passes --liveness=http://0.0.0.0:8080/healthz).
EXPOSE 8080
USER 10001:10001
# Docker only; on Kubernetes the chart's Deployment probes the same endpoint.
HEALTHCHECK --interval=20s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["eventfleet"]
CMD ["operator", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
