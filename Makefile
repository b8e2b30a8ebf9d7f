# cyserve: everything a fresh machine needs goes through these targets.
#   make run    build, then serve the demo app on $(HOST):$(PORT) with $(THREADS) workers
#   make test   build, then run every test (C units under ASan/UBSan and TSan, Python, end to end)
#   make bench  the full benchmark suite (installs what it needs); bench-quick: a smoke run
#   make bench-coro  the coroutine benchmark (bench/coro/README.md) and the Fibonacci scaling test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
THREADS ?= 0
STAMP := $(VENV)/.deps-stamp
CORE_SOURCES := $(wildcard src/cyserve/*.pyx src/cyserve/*.pxd src/cyserve/native/*.pyx \
	src/cyserve/native/*.pxi src/cyserve/native/includes/*.pxd src/cyserve/csrc/*.c \
	src/cyserve/csrc/*.h src/cyserve/csrc/*.S src/cyserve/include/cyserve/*.h) setup.py

.PHONY: all build run test test-tools test-c test-asan test-pythons venv-tests dist lint bench bench-quick bench-coro soak fuzz fuzz-tools fuzz-net clean

all: build

# The virtual environment, with the pinned build and test tools. A .pth file puts src/ on its
# path, so `python -m cyserve` and the tests import the package built in place.
$(STAMP): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -c 'import sysconfig, os; open(os.path.join(sysconfig.get_paths()["purelib"], "cyserve-src.pth"), "w").write(os.path.abspath("src") + "\n")'
	printf '#!/bin/sh\nexec "$$(dirname "$$0")/python" -m cyserve "$$@"\n' > $(VENV)/bin/cyserve
	chmod +x $(VENV)/bin/cyserve
	touch $@

# CYSERVE_TEST_HOOKS=1: the tests and bench/ also need cyserve._testhooks (see setup.py).
src/cyserve/.built: $(STAMP) $(CORE_SOURCES)
	CYSERVE_TEST_HOOKS=1 $(PY) setup.py -q build_ext --inplace
	touch $@

build: src/cyserve/.built
	@if [ -f examples/build.py ]; then $(PY) examples/build.py; fi

run: build
	$(PY) -m cyserve examples.demo.app:app --host $(HOST) --port $(PORT) --threads $(THREADS)

test: build test-tools
	$(PY) -m pytest
	$(MAKE) test-asan

# The end-to-end tests put a real nginx in front of cyserve (tests/e2e/test_nginx.py: its http
# proxy, and its stream module for the PROXY protocol). A plain Debian machine lacks them: as
# root with apt, install Debian's packages as the benchmarks do; otherwise say what the tests
# will skip, and go on.
test-tools:
	@missing=""; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="nginx"; \
	[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || missing="$$missing libnginx-mod-stream"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make test needs$$missing for its nginx tests: installing Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "make test: the nginx tests will be skipped without$$missing" \
	      "(Debian/Ubuntu: sudo apt-get install$$missing)"; \
	  fi; \
	fi

# The Cython layer and the C runtime once more, built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build/asan/ (a copy of the package), and the tests that drive
# the native code run against it with the sanitizer runtime preloaded into the interpreter.
# Leak detection is off: CPython itself keeps memory until exit.
# The tests that run there are the modules marked `native` (pytestmark = pytest.mark.native):
# those that drive the C and Cython code.
ASAN_PKG := build/asan/pkg
ASAN_PYTEST_ARGS ?= -m native tests
$(ASAN_PKG)/.built: $(STAMP) $(CORE_SOURCES)
	rm -rf $(ASAN_PKG) && mkdir -p $(ASAN_PKG)
	cp -r src/cyserve $(ASAN_PKG)/cyserve
	rm -f $(ASAN_PKG)/cyserve/_core*.so $(ASAN_PKG)/cyserve/_testhooks*.so $(ASAN_PKG)/cyserve/.built
	CYSERVE_SANITIZE=address,undefined CYSERVE_DEBUG=1 CYSERVE_TEST_HOOKS=1 \
		$(PY) setup.py -q build_ext --build-lib $(ASAN_PKG) --build-temp build/asan/tmp
	touch $@

# The Python modules are copied again on every run: the sanitized build is only redone when native
# sources change, and the tests must not run against an older copy of the Python layer.
test-asan: $(ASAN_PKG)/.built
	cp src/cyserve/*.py src/cyserve/*.pyi $(ASAN_PKG)/cyserve/
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	PYTHONPATH=$(ASAN_PKG) CYSERVE_EXPECT_SANITIZED=1 $(PY) -m pytest -p no:cacheprovider $(ASAN_PYTEST_ARGS)

# The Python test suite on the other CPython versions cyserve supports, each in a venv of its own
# (.venv-3.X) with the extension built in place for it (the .so's name carries the version, so
# builds for several versions live side by side in src/cyserve). The interpreter is python3.X on
# pyenv's newest 3.X, else python3.X on the PATH.
PYTHONS ?= 3.10 3.12 3.13
test-pythons:
	@set -e; for v in $(PYTHONS); do \
	  py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V | tail -1); \
	  [ -n "$$py" ] || py=$$(command -v python$$v || true); \
	  if [ -z "$$py" ] || ! "$$py" -c '' 2>/dev/null; then echo "test-pythons: no python$$v on the PATH or in pyenv"; exit 1; fi; \
	  echo "== CPython $$v ($$py)"; \
	  $(MAKE) --no-print-directory PYTHON=$$py VENV=.venv-$$v venv-tests; \
	done

venv-tests: $(STAMP)
	CYSERVE_TEST_HOOKS=1 $(PY) setup.py -q build_ext --inplace
	$(PY) examples/build.py
	$(PY) -m pytest -q -p no:cacheprovider

# The sdist and the manylinux wheel in dist/ (the wheel is built from the sdist, then checked
# and retagged by auditwheel: it links nothing beyond glibc but OpenSSL 3, which auditwheel
# grafts into the wheel).
dist: $(STAMP)
	rm -rf dist && $(PY) -m build --no-isolation --outdir dist .
	PATH="$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair -w dist dist/cyserve-*-linux_*.whl
	rm -f dist/cyserve-*-linux_*.whl
	@ls -1 dist

test-c: $(STAMP)
	$(PY) -m pytest tests/unit/test_c_units.py

# The source gates alone (ruff, mypy, cython-lint, clang-format on all the C); `make test`
# runs them too.
lint: $(STAMP)
	$(PY) -m pytest -q tests/unit/test_sourcecode.py

bench: build
	$(PY) bench/http/run.py --full

bench-quick: build
	$(PY) bench/http/run.py --quick

# e.g. make bench-coro BENCH_CORO_ARGS="--wait-idle 600" on a shared machine
BENCH_CORO_ARGS ?=
bench-coro: build
	$(PY) bench/coro/run.py $(BENCH_CORO_ARGS)

fuzz: build fuzz-tools
	$(MAKE) -C fuzz run

# libFuzzer needs clang, which a plain Debian machine lacks: install Debian's package, as a new
# user would (as root with apt; otherwise say what to install).
fuzz-tools:
	@command -v clang >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make fuzz needs clang: installing Debian's clang package"; \
	    apt-get update -qq && apt-get install -y -qq clang; \
	  else \
	    echo "make fuzz needs clang: install it (Debian/Ubuntu: sudo apt-get install clang)"; \
	    exit 1; \
	  fi; }

# A ten-minute mixed soak (SOAK_SECONDS=): --processes 2 with a worker killed every minute, RSS
# and descriptors sampled every 10 s, a report with a plot in bench/results/soak/.
SOAK_SECONDS ?= 600
soak: build
	$(PY) bench/soak.py --seconds $(SOAK_SECONDS)

# Network fuzzing of the whole server, sanitizer build, ten minutes (FUZZ_NET_SECONDS=), with wrk
# on /plaintext meanwhile; `make test` runs eight seconds of it (tests/e2e/test_fuzz_net.py).
FUZZ_NET_SECONDS ?= 600
fuzz-net: $(ASAN_PKG)/.built
	cp src/cyserve/*.py src/cyserve/*.pyi $(ASAN_PKG)/cyserve/
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	PYTHONPATH=$(ASAN_PKG) $(PY) fuzz/net/fuzz_net.py --seconds $(FUZZ_NET_SECONDS) --wrk

clean:
	rm -rf build src/cyserve/_core.c src/cyserve/_core*.so src/cyserve/_testhooks.c \
		src/cyserve/_testhooks*.so src/cyserve/.built tests/c/build
