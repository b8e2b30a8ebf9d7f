"""Fault injection: the server under system calls that fail now and then (fuzz/faults/faults.c,
an LD_PRELOAD shim): accept4 out of descriptors, sends and sendfile cut by the peer, epoll
registrations refused, receives reset; and, with a second build of the shim, the engine's own
allocations (malloc, calloc, realloc) failing. While the faults last, every request gets a right
answer, an error answer (out of memory) or a closed connection, never a wrong answer or a hang;
afterwards every request succeeds, the descriptors held are back to what they were, the
out-of-descriptors line was logged, and the server stops cleanly with no sanitizer report. In
the sanitizer stage of `make test` the server is the ASan/UBSan build, where recv and send go
through libc too and are injected as well."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _subserve import env_with_src, free_port

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ("accept4=EMFILE:300,sendmsg=EPIPE:30,sendto=ECONNRESET:30,writev=EPIPE:30,"
          "sendfile=ECONNRESET:100,recvfrom=ECONNRESET:20,read=ECONNRESET:20,"
          "epoll_ctl=ENOMEM:50")
WINDOW_S = 4.0
REQUESTS = [(b"/plaintext", b"Hello, World!"), (b"/py", b"Hello, World!"),
            (b"/", b"Hello, World!"), (b"/files/hello.txt", None), (b"/wsgi/x", b"got 0\n")]


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "faults.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out),
                    str(ROOT / "fuzz" / "faults" / "faults.c"), "-ldl"], check=True)
    return out


def ask(port: int, path: bytes, keep: socket.socket | None = None) -> tuple[str, bytes]:
    """One request; ("ok", body), ("closed", b"") or ("error", reason)."""
    s = keep or socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.settimeout(5)
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: f\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                return "closed", b""
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        if re.search(rb"transfer-encoding: chunked", head, re.I):
            while not body.endswith(b"0\r\n\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return "closed", b""
                body += chunk
            body = b"".join(body.split(b"\r\n")[1::2])  # the pieces of a chunked answer
        m = re.search(rb"content-length: (\d+)", head, re.I)
        want = int(m.group(1)) if m else 0
        while len(body) < want:
            chunk = s.recv(65536)
            if not chunk:
                return "closed", b""
            body += chunk
        status = head.split(b" ", 2)[1]
        return ("ok" if status == b"200" else "status " + status.decode()), body
    except (ConnectionResetError, BrokenPipeError):
        return "closed", b""
    except TimeoutError:
        return "error", b"timeout"
    finally:
        if keep is None:
            s.close()


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_up(proc: subprocess.Popen[bytes], port: int, err: Path) -> None:
    """Until the server answers: the faults wait for the test's gate, however long a slow
    machine (the sanitizer stage, a loaded CI) takes to start it; 60 s only guards a hang."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if ask(port, b"/plaintext")[0] == "ok":
                return
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
        time.sleep(0.05)


def descriptors_back(pid: int, before: int) -> None:
    """The server's descriptors come back to what they were (two more allowed: a lazily made
    eventfd or epoll), once it has closed the idle connections the test's clients left."""
    deadline = time.monotonic() + 10
    while (after := fds(pid)) > before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after <= before + 2, f"descriptors: {before} before, {after} after"


def test_server_keeps_serving_under_injected_faults(shim: Path, tmp_path: Path) -> None:
    port = free_port()
    report, gate = tmp_path / "injected", tmp_path / "gate"
    env = env_with_src({"CYSERVE_FAULTS": FAULTS, "CYSERVE_FAULTS_SEED": "7",
                        "CYSERVE_FAULTS_GATE": str(gate),
                        "CYSERVE_FAULTS_UNTIL_MS": str(int(WINDOW_S * 1000)),
                        "CYSERVE_FAULTS_REPORT": str(report)})
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{shim} {preload}".strip()
    if preload:  # the sanitizer stage: the shim comes first, on purpose
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "cyserve", "fuzz.net.app:app",
                                 "--port", str(port), "--threads", "2", "--access-log"],
                                cwd=ROOT, env=env, stdout=o, stderr=e)
    try:
        wait_up(proc, port, err)
        before = fds(proc.pid)
        gate.touch()  # the faults begin
        outcomes: dict[str, int] = {}
        end = time.monotonic() + WINDOW_S
        keep = None
        i = 0
        while time.monotonic() < end:
            path, want = REQUESTS[i % len(REQUESTS)]
            i += 1
            if keep is None and i % 3:
                try:
                    keep = socket.create_connection(("127.0.0.1", port), timeout=5)
                except OSError:
                    keep = None
            kind, body = ask(port, path, keep)
            if kind != "ok" and keep is not None:
                keep.close()
                keep = None
            assert kind != "error", f"{path!r}: {body!r}"
            assert not kind.startswith("status 5") or path.startswith(b"/files"), kind
            if kind == "ok" and want is not None:
                assert body == want, (path, body)
            outcomes[kind] = outcomes.get(kind, 0) + 1
        if keep is not None:
            keep.close()
        time.sleep(0.5)
        for _ in range(50):  # the faults are over: everything succeeds again
            for path, want in REQUESTS:
                kind, body = ask(port, path)
                assert kind == "ok", (path, kind, err.read_text()[-2000:])
                assert want is None or body == want
        descriptors_back(proc.pid, before)
        assert outcomes.get("closed", 0) > 0 and outcomes.get("ok", 0) > 0, outcomes
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    log = err.read_text()
    assert rc == 0, log[-3000:]
    for word in ("AddressSanitizer", "runtime error:", "Segmentation fault", "Traceback"):
        assert word not in log, log[-3000:]
    injected = dict(line.split() for line in report.read_text().splitlines())
    assert int(injected["accept4"]) > 0 and int(injected["epoll_ctl"]) > 0, injected
    assert int(injected["sendmsg"]) + int(injected["sendfile"]) + int(injected["writev"]) > 0
    assert "descriptors" in log, log[-2000:]  # the rate-limited out-of-descriptors line


