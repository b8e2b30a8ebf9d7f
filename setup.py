"""Build of cyserve's native extension, cyserve._core (and, for tests, cyserve._testhooks).

It compiles the C runtime in src/cyserve/csrc (every .c file, plus the context switch written in
assembly for this machine's architecture) together with the Cython layer that owns it.

Environment switches (used by the Makefile):
  CYSERVE_DEBUG=1     -O1 -g, assertions on, CYSERVE_DEBUG defined
  CYSERVE_SANITIZE=x  add -fsanitize=x (e.g. address,undefined); run with the runtime preloaded
  CYSERVE_CORO_UCONTEXT=1  use the portable ucontext switch instead of the assembly one
  CYSERVE_TEST_HOOKS=1  also build cyserve._testhooks (the parser hooks and the benchmark
                      drivers the tests and bench/ call; an installed cyserve does not need it)
"""

import os
import platform
import shutil
import subprocess
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join("src", "cyserve")


def switch_sources():
    if os.environ.get("CYSERVE_CORO_UCONTEXT") == "1":
        return [], [("CORO_USE_UCONTEXT", "1")]
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return [os.path.join(PKG, "csrc", "coro_switch_x86_64.S")], []
    if machine in ("aarch64", "arm64"):
        return [os.path.join(PKG, "csrc", "coro_switch_aarch64.S")], []
    return [], [("CORO_USE_UCONTEXT", "1")]


OPENSSL_MISSING = (
    "cyserve needs the development files of OpenSSL 3 (its TLS transport, csrc/tls.c, links "
    "libssl): install libssl-dev (Debian, Ubuntu), openssl-devel (Fedora, RHEL) or openssl "
    "(Homebrew), and pkg-config, then build again")


def openssl_flags():
    """Compiler and linker flags of the system's OpenSSL 3, found with pkg-config; a build without
    it stops with a sentence that says what to install."""
    if not shutil.which("pkg-config"):
        raise SystemExit(OPENSSL_MISSING + " (pkg-config is not on the PATH)")

    def pkg(*args):
        proc = subprocess.run(["pkg-config", *args, "openssl"], capture_output=True, text=True)
        return proc.returncode, proc.stdout.split()

    rc, _ = pkg("--atleast-version=3.0")
    if rc != 0:
        found = pkg("--modversion")[1]
        why = (f"pkg-config found OpenSSL {found[0]}, older than 3.0" if found
               else "pkg-config does not know openssl")
        raise SystemExit(f"{OPENSSL_MISSING} ({why})")
    return pkg("--cflags")[1], pkg("--libs")[1]


NGHTTP2_MISSING = (
    "cyserve needs the development files of libnghttp2 (its HTTP/2 protocol, csrc/http2.c, links "
    "it): install libnghttp2-dev (Debian, Ubuntu), libnghttp2-devel (Fedora, RHEL) or nghttp2 "
    "(Homebrew), and pkg-config, then build again")


def nghttp2_flags():
    """Compiler and linker flags of the system's libnghttp2 (1.52 or newer), found with
    pkg-config; a build without it stops with a sentence that says what to install."""
    if not shutil.which("pkg-config"):
        raise SystemExit(NGHTTP2_MISSING + " (pkg-config is not on the PATH)")

    def pkg(*args):
        proc = subprocess.run(["pkg-config", *args, "libnghttp2"], capture_output=True, text=True)
        return proc.returncode, proc.stdout.split()

    rc, _ = pkg("--atleast-version=1.52")
    if rc != 0:
        found = pkg("--modversion")[1]
        why = (f"pkg-config found libnghttp2 {found[0]}, older than 1.52" if found
               else "pkg-config does not know libnghttp2")
        raise SystemExit(f"{NGHTTP2_MISSING} ({why})")
    return pkg("--cflags")[1], pkg("--libs")[1]


ZLIB_MISSING = (
    "cyserve needs the development files of zlib (WebSocket's permessage-deflate, csrc/ws.c, links "
    "it): install zlib1g-dev (Debian, Ubuntu), zlib-devel (Fedora, RHEL) or zlib (Homebrew), then "
    "build again")


