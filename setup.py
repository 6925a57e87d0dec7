"""Builds the fmha wheel: python/fmha/ with the crate's cdylib (libfmha) inside, which fmha._lib loads with
ctypes.

setuptools-rust rather than maturin: fmha binds the C ABI with ctypes, so the wheel needs the bare cdylib
next to the package, which is setuptools-rust's ``Binding.NoBinding``; maturin's modes generate their own
Python side (pyo3, cffi, uniffi) or ship executables (bin). setuptools-rust names the library like an
extension module; the wheel is built for the stable ABI (``py_limited_api``), so the file is
``fmha/libfmha.abi3.so`` (which fmha._lib looks for) and the wheel is tagged ``cp39-abi3-<platform>``: one
wheel for every CPython >= 3.9 on the platform (the library does not use Python's C API at all).

FMHA_BACKEND=host|cuda|rocm (default host) picks the backend, i.e. the cargo feature; the GPU backends
need their toolchains as for ``cargo build --features cuda|rocm`` (README). The version is Cargo.toml's.

The package carries the C++ autograd operator's sources (``fmha/csrc``, and ``include/fmha.h`` as
``fmha/include/fmha.h``), so that ``python -m fmha.native_build`` builds the operator (``fmha/_native.py``)
after installation, against the PyTorch installed then. FMHA_BUILD_NATIVE_AUTOGRAD=1 builds it into the
package here, against the PyTorch of the build's Python: ``pip install --no-build-isolation .`` in an
environment that has the PyTorch the package will run with (the file is named after that version and used
only with it).
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND_FEATURES = {"host": [], "cuda": ["cuda"], "rocm": ["rocm"]}

backend = os.environ.get("FMHA_BACKEND") or "host"
if backend not in BACKEND_FEATURES:
    raise SystemExit(
        f"fmha: FMHA_BACKEND={backend!r} is not a backend; set FMHA_BACKEND to one of "
        f"{', '.join(BACKEND_FEATURES)} (or leave it unset for host)"
    )

with open(os.path.join(HERE, "Cargo.toml"), "rb") as f:
    version = tomllib.load(f)["package"]["version"]


class BuildPy(build_py):
    """build_py, with fmha.h beside the operator's sources, and with FMHA_BUILD_NATIVE_AUTOGRAD=1 the C++
    autograd operator next to the package's modules."""

    def run(self):
        super().run()
        package = os.path.join(self.build_lib, "fmha")
        self.mkpath(os.path.join(package, "include"))
        self.copy_file(os.path.join(HERE, "include", "fmha.h"), os.path.join(package, "include", "fmha.h"))
        if os.environ.get("FMHA_BUILD_NATIVE_AUTOGRAD") == "1":
            builder = os.path.join(HERE, "python", "fmha", "native_build.py")
            subprocess.run([sys.executable, builder, package], check=True)


setup(
    version=version,
    cmdclass={"build_py": BuildPy},
    rust_extensions=[
        RustExtension(
            "fmha.libfmha",
            path="Cargo.toml",
            binding=Binding.NoBinding,
            features=BACKEND_FEATURES[backend],
            cargo_manifest_args=["--locked"],
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
