"""Shared configuration of the test suite."""

import importlib.util
import os
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # `make test-asan` runs the suite against the sanitizer build in build/asan/. Refuse to run if
    # the interpreter picked up another build: a green run must mean the sanitized code ran.
    if os.environ.get("CYSERVE_EXPECT_SANITIZED") == "1":
        import cyserve._core

        path = os.path.abspath(cyserve._core.__file__)
        if os.sep + os.path.join("build", "asan") + os.sep not in path:
            raise pytest.UsageError(f"expected the sanitizer build of cyserve._core, got {path}")


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """The event loop an ASGI test runs on (Config.loop, --loop): each test that takes it runs
    on asyncio's loop and on uvloop's."""
    if request.param == "uvloop" and importlib.util.find_spec("uvloop") is None:
        pytest.skip("uvloop is not installed for this Python (requirements-dev.txt pins it "
                    "below 3.14 only: it has no free-threaded build)")
    yield request.param
