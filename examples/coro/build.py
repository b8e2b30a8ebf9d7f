"""Build examples/coro/ping.pyx in place against the installed cyserve:
`cimport cyserve._core` finds cyserve's .pxd files next to the package, and the C compiler gets
cyserve.get_include(). Run: python build.py && python run.py"""

import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

import cyserve

HERE = os.path.dirname(os.path.abspath(__file__))
# The folder that contains the cyserve package, so that Cython finds cyserve/_core.pxd.
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cyserve.__file__)))

os.chdir(HERE)
setup(
    name="cyserve-coro-example",
    ext_modules=cythonize(
        [Extension("ping", ["ping.pyx"], include_dirs=[cyserve.get_include()])],
        include_path=[PKG_PARENT],
        compiler_directives={"language_level": "3", "freethreading_compatible": True},
        quiet=True,
    ),
    script_args=["-q", "build_ext", "--inplace"] + sys.argv[1:],
)
