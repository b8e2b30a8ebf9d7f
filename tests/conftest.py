"""Shared configuration of the test suite."""

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # `make test-asan` runs the suite against the sanitizer build in build/asan/. Refuse to run if
    # the interpreter picked up another build: a green run must mean the sanitized code ran.
    if os.environ.get("CYSERVE_EXPECT_SANITIZED") == "1":
        import cyserve._core

        path = os.path.abspath(cyserve._core.__file__)
        if os.sep + os.path.join("build", "asan") + os.sep not in path:
            raise pytest.UsageError(f"expected the sanitizer build of cyserve._core, got {path}")
