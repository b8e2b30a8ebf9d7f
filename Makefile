# cyserve: everything a fresh machine needs goes through these targets.
#   make run    build, then serve the demo app on $(HOST):$(PORT) with $(THREADS) workers
#   make test   build, then run every test (C units under ASan/UBSan and TSan, Python, end to end)
#   make bench  the full benchmark suite (installs what it needs); bench-quick: a smoke run
#               (BENCH_PYTHON=3.13 or a path: the interpreter of its Python servers, 3.12 by default)
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

.PHONY: all build run test test-tools test-c test-asan test-pythons test-docker test-ft test-ft-tsan python-ft venv-tests dist lint bench bench-quick bench-coro soak fuzz fuzz-tools fuzz-net clean native-deps h2spec autobahn

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

# The C libraries the extension links, found with pkg-config by setup.py: OpenSSL 3 (libssl-dev),
# libnghttp2 (libnghttp2-dev, for HTTP/2) and zlib (zlib1g-dev, for WebSocket compression). A
# plain Debian machine may lack their development packages: install them, as a new user would
# (as root with apt; otherwise say what to install).
NATIVE_PKGS := openssl:libssl-dev libnghttp2:libnghttp2-dev zlib:zlib1g-dev
native-deps:
	@missing=""; for p in $(NATIVE_PKGS); do \
	  pkg-config --exists "$${p%%:*}" 2>/dev/null || missing="$$missing $${p#*:}"; \
	done; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "building cyserve needs$$missing: installing Debian's packages"; \
	    apt-get update -qq && apt-get install -y -qq $$missing; \
	  else \
	    echo "building cyserve needs$$missing (Debian/Ubuntu: sudo apt-get install$$missing)"; \
	    exit 1; \
	  fi; \
	fi

# CYSERVE_TEST_HOOKS=1: the tests and bench/ also need cyserve._testhooks (see setup.py).
src/cyserve/.built: $(STAMP) $(CORE_SOURCES) | native-deps
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
# proxy, and its stream module for the PROXY protocol), and the soak's smoke test
# (tests/bench/test_soak_smoke.py) loads the server with wrk. A plain Debian machine lacks them:
# as root with apt, install Debian's packages as the benchmarks do; otherwise say which tests
# need them (the nginx tests skip; the soak test fails, naming wrk), and go on.
test-tools:
	@missing=""; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="nginx"; \
	[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || missing="$$missing libnginx-mod-stream"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make test needs$$missing for its nginx and soak tests: installing Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "make test: the nginx tests will be skipped and the soak test will fail without" \
	      "$$missing (Debian/Ubuntu: sudo apt-get install$$missing)"; \
	  fi; \
	fi

# The Cython layer and the C runtime once more, built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build/asan/ (a copy of the package), and the tests that drive
# the native code run against it with the sanitizer runtime preloaded into the interpreter.
# Leak detection is off: CPython itself keeps memory until exit.
# The tests that run there are the modules marked `native` (pytestmark = pytest.mark.native):
# those that drive the C and Cython code.
ASAN_PKG := $(CURDIR)/build/asan/pkg
ASAN_PYTEST_ARGS ?= -m native tests
$(ASAN_PKG)/.built: $(STAMP) $(CORE_SOURCES) | native-deps
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
# pyenv's newest 3.X, else python3.X on the PATH. The nginx tests need nginx as in `make test`
# (test-tools): without it they would be skipped on every version.
PYTHONS ?= 3.10 3.12 3.13
test-pythons: test-tools
	@set -e; for v in $(PYTHONS); do \
	  py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V | tail -1); \
	  [ -n "$$py" ] || py=$$(command -v python$$v || true); \
	  if [ -z "$$py" ] || ! "$$py" -c '' 2>/dev/null; then echo "test-pythons: no python$$v on the PATH or in pyenv"; exit 1; fi; \
	  echo "== CPython $$v ($$py)"; \
	  $(MAKE) --no-print-directory PYTHON=$$py VENV=.venv-$$v venv-tests; \
	done

