"""Builds fmha's C++ autograd operator (``csrc/native_autograd.cpp``, which ``fmha._native`` loads) against one
PyTorch, into ``native_autograd-<torch version>.so``.

    python -m fmha.native_build [OUT_DIR]     build (default OUT_DIR: the package's folder where it is
                                              writable, else the user cache folder; fmha looks in both)
    python -m fmha.native_build --check       compile only (headers are enough)

The PyTorch is the one this Python imports, or the installed package folder ``--torch-dir`` / ``$TORCH_DIR``
(``…/site-packages/torch``): headers and libraries are all it needs, so it can build for a PyTorch that does
not import here (a CUDA wheel unpacked on a machine without the CUDA libraries). No Python C API and no CUDA
headers: the file depends on the PyTorch version only. ``$CXX`` (default g++) compiles it, with the C++11
string ABI that PyTorch's wheels use since 2.7.

The sources travel with the package (``csrc/``, and ``include/fmha.h`` in an installed one; the repository's
``include/`` in a checkout), so that an installed fmha builds its operator after ``pip install``. This file
imports nothing of fmha: ``scripts/build-native-autograd.sh`` runs it as a script, and setup.py from the
source tree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(PACKAGE_DIR, "csrc", "native_autograd.cpp")


def file_name(version: str) -> str:
    """The build's file name for PyTorch `version` (its local part, e.g. ``+cu128``, dropped)."""
    return f"native_autograd-{version.split('+')[0]}.so"


def cache_dir() -> str:
    """The user cache folder for builds where the package's folder is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fmha")


def torch_dir(explicit: str | None = None) -> str:
    """The PyTorch package folder: `explicit`, ``$TORCH_DIR``, or where this Python's torch is."""
    found = explicit or os.environ.get("TORCH_DIR")
    if found:
        return found
    try:
        import torch  # only to find it
    except ModuleNotFoundError:
        raise SystemExit("fmha.native_build: PyTorch does not import here: install it, or name its package "
                         "folder with --torch-dir or $TORCH_DIR") from None
    return os.path.dirname(torch.__file__)


def torch_version(folder: str) -> str:
    """The version of the PyTorch in `folder`, read from its version.py (no import)."""
    try:
        with open(os.path.join(folder, "version.py")) as f:
            match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.MULTILINE)
    except OSError:
        match = None
    if match is None:
        raise SystemExit(f"fmha.native_build: no __version__ in {folder}/version.py (is it a torch package?)")
    return match.group(1).split("+")[0]


def include_dir() -> str:
    """The folder of fmha.h: the installed package's copy, else the repository's."""
    for folder in (os.path.join(PACKAGE_DIR, "include"), os.path.join(PACKAGE_DIR, "..", "..", "include")):
        if os.path.isfile(os.path.join(folder, "fmha.h")):
            return os.path.normpath(folder)
    raise SystemExit(f"fmha.native_build: fmha.h is neither in {PACKAGE_DIR}/include nor in the repository")


def compile_command(folder: str) -> list[str]:
    """The compiler's command line, without its output (`folder`: the PyTorch package folder)."""
    return [os.environ.get("CXX") or "g++", "-std=c++17", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror",
            "-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{include_dir()}", "-isystem", os.path.join(folder, "include"),
            "-isystem", os.path.join(folder, "include", "torch", "csrc", "api", "include"), SOURCE]


def default_out_dir() -> str:
    return PACKAGE_DIR if os.access(PACKAGE_DIR, os.W_OK) else cache_dir()


def build(out_dir: str | None = None, torch_folder: str | None = None) -> str:
    """Builds the operator into `out_dir` (default: default_out_dir()); returns the file's path. The file
    appears whole (written beside it, then renamed), so that a process loading it never sees a partial one."""
    folder = torch_dir(torch_folder)
    out_dir = out_dir or default_out_dir()
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, file_name(torch_version(folder)))
    fd, partial = tempfile.mkstemp(prefix=".native_autograd-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        subprocess.run(compile_command(folder) + ["-shared", f"-L{os.path.join(folder, 'lib')}", "-Wl,--no-as-needed",
                                                  "-lc10", "-ltorch_cpu", "-ltorch", "-Wl,--as-needed", "-o", partial],
                       check=True)
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def check(torch_folder: str | None = None) -> str:
    """Compiles without linking (headers are enough); returns the PyTorch version it compiled against."""
    folder = torch_dir(torch_folder)
    subprocess.run(compile_command(folder) + ["-c", "-o", os.devnull], check=True)
    return torch_version(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmha.native_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", help="where to put native_autograd-<torch version>.so")
    parser.add_argument("--check", action="store_true", help="compile only")
    parser.add_argument("--torch-dir", help="the PyTorch package folder (default: $TORCH_DIR, or the one imported)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            print(f"native_autograd.cpp compiles against torch {check(args.torch_dir)}")
        else:
            print(build(args.out_dir, args.torch_dir))
    except subprocess.CalledProcessError as e:
        print(f"fmha.native_build: the compiler failed ({e.returncode})", file=sys.stderr)
        return 1
    except OSError as e:  # an unwritable OUT_DIR, a missing compiler
        print(f"fmha.native_build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
