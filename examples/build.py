"""Build the example Cython extensions in place (examples/hello_nogil.pyx), against the
installed cyserve: its .pxd for `cimport cyserve._core` and cyserve.get_include() for the C
headers. `make build` runs this after building cyserve._core.

It does nothing when every extension is newer than its .pyx and than the cyserve API it
cimports (_core.pxd, the .pxi files it includes, the C headers), so an unchanged tree costs one
stat per file. Generated C goes to build/examples/, not next to the sources.
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXTENSIONS = ["hello_nogil", "ws_echo_nogil"]


def _api_files(pkg_dir: str, include_dir: str) -> list[str]:
    return (glob.glob(os.path.join(pkg_dir, "*.pxd"))
            + glob.glob(os.path.join(pkg_dir, "native", "*.pxi"))
            + glob.glob(os.path.join(include_dir, "cyserve", "*.h")))


def _output(name: str) -> str:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return os.path.join(HERE, name + suffix)


def _stale(name: str, deps: list[str]) -> bool:
    out = _output(name)
    if not os.path.exists(out):
        return True
    built = os.path.getmtime(out)
    return any(os.path.getmtime(dep) > built for dep in deps)


def _handler_api_present(pkg_dir: str) -> bool:
    # Until the engine exports the handler API (native/http_api.pxi), there is nothing to
    # cimport; building would fail and take `make build` down with it.
    path = os.path.join(pkg_dir, "native", "http_api.pxi")
    try:
        with open(path, encoding="utf-8") as f:
            return "cyserve_handler_capsule" in f.read()
    except OSError:
        return False


def main() -> int:
    os.chdir(ROOT)
    import cyserve

    pkg_dir = os.path.dirname(os.path.abspath(cyserve.__file__))
    include_dir = cyserve.get_include()
    api = _api_files(pkg_dir, include_dir)
    todo = [n for n in EXTENSIONS if _stale(n, [os.path.join(HERE, n + ".pyx")] + api)]
    if not todo:
        return 0
    if not _handler_api_present(pkg_dir):
        print("examples/build.py: skipped: cyserve._core does not export the handler API yet",
              file=sys.stderr)
        return 0

    from Cython.Build import cythonize
    from setuptools import Extension, setup

    # setup() runs from examples/, not from the repository root: at the root it would read
    # pyproject.toml and take cyserve's own package layout (package-dir src/) for this build.
    os.chdir(HERE)
    build_dir = os.path.join(ROOT, "build", "examples")
    extensions = [
        Extension(name, [name + ".pyx"], include_dirs=[include_dir],
                  extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"])
        for name in todo
    ]
    setup(
        name="cyserve-examples",
        ext_modules=cythonize(extensions, build_dir=build_dir,
                              include_path=[os.path.dirname(pkg_dir)], quiet=True,
                              compiler_directives={"language_level": "3",
                                                   "freethreading_compatible": True}),
        script_args=["-q", "build_ext", "--inplace",
                     "--build-temp", os.path.join(build_dir, "tmp"),
                     "--build-lib", os.path.join(build_dir, "lib")],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
