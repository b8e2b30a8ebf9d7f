"""Compile bench/http/apps/cyserve_nogil.pyx and the GIL-free WebSocket echo of
examples/ws_echo_nogil.pyx against the cyserve in src/ into bench/.build/.

Run with a Python that has Cython and imports cyserve (the runner uses bench/.venv). Exits non-zero
with the compiler's message when cyserve's cimport-able API is not there yet."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "bench", ".build")  # where servers.py puts it on the path


def main():
    sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]
    import cyserve
    from Cython.Build import cythonize
    from setuptools import Extension
    from setuptools.dist import Distribution

    exts = [Extension("cyserve_nogil", [os.path.join(HERE, "apps", "cyserve_nogil.pyx")],
                      include_dirs=[cyserve.get_include()], extra_compile_args=["-O2"]),
            Extension("ws_echo_nogil", [os.path.join(ROOT, "examples", "ws_echo_nogil.pyx")],
                      include_dirs=[cyserve.get_include()], extra_compile_args=["-O2"])]
    os.makedirs(BUILD, exist_ok=True)
    dist = Distribution({"ext_modules": cythonize(exts, quiet=True, language_level=3,
                                                  compiler_directives={
                                                      "freethreading_compatible": True},
                                                  include_path=[os.path.join(ROOT, "src")],
                                                  build_dir=os.path.join(BUILD, "cython"))})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = BUILD
    cmd.build_temp = os.path.join(BUILD, "tmp")
    cmd.ensure_finalized()
    cmd.run()


if __name__ == "__main__":
    main()