# The Dockerfile built and run without Docker: buildah builds it (chroot isolation, vfs
# storage) on a Debian base image made here with debootstrap from apt's mirror (no Docker Hub),
# podman runs it, and the demo is asked for pages from outside, its HEALTHCHECK run, and a
# SIGTERM with a request in flight shown to stop it gracefully (deploy/README.md). Needs root;
# installs buildah, podman, runc and debootstrap with apt when missing; 15 to 20 minutes on a
# busy 2-core machine. Not part of `make test`.
test-docker:
	sh deploy/docker/test-local-build.sh

# A free-threaded CPython 3.14 (PEP 703, PEP 779: the "t" build, without the GIL), built from its
# source once into PY_FT_PREFIX and reused afterwards; `make test-ft` builds cyserve with it in
# .venv-3.14t and runs the whole test suite there. Neither is part of `make test`: a machine
# (and CI) has no such interpreter unless this builds one, which takes about 8 minutes of CPU
# (464 s measured from a fresh clone; 32 minutes of wall-clock time on 2 cores busy with others).
# The prefix is under .cache/ (ignored by git, like the build's other products) so that any user
# can build it from a fresh clone, without root or a system-wide install; give PY_FT_PREFIX= (an
# absolute path) to install it elsewhere, e.g. to share one interpreter between checkouts.
# The source: with no CPYTHON_SRC, Debian's archive of CPython 3.14.7 (the orig tarball of its
# python3.14 source package, the one 3.14 release its pool serves) is downloaded into .cache/ with
# curl (or Python's urllib where curl is missing) and used only once its SHA-256 matches the one
# recorded here: it comes over plain HTTP, so the pinned checksum is what vouches for it. Give
# CPYTHON_SRC= for an archive put by hand, e.g. a zip of the v3.14.7 tag (whose top folder holds
# configure); the checksum is chosen by the file's name (Debian's name, else the tag zip's), and a
# file of another release or packing needs its own CPYTHON_SHA256.
# --disable-test-modules: no _testcapi and no Lib/test, a quarter less to compile and install.
PY_FT_PREFIX ?= $(CURDIR)/.cache/py314t
PY_FT := $(PY_FT_PREFIX)/bin/python3.14t
CPYTHON_URL := http://deb.debian.org/debian/pool/main/p/python3.14/python3.14_3.14.7.orig.tar.xz
CPYTHON_FETCHED := .cache/$(notdir $(CPYTHON_URL))
CPYTHON_SRC ?= $(CPYTHON_FETCHED)
CPYTHON_SHA256_DEBIAN := 3b48dac8fb59f62eaa67ac83c1eb12bda1b7a08406dd286e252c11a66be27f81
CPYTHON_SHA256 ?= $(if $(filter python3.14_3.14.7.orig.tar.xz,$(notdir $(CPYTHON_SRC))),$(CPYTHON_SHA256_DEBIAN),e79b1270b4b62593f6686c8db8edd384b4a9b14e5824a8c9fce0a95656dd6321)
PY_FT_BUILD := .cache/cpython-ft

python-ft: $(PY_FT)

# The download goes to a .part file that is checked before it is renamed, so an interrupted or
# altered download never leaves an archive that a later run would take as good.
$(CPYTHON_FETCHED):
	@mkdir -p $(dir $@) && rm -f $@.part
	@echo "make python-ft: downloading $(CPYTHON_URL)"
	@if command -v curl >/dev/null; then curl -fsSL --connect-timeout 30 -o $@.part "$(CPYTHON_URL)"; \
	  else python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
	    "$(CPYTHON_URL)" $@.part; fi || { rm -f $@.part; \
	  echo "make python-ft: could not download $(CPYTHON_URL); fetch CPython 3.14.7's source archive" \
	    "by hand (that file, or a zip of the v3.14.7 tag) and give it with CPYTHON_SRC= (and CPYTHON_SHA256= for any other)"; exit 1; }
	@echo "$(CPYTHON_SHA256_DEBIAN)  $@.part" | sha256sum -c --quiet - || { rm -f $@.part; \
	  echo "make python-ft: $(CPYTHON_URL) does not have the recorded SHA-256" \
	    "$(CPYTHON_SHA256_DEBIAN): not used. Get CPython 3.14.7's source from a source you trust and" \
	    "give it with CPYTHON_SRC= (and its CPYTHON_SHA256=)"; exit 1; }
	mv $@.part $@

