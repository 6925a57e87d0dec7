"""The package itself, without PyTorch (the wheel stage of scripts/test.sh runs these in a venv that has
none): where libfmha comes from, the version (Cargo.toml's everywhere), the backend, and the exports, which
load the PyTorch layer on first use."""

import importlib.metadata
import os
import re

import pytest

import fmha

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED = os.environ.get("FMHA_TEST_INSTALLED") == "1"


def test_library_lookup():
    """$FMHA_LIBRARY when set; else an installed package loads the libfmha inside it."""
    fmha.version()  # loads the library
    env = os.environ.get("FMHA_LIBRARY")
    if env:
        assert fmha.library_path() == env
    elif INSTALLED:
        package = os.path.dirname(os.path.abspath(fmha.__file__))
        assert fmha.library_path() == os.path.join(package, "libfmha.abi3.so")
    else:
        pytest.skip("neither FMHA_LIBRARY nor FMHA_TEST_INSTALLED=1: the system loader's libfmha")


def test_version_is_cargos():
    with open(os.path.join(REPO, "Cargo.toml")) as f:
        cargo = re.search(r'^version = "([^"]+)"$', f.read(), re.M).group(1)  # [package] comes first
    assert fmha.version() == cargo
    assert fmha.__version__ == cargo
    major, minor, patch = (int(x) for x in cargo.split("."))
    assert fmha.version_number() == major * 10000 + minor * 100 + patch
    if INSTALLED:
        assert importlib.metadata.version("fmha") == cargo


def test_backend():
    assert fmha.backend() in (fmha.BACKEND_HOST, fmha.BACKEND_CUDA, fmha.BACKEND_ROCM)
    assert fmha.backend_name() == fmha._lib.BACKEND_NAMES[fmha.backend()]


def test_exports_resolve():
    """Every name of ``fmha.__all__`` resolves; without PyTorch those of the PyTorch layer say what is missing."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        torch = None
    for name in fmha.__all__:
        if torch is None and name in fmha._TORCH_NAMES:
            with pytest.raises(ModuleNotFoundError, match="needs PyTorch"):
                getattr(fmha, name)
        else:
            assert getattr(fmha, name) is not None, name
        assert name in dir(fmha)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        fmha.no_such_name


def test_carries_the_operator_sources():
    """The C++ autograd operator builds from an installed package (``python -m fmha.native_build``): its source
    and fmha.h travel with it; in a checkout fmha.h is the repository's."""
    from fmha import native_build

    package = os.path.dirname(os.path.abspath(fmha.__file__))
    assert os.path.isfile(native_build.SOURCE) and native_build.SOURCE.startswith(package + os.sep)
    expected = os.path.join(package, "include") if INSTALLED else os.path.join(REPO, "include")
    assert native_build.include_dir() == os.path.normpath(expected)
    assert os.path.isfile(os.path.join(native_build.include_dir(), "fmha.h"))


def test_native_build_names_and_versions(tmp_path):
    from fmha import native_build

    assert native_build.file_name("2.11.0+cu128") == native_build.file_name("2.11.0") == "native_autograd-2.11.0.so"
    (tmp_path / "version.py").write_text("__version__ = '2.11.0+cu130'\ngit_version = 'abc'\n")
    assert native_build.torch_version(str(tmp_path)) == "2.11.0"
    with pytest.raises(SystemExit, match="no __version__ in .*version.py"):
        native_build.torch_version(str(tmp_path / "missing"))
    assert native_build.compile_command(str(tmp_path))[-1] == native_build.SOURCE
