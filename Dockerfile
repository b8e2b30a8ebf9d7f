# cyserve in a container: the demo app (examples/demo) served by the installed wheel.
#
#   docker build -t cyserve-demo .
#   docker run --rm -p 8000:8000 cyserve-demo          # then: curl http://127.0.0.1:8000/
#
# Two stages: the first has the compiler and builds the wheel (and the demo's GIL-free Cython
# module, against the installed wheel's headers, as a user's own extension is built); the
# second is the same slim Debian with the wheel installed in a venv and no compiler.
# deploy/README.md says more; deploy/docker/test-local-build.sh builds and runs this file
# without Docker (buildah and podman, on a base image made locally with debootstrap).
#
# BASE_IMAGE is any Debian (bookworm or later) image with a CPython 3.10+ as `python3` and its
# venv module: the official python:3.X-slim images (their interpreter in /usr/local, headers
# included) or Debian's own python3 and python3-venv (headers from python3-dev, installed below
# when missing). Both stages use it, so the venv made in the first runs in the second.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
# The C libraries the extension links (OpenSSL 3, libnghttp2, zlib) with their pkg-config files,
# a compiler, and Python.h when the base image's python3 has no headers of its own.
RUN set -eu; \
    pkgs="gcc libc6-dev pkg-config libssl-dev libnghttp2-dev zlib1g-dev"; \
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || pkgs="$pkgs python3-dev"; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pkgs; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The wheel, built from this tree (PEP 517: setuptools and Cython come in as build
# requirements); then the venv the second stage runs (the wheel alone), and a build venv with
# the wheel and Cython for the demo's GIL-free module, compiled against the installed wheel's
# .pxd files and headers.
RUN set -eu; \
    python3 -m venv /opt/buildenv; \
    /opt/buildenv/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
        --wheel-dir /wheels .; \
    python3 -m venv /opt/cyserve; \
    /opt/cyserve/bin/pip install --no-cache-dir --disable-pip-version-check /wheels/cyserve-*.whl; \
    /opt/buildenv/bin/pip install --no-cache-dir --disable-pip-version-check \
        /wheels/cyserve-*.whl "Cython>=3.1" setuptools; \
    /opt/buildenv/bin/python examples/build.py; \
    ls examples/hello_nogil.*.so examples/ws_echo_nogil.*.so; \
    mkdir -p /app/examples; \
    cp -r examples/demo examples/hello_nogil.*.so examples/ws_echo_nogil.*.so /app/examples/; \
    find /app -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}
# The wheel links the system's libssl and libnghttp2 (not grafted in as in the manylinux wheel
# `make dist` makes): their runtime packages come from Debian. Python's own ssl module already
# needs libssl, so only libnghttp2 is missing from a slim image. The ldd check fails the build
# here, not the first request, when a library the extension needs is absent. apt-get clean drops
# apt's package caches (75 MB), which only the official images' apt configuration drops anyway.
COPY --from=build /opt/cyserve /opt/cyserve
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends libnghttp2-14; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    if ldd /opt/cyserve/lib/python3*/site-packages/cyserve/*.so | grep "not found"; then exit 1; fi; \
    groupadd --gid 10001 cyserve; \
    useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin cyserve
ENV PATH=/opt/cyserve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app
# The demo and its compiled modules; no compiler in this image.
COPY --from=build /app/examples /app/examples
# By number: Kubernetes' runAsNonRoot (deploy/kubernetes/cyserve.yaml) cannot verify a name.
USER 10001:10001
EXPOSE 8000
# SIGTERM (docker stop) stops gracefully: requests in flight get --graceful-timeout seconds,
# which must stay below docker stop's own timeout (10 s by default).
STOPSIGNAL SIGTERM
# The health endpoint is answered in C; the check uses Python, as slim images have no curl.
# (HEALTHCHECK is kept in the Docker image format, not in OCI's: build with --format docker.)
HEALTHCHECK --interval=30s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["cyserve", "examples.demo.app:app", "--bind", "0.0.0.0:8000", "--threads", "0", \
     "--health-path", "/healthz"]
