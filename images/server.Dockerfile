# syntax=docker/dockerfile:1.7
# The eventfleet replica: `eventfleet server` (Eventer, Syncer, Event BUS, HTTP).
#
# Build from the repository root (the context must hold pyproject.toml and the source
# roots; server.Dockerfile.dockerignore keeps everything else out):
#   docker build -f images/server.Dockerfile -t eventfleet/server:0.1.0 .
#
# Python 3.11 because that is the interpreter the test suite runs on. For production,
# pin the base images by digest (`python:3.11-slim-bookworm@sha256:...`).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# A C compiler for the project's four C extensions (the Event BUS's frame loops,
# server/eventfleet_server/bus/_zmqio.c, the Syncer's walk of received events,
# server/eventfleet_server/syncer/_rows.c, the Eventer's decode of register requests,
# server/eventfleet_server/eventer/_register.c, and the chatter frame's parse and head,
# server/eventfleet_server/chatter/_frame.c), and Python's headers where the base lacks them
# (python:3.11-slim has them; Debian's python3 needs python3-dev). This stage only: the
# runtime stage gets the built venv. Every dependency ships a manylinux wheel.
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends gcc libc6-dev \
 && { python -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
      || apt-get install -y -q --no-install-recommends python3-dev; } \
 && rm -rf /var/lib/apt/lists/*
# A venv without pip: the runtime stage gets the application and its dependencies and
# not the tool that installed them.
RUN python -m venv --without-pip /opt/eventfleet/venv
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY server/ server/
COPY operator/ operator/
COPY spark/ spark/
RUN pip --python /opt/eventfleet/venv/bin/python install --no-cache-dir --compile ".[server,backup]" \
 # The extensions are optional in setup.py (a machine without a compiler still
 # installs); this image never ships without them.
 && /opt/eventfleet/venv/bin/python -c "import eventfleet_server.bus._zmqio, eventfleet_server.syncer._rows, eventfleet_server.eventer._register, eventfleet_server.chatter._frame"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="eventfleet server" \
      org.opencontainers.image.description="Redundant Hat event-server replica" \
      org.opencontainers.image.licenses="Apache-2.0"
# The base image's pip and setuptools are not needed at run time.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && groupadd --system --gid 10001 eventfleet \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin eventfleet \
 && mkdir -p /var/lib/eventfleet /etc/eventfleet \
 && chown 10001:10001 /var/lib/eventfleet
COPY --from=build /opt/eventfleet/venv /opt/eventfleet/venv
# Bytecode was compiled at build time; never try to write it next to the sources, which
# are read-only in a pod with readOnlyRootFilesystem.
ENV PATH=/opt/eventfleet/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The only writable paths the server needs: its SQLite store (a volume) and /tmp (an
# emptyDir on Kubernetes). The configuration is mounted read-only at /etc/eventfleet.
VOLUME ["/var/lib/eventfleet"]
WORKDIR /var/lib/eventfleet
# Eventer, Syncer, Event BUS (snapshot, publisher, collector), HTTP.
EXPOSE 23012 23013 23030 23031 23032 23080
# Numeric so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# Docker only; Kubernetes ignores HEALTHCHECK and the operator's StatefulSet probes
# /healthz (liveness) and /readyz (readiness) on the same port instead.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:23080/healthz', timeout=2).status != 200)"]
# Exec form, no shell in between: the server is PID 1 and gets SIGTERM itself. It
# installs its own handler (PID 1 has no default one), stops accepting and flushes to
# its peers before exiting.
ENTRYPOINT ["eventfleet"]
CMD ["server", "--config", "/etc/eventfleet/config.yaml"]