@pytest.fixture(scope="module")
def malloc_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "faults_malloc.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-DFAULTS_MALLOC", "-o", str(out),
                    str(ROOT / "fuzz" / "faults" / "faults.c"), "-ldl"], check=True)
    return out


def test_server_keeps_serving_when_the_engine_runs_out_of_memory(malloc_shim: Path,
                                                                 tmp_path: Path) -> None:
    """malloc, calloc and realloc fail now and then, only when the engine calls them (a
    connection's buffer or struct, a response's headers or body, a Python answer's lease, a
    streamed body's window): each request gets a right answer, an error answer or a closed
    connection, never a wrong answer, a hang or a crash; afterwards everything succeeds, the
    descriptors are back, and the server stops cleanly."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # A shim's malloc ahead of ASan's would run before ASan's allocator is set up (the
        # process dies at start), and behind it would never be called: this one runs in the
        # release stage, where the allocator is libc's.
        pytest.skip("the sanitizer's allocator cannot sit behind a preloaded malloc")
    port = free_port()
    report, gate = tmp_path / "injected", tmp_path / "gate"
    env = env_with_src({"CYSERVE_FAULTS": "malloc=ENOMEM:80", "CYSERVE_FAULTS_SEED": "11",
                        "CYSERVE_FAULTS_GATE": str(gate),
                        "CYSERVE_FAULTS_UNTIL_MS": str(int(WINDOW_S * 1000)),
                        "CYSERVE_FAULTS_REPORT": str(report)})
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{malloc_shim} {preload}".strip()
    if preload:
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    upload = b"u" * 200_000
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "cyserve", "fuzz.net.app:app",
                                 "--port", str(port), "--threads", "2"],
                                cwd=ROOT, env=env, stdout=o, stderr=e)
    try:
        wait_up(proc, port, err)
        before = fds(proc.pid)
        gate.touch()  # the faults begin
        outcomes: dict[str, int] = {}
        end = time.monotonic() + WINDOW_S
        i = 0
        while time.monotonic() < end:
            i += 1
            if i % 4 == 0:
                kind, body = post(port, b"/wsgi/up", upload)
                want: bytes | None = f"got {len(upload)}\n".encode()
            else:
                path, want = REQUESTS[i % len(REQUESTS)]
                kind, body = ask(port, path)
            assert kind != "error", body
            if kind == "ok" and want is not None:
                assert body == want, body[:200]
            outcomes[kind] = outcomes.get(kind, 0) + 1
        time.sleep(0.5)
        for _ in range(20):
            for path, want in REQUESTS:
                kind, body = ask(port, path)
                assert kind == "ok", (path, kind, err.read_text()[-2000:])
                assert want is None or body == want
            assert post(port, b"/wsgi/up", upload) == ("ok", f"got {len(upload)}\n".encode())
        descriptors_back(proc.pid, before)
        assert outcomes.get("ok", 0) > 0, outcomes
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    log = err.read_text()
    assert rc == 0, log[-3000:]
    for word in ("AddressSanitizer", "runtime error:", "Segmentation fault"):
        assert word not in log, log[-3000:]
    injected = dict(line.split() for line in report.read_text().splitlines())
    assert int(injected["malloc"]) > 0, injected


def post(port: int, path: bytes, body: bytes) -> tuple[str, bytes]:
    """A POST with a body of its own; as ask()."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.settimeout(5)
        s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: f\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                return "closed", b""
            got += chunk
        head, _, rest = got.partition(b"\r\n\r\n")
        if re.search(rb"transfer-encoding: chunked", head, re.I):
            while not rest.endswith(b"0\r\n\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return "closed", b""
                rest += chunk
            rest = b"".join(rest.split(b"\r\n")[1::2])
        m = re.search(rb"content-length: (\d+)", head, re.I)
        want = int(m.group(1)) if m else 0
        while len(rest) < want:
            chunk = s.recv(65536)
            if not chunk:
                return "closed", b""
            rest += chunk
        status = head.split(b" ", 2)[1]
        return ("ok" if status == b"200" else "status " + status.decode()), rest
    except (ConnectionResetError, BrokenPipeError):
        return "closed", b""
    except TimeoutError:
        return "error", b"timeout"
    finally:
        s.close()
