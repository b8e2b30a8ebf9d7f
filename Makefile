# cyserve: everything a fresh machine needs goes through these targets.
#   make run    build, then serve the demo app on $(HOST):$(PORT) with $(THREADS) workers
#   make test   build, then run every test (C units under ASan/UBSan and TSan, Python, end to end)
#   make bench  the full benchmark suite (installs what it needs); bench-quick: a smoke run
#   make bench-coro  seed 002's coroutine table and the Fibonacci scaling test
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

.PHONY: all build run test test-c bench bench-quick bench-coro fuzz clean

all: build

# The virtual environment, with the pinned build and test tools. A .pth file puts src/ on its
# path, so `python -m cyserve` and the tests import the package built in place.
$(STAMP): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -c 'import sysconfig, os; open(os.path.join(sysconfig.get_paths()["purelib"], "cyserve-src.pth"), "w").write(os.path.abspath("src") + "\n")'
	touch $@

src/cyserve/.built: $(STAMP) $(CORE_SOURCES)
	$(PY) setup.py -q build_ext --inplace
	touch $@

build: src/cyserve/.built
	@if [ -f examples/build.py ]; then $(PY) examples/build.py; fi

run: build
	$(PY) -m cyserve examples.demo.app:app --host $(HOST) --port $(PORT) --threads $(THREADS)

test: build
	$(PY) -m pytest

test-c: $(STAMP)
	$(PY) -m pytest tests/test_c_units.py

bench: build
	$(PY) bench/run.py --full

bench-quick: build
	$(PY) bench/run.py --quick

bench-coro: build
	$(PY) bench/coro/run.py

fuzz: build
	$(MAKE) -C fuzz run

clean:
	rm -rf build src/cyserve/_core.c src/cyserve/_core*.so src/cyserve/.built tests/c/build