# Order-only: the archive is fetched when missing, and a newer copy of it rebuilds nothing. It is
# named only while the interpreter is missing: make brings an order-only prerequisite that does
# not exist even when the target does, so a built interpreter (a kept .cache, or PY_FT_PREFIX
# naming one elsewhere) would still have downloaded the source, and failed offline.
$(PY_FT): | $(if $(wildcard $(PY_FT)),,$(filter $(CPYTHON_FETCHED),$(CPYTHON_SRC)))
	@[ -f "$(CPYTHON_SRC)" ] || { echo "make python-ft: no $(CPYTHON_SRC): put CPython 3.14.7's source archive there, or name it with CPYTHON_SRC= (and CPYTHON_SHA256=)"; exit 1; }
	echo "$(CPYTHON_SHA256)  $(CPYTHON_SRC)" | sha256sum -c --quiet -
	rm -rf $(PY_FT_BUILD) && mkdir -p $(PY_FT_BUILD)
	case "$(CPYTHON_SRC)" in *.zip) unzip -q "$(CPYTHON_SRC)" -d $(PY_FT_BUILD) ;; \
	  *) tar -xf "$(CPYTHON_SRC)" -C $(PY_FT_BUILD) ;; esac
	@# A zip keeps no file modes: configure and the build's scripts need their execute bits.
	set -e; src=$$(dirname "$$(find $(PY_FT_BUILD) -maxdepth 5 -name configure -type f | head -1)"); \
	  cd "$$src"; grep -rlI -m1 --exclude-dir=Lib '^#!' . | xargs -r chmod +x; \
	  ./configure -q --disable-gil --disable-test-modules --prefix=$(PY_FT_PREFIX) --with-ensurepip=install; \
	  $(MAKE) -j$$(nproc) && $(MAKE) install
	$(PY_FT) -c 'import sys; assert not sys._is_gil_enabled()'

test-ft: $(PY_FT)
	$(MAKE) --no-print-directory PYTHON=$(PY_FT) VENV=.venv-3.14t venv-tests

# ThreadSanitizer on cyserve's C and Cython code under the free-threaded interpreter: the
# extension built with -fsanitize=thread for 3.14t into build/tsan-ft/ (a copy of the package),
# then tests/ft/tsan_stress.py (four workers running Python handlers, a WSGI and an ASGI app at
# once, with every answer and a shared counter checked) with the TSan runtime preloaded. The
# interpreter is not instrumented: tests/ft/tsan.supp lists, each with its reason, the reports
# whose order holds inside it; any other report fails. About 3 minutes of CPU to build.
TSAN_FT_PKG := $(CURDIR)/build/tsan-ft/pkg
TSAN_FT_SECONDS ?= 10
test-ft-tsan: $(PY_FT)
	$(MAKE) --no-print-directory PYTHON=$(PY_FT) VENV=.venv-3.14t .venv-3.14t/.deps-stamp
	rm -rf $(TSAN_FT_PKG) && mkdir -p $(TSAN_FT_PKG)
	cp -r src/cyserve $(TSAN_FT_PKG)/cyserve
	rm -f $(TSAN_FT_PKG)/cyserve/_core*.so $(TSAN_FT_PKG)/cyserve/_testhooks*.so $(TSAN_FT_PKG)/cyserve/_core.c
	CYSERVE_SANITIZE=thread CYSERVE_DEBUG=1 .venv-3.14t/bin/python setup.py -q build_ext \
		--build-lib $(TSAN_FT_PKG) --build-temp build/tsan-ft/tmp
	LD_PRELOAD="$$(gcc -print-file-name=libtsan.so)" \
	TSAN_OPTIONS="suppressions=$(CURDIR)/tests/ft/tsan.supp report_signal_unsafe=0 exitcode=66" \
	PYTHONPATH=$(TSAN_FT_PKG) .venv-3.14t/bin/python tests/ft/tsan_stress.py $(TSAN_FT_SECONDS)