def zlib_flags():
    """Compiler and linker flags of the system's zlib: pkg-config's when it knows zlib, else -lz
    once a test program that includes <zlib.h> links; a build without it stops with a sentence
    that says what to install."""
    if shutil.which("pkg-config"):
        proc = subprocess.run(["pkg-config", "--cflags", "--libs", "zlib"], capture_output=True,
                              text=True)
        if proc.returncode == 0:
            flags = proc.stdout.split()
            return ([f for f in flags if not f.startswith(("-l", "-L"))],
                    [f for f in flags if f.startswith(("-l", "-L"))])
    cc = os.environ.get("CC", "cc").split()
    program = "#include <zlib.h>\nint main(void) { return zlibVersion() == 0; }\n"
    probe = subprocess.run([*cc, "-x", "c", "-", "-o", os.devnull, "-lz"], input=program,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"{ZLIB_MISSING} (no <zlib.h> and libz found: pkg-config does not know "
                         "zlib, and a test program does not build)")
    return [], ["-lz"]


class BuildExt(build_ext):
    """setuptools does not compile .S files by default: teach the compiler the extension."""

    def build_extensions(self):
        if ".S" not in self.compiler.src_extensions:
            self.compiler.src_extensions.append(".S")
        super().build_extensions()


def extensions():
    debug = os.environ.get("CYSERVE_DEBUG") == "1"
    sanitize = os.environ.get("CYSERVE_SANITIZE", "")
    asm, macros = switch_sources()
    # -fvisibility=hidden: the extension exports only PyInit__core (Python marks it visible);
    # Cython modules that cimport cyserve._core reach its API through the module's C-API
    # capsules, not through dynamic symbols. So calls between the C files are direct instead of
    # going through the PLT, and no other library can interpose on sched_* or wbuf_* names.
    cflags = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread",
              "-fno-strict-aliasing", "-fvisibility=hidden"]
    cflags += ["-O1", "-g", "-DCYSERVE_DEBUG=1", "-UNDEBUG"] if debug else ["-O2", "-g"]
    ldflags = ["-pthread"]
    if sanitize:
        cflags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
        ldflags += [f"-fsanitize={sanitize}"]
    ssl_cflags, ssl_libs = openssl_flags()
    h2_cflags, h2_libs = nghttp2_flags()
    z_cflags, z_libs = zlib_flags()
    csrc = sorted(glob(os.path.join(PKG, "csrc", "*.c")))
    # The headers, with the *.c.h fragments that sched.c includes, are dependencies: build_ext
    # skips an extension whose listed files are all older than it, so a change to a header alone
    # would otherwise leave the old build in place.
    headers = sorted(glob(os.path.join(PKG, "csrc", "*.h")) +
                     glob(os.path.join(PKG, "include", "cyserve", "*.h")))
    exts = [
        Extension(
            "cyserve._core",
            sources=[os.path.join(PKG, "_core.pyx")] + csrc + asm,
            depends=headers,
            # csrc/ itself is not on the path: its sched.h would shadow the system <sched.h>.
            include_dirs=[PKG, os.path.join(PKG, "include")],
            define_macros=macros,
            extra_compile_args=cflags + ssl_cflags + h2_cflags + z_cflags,
            extra_link_args=ldflags + ssl_libs + h2_libs + z_libs,
        )
    ]
    if os.environ.get("CYSERVE_TEST_HOOKS") == "1":
        # The parser and the WebSocket codec are compiled in again because _core exports no C
        # symbols; the rest is reached through _core's exported API at import time.
        exts.append(Extension(
            "cyserve._testhooks",
            sources=[os.path.join(PKG, "_testhooks.pyx"),
                     os.path.join(PKG, "csrc", "http_parse.c"),
                     os.path.join(PKG, "csrc", "ws.c"),
                     os.path.join(PKG, "csrc", "proxyproto.c")],
            include_dirs=[PKG, os.path.join(PKG, "include")],
            extra_compile_args=cflags + ssl_cflags + z_cflags,
            extra_link_args=ldflags + ssl_libs + z_libs,
        ))
    return exts


setup(
    ext_modules=cythonize(
        extensions(),
        # freethreading_compatible: the modules declare Py_mod_gil = Py_MOD_GIL_NOT_USED, so a
        # free-threaded interpreter (3.13t, 3.14t) keeps the GIL off when it imports them. What
        # makes that true is written beside each piece of shared state (native/*.pyx); a GIL
        # build ignores the slot.
        compiler_directives={"language_level": "3", "embedsignature": True,
                             "freethreading_compatible": True},
        include_path=[os.path.join(HERE, "src")],
    ),
    cmdclass={"build_ext": BuildExt},
)
