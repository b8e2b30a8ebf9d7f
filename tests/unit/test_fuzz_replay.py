"""Replays the parser fuzzer's corpus and regression inputs under ASan+UBSan.

fuzz/fuzz_http_parse.c is built with gcc (no clang needed) as a replay binary that runs each
input through the same checks as the fuzzer: sanitizers, plus the parser's contract (views
inside the buffer, consumed <= len, prefixes and split feeding agree with the whole). corpus/ and
corpus-router/ are seed sets that reach every block their full corpora reached (fuzz/Makefile says
how to grow one); regression/ keeps every input that ever broke something."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FUZZ = ROOT / "fuzz"


@pytest.fixture(scope="module")
def replay_binary():
    proc = subprocess.run(["make", "-s", "-C", str(FUZZ), "replay"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.fail(f"building the replay binary failed:\n{proc.stdout}\n{proc.stderr}")
    return FUZZ / "build"


CASES = [
    ("replay", "corpus"),
    ("replay", "regression"),
    ("replay-scalar", "corpus"),
    ("replay-scalar", "regression"),
    ("replay-router", "corpus-router"),  # fuzz_router.c: router_add/router_match and files.c
    ("replay-ws", "corpus-ws"),  # fuzz_ws.c: the WebSocket frame reader (csrc/ws.c)
    ("replay-http2", "corpus-http2"),  # fuzz_http2.c: frames into csrc/http2.c's session
    ("replay-proxyproto", "corpus-proxyproto"),  # fuzz_proxyproto.c: csrc/proxyproto.c
]


@pytest.mark.parametrize("binary,folder", CASES, ids=[f"{b}-{f}" for b, f in CASES])
def test_replay(replay_binary, binary, folder):
    """replay-scalar is built with -DHTTP_PARSE_NO_SIMD: the SWAR path gets the same inputs."""
    inputs = [p for p in (FUZZ / folder).iterdir() if p.is_file() and not p.name.startswith(".")]
    assert inputs, f"fuzz/{folder} is empty"
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    proc = subprocess.run([str(replay_binary / binary), str(FUZZ / folder)], capture_output=True,
                          text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert f"replayed {len(inputs)} inputs, 0 errors" in proc.stdout, proc.stdout
