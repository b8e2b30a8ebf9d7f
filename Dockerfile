# cyserve in a container: the demo app (examples/demo) served by the installed wheel.
#
#   docker build -t cyserve-demo .
#   docker run --rm -p 8000:8000 cyserve-demo          # then: curl http://127.0.0.1:8000/
#
# Two stages: the first has the compiler and builds the wheel (and the demo's GIL-free Cython
# module, against the installed wheel's headers, as a user's own extension is built); the
# second is a slim Debian with the wheel installed and no compiler. deploy/README.md says more.

ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev pkg-config libssl-dev \
       libnghttp2-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The wheel, built from this tree (PEP 517: Cython comes in as a build requirement).
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && pip install --no-cache-dir /wheels/cyserve-*.whl "Cython>=3.1" setuptools \
    && python examples/build.py

FROM python:${PYTHON_VERSION}-slim-bookworm
COPY --from=build /wheels /wheels
# The wheel built above links the system's libssl and libnghttp2 (not grafted as in a
# manylinux wheel): the runtime libraries come from Debian.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnghttp2-14 \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir /wheels/cyserve-*.whl && rm -rf /wheels \
    && useradd --system --no-create-home cyserve
WORKDIR /app
# The demo and its compiled module; no compiler in this image.
COPY --from=build /src/examples /app/examples
USER cyserve
EXPOSE 8000
# SIGTERM (docker stop) stops gracefully: requests in flight get --graceful-timeout seconds,
# which must stay below docker stop's own timeout (10 s by default).
STOPSIGNAL SIGTERM
CMD ["cyserve", "examples.demo.app:app", "--bind", "0.0.0.0:8000", "--threads", "0"]
