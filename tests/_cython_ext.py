"""Builds a user's Cython module against the installed cyserve, the way a user would: cimport
cyserve._core (found through the package's parent folder on the include path) and
include_dirs=[cyserve.get_include()]; then imports the built module from its temporary folder."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import cyserve

BUILD = textwrap.dedent("""
    import sys
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    name, inc, pkg_parent = sys.argv[1], sys.argv[2], sys.argv[3]
    setup(name=name.replace("_", "-"),
          ext_modules=cythonize([Extension(name, [name + ".pyx"], include_dirs=[inc])],
                                include_path=[pkg_parent], quiet=True,
                                compiler_directives={"language_level": "3",
                                                     "freethreading_compatible": True}),
          script_args=["-q", "build_ext", "--inplace"])
""")


def build_user_module(pyx: Path, workdir: Path) -> ModuleType:
    """Compile pyx (a .pyx file) in workdir and import it; fails with the compiler's output."""
    name = pyx.stem
    shutil.copy(pyx, workdir / pyx.name)
    (workdir / "build_user_module.py").write_text(BUILD)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(cyserve.__file__)))
    proc = subprocess.run([sys.executable, "build_user_module.py", name, cyserve.get_include(),
                           pkg_parent], cwd=workdir, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"building {pyx.name} failed:\n{proc.stdout}\n{proc.stderr}"
    so = next(workdir.glob(f"{name}*.so"))
    spec = importlib.util.spec_from_file_location(name, so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
