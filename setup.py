"""Build the simulator's compiled core with mypyc (see ``src/tokenomy/_native.py``).

Everything else about the package is in ``pyproject.toml``. ``TOKENOMY_NATIVE=0`` (or mypyc missing)
installs the pure-Python package; a compile error does the same (the extensions are optional), since
the sources are the reference and run unchanged.
"""

import os
import runpy
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def native_extensions() -> list:
    if os.environ.get("TOKENOMY_NATIVE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    compiled = runpy.run_path(str(ROOT / "src" / "tokenomy" / "_native.py"))["COMPILED"]
    # mypyc names each module by its path below the first folder without an __init__.py (src)
    extensions = mypycify([f"src/{path}" for path in compiled], opt_level="3", group_name="tokenomy_native")
    for ext in extensions:
        ext.optional = True
    return extensions


setup(ext_modules=native_extensions())