venv-tests: $(STAMP)
	CYSERVE_TEST_HOOKS=1 $(PY) setup.py -q build_ext --inplace
	$(PY) examples/build.py
	$(PY) -m pytest -q -p no:cacheprovider

# The sdist and the manylinux wheel in dist/ (the wheel is built from the sdist, then checked
# and retagged by auditwheel: it links nothing beyond glibc but OpenSSL 3 and libnghttp2, which
# auditwheel grafts into the wheel; building the sdist elsewhere needs their development
# packages, which setup.py names when pkg-config cannot find them).
dist: $(STAMP)
	rm -rf dist && $(PY) -m build --no-isolation --outdir dist .
	PATH="$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair -w dist dist/cyserve-*-linux_*.whl
	rm -f dist/cyserve-*-linux_*.whl
	@ls -1 dist

test-c: $(STAMP) | native-deps
	$(PY) -m pytest tests/unit/test_c_units.py

# The source gates alone (ruff, mypy, cython-lint, clang-format on all the C); `make test`
# runs them too.
lint: $(STAMP)
	$(PY) -m pytest -q tests/unit/test_sourcecode.py

# Every Python server of the suite (the peers and cyserve's rows) runs on one interpreter, in
# bench/.venv: CPython 3.12 by default (pyenv's, else python3.12 on the PATH; failing both, the one
# this .venv was made from), BENCH_PYTHON=3.13 or BENCH_PYTHON=/path/to/python for another. The
# runner makes bench/.venv again when it was made from another interpreter, and builds cyserve's
# extension for it in place (src/cyserve/_core.cpython-3XX-*.so, beside this .venv's).
BENCH_PYTHON ?=
BENCH_ENV := $(if $(BENCH_PYTHON),CYSERVE_BENCH_INTERPRETER='$(BENCH_PYTHON)')

bench: build
	$(BENCH_ENV) $(PY) bench/http/run.py --full

bench-quick: build
	$(BENCH_ENV) $(PY) bench/http/run.py --quick

# WebSocket echo, HTTPS, TLS handshakes, HTTP/2 over TLS and h2c (bench/http/protocols.py), e.g.
# make bench-protocols BENCH_PROTOCOLS_ARGS="--rounds 3 --duration 2"
.PHONY: bench-protocols
BENCH_PROTOCOLS_ARGS ?=
bench-protocols: build
	$(BENCH_ENV) $(PY) bench/http/protocols.py $(BENCH_PROTOCOLS_ARGS)

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

# HTTP/2 conformance: h2spec's 145 cases against a server on this tree's build, over h2c (prior
# knowledge) and over TLS (ALPN h2, a throw-away self-signed certificate), each on a static route.
# h2spec is a Go program: tests/h2spec_run.py builds the version and modules pinned in
# tests/h2spec/go.mod into build/h2spec/ when missing (GO= names the go command). One report line each; the cases that
# fail are listed. `make test` runs the same (tests/e2e/test_h2spec.py) where Go is present.
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
h2spec: build
	GO=$(GO) $(PY) tests/h2spec_run.py

# WebSocket conformance: Autobahn|Testsuite 0.8.2's fuzzingclient against the ASGI echo, the
# App's and the GIL-free one (tests/autobahn/run.py). The suite needs Python 2.7 (pyenv's, or
# python2.7) and is installed with its pip into .cache/autobahn/ the first time.
# CASES='1.*,13.1.*' or CASES=all (the default leaves out 9.*, performance, and 12.*/13.*,
# compression: long on a small machine); AGENTS=nogil or AGENTS=asgi,app picks the echoes.
autobahn: build
	$(PY) tests/autobahn/run.py $(if $(CASES),--cases '$(CASES)') $(if $(AGENTS),--agents '$(AGENTS)')

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
