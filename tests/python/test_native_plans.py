"""The C++ autograd operator's plan table (csrc/native_autograd.cpp: plan_functions, plan_create, plan_release,
and the attention operator's plan lookup), on any backend: these need the operator's build, not a GPU.

The operator's attention itself serves GPU tensors (test_native_autograd.py). Here its build is loaded
directly, ``$FMHA_NATIVE_AUTOGRAD`` or the package's ``native_autograd-<torch version>.so``; CI builds it
against the PyTorch it runs with the installed package's ``python -m fmha.native_build`` (scripts/test.sh,
stage "Python with PyTorch").
"""

import os

import pytest
import torch

from fmha import _lib as L
from fmha import _native, native_build

BUILD = os.environ.get("FMHA_NATIVE_AUTOGRAD") or _native.default_path()
pytestmark = pytest.mark.skipif(not os.path.isfile(BUILD), reason=f"no operator build at {BUILD}")


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    torch.ops.load_library(BUILD)


def _structs():
    return [_native._raw(s()) for s in (L.fmha_fwd_traits, L.fmha_fwd_args)], [
        _native._raw(s()) for s in (L.fmha_bwd_traits, L.fmha_bwd_args)
    ]


def _create(addresses=None, fwd=None, bwd=None, workspace_bytes=16):
    fwd_default, bwd_default = _structs()
    fwd, bwd = fwd or fwd_default, bwd or bwd_default
    addresses = _native._function_addresses() if addresses is None else addresses
    return torch.ops.fmha.plan_create(addresses, fwd[0], fwd[1], workspace_bytes, bwd[0], bwd[1], 0, 0)


def test_default_path_falls_back_to_the_cache(tmp_path, monkeypatch):
    """Without a build in the package's folder, the user cache folder's (where fmha.native_build puts one when
    the package's folder is read-only)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    name = native_build.file_name(torch.__version__)
    package, cached = os.path.join(os.path.dirname(os.path.abspath(_native.__file__)), name), tmp_path / "fmha" / name
    assert _native.default_path() == package
    cached.parent.mkdir()
    cached.write_bytes(b"")
    assert _native.default_path() == (package if os.path.isfile(package) else str(cached))


def test_functions_are_the_library_exports():
    names = torch.ops.fmha.plan_functions()
    assert names and len(set(names)) == len(names)
    assert all(name.startswith("fmha_") for name in names)
    assert all(a for a in _native._function_addresses())  # each resolves in the loaded libfmha
    assert len(_native._function_addresses()) == len(names)


def test_create_refuses_wrong_addresses():
    addresses = _native._function_addresses()
    with pytest.raises(RuntimeError, match=f"takes {len(addresses)} function addresses, got {len(addresses) - 1}"):
        _create(addresses[:-1])
    with pytest.raises(RuntimeError, match="function address is NULL"):
        _create([0] + addresses[1:])


def test_create_refuses_structs_of_another_size():
    (fwd_traits, fwd_args), (bwd_traits, bwd_args) = _structs()
    short = fwd_traits[:-1]
    with pytest.raises(RuntimeError, match=f"fwd_traits must be {fwd_traits.numel()} contiguous CPU bytes"):
        _create(fwd=(short, fwd_args))
    with pytest.raises(RuntimeError, match="bwd_args must be"):
        _create(bwd=(bwd_traits, torch.cat([bwd_args, bwd_args[:1]])))
    with pytest.raises(RuntimeError, match="fwd_args must be"):
        _create(fwd=(fwd_traits, fwd_args.to(torch.int32)))
    with pytest.raises(RuntimeError, match="fwd_workspace_bytes must be >= 0, got -1"):
        _create(workspace_bytes=-1)


def test_ids_are_released_once_and_then_refused():
    first, second = _create(), _create()
    assert second > first > 0
    q = torch.zeros(1, 1, 1, 8)
    torch.ops.fmha.plan_release(first)
    torch.ops.fmha.plan_release(first)  # a released id: nothing to do
    with pytest.raises(RuntimeError, match=f"plan {first} does not exist"):
        torch.ops.fmha.attention(q, q, q, None, None, 0, 0, first)
    torch.ops.fmha.plan_release(second)
    with pytest.raises(RuntimeError, match=f"plan {second} does not exist"):
        torch.ops.fmha.attention(q, q, q, None, None, 0, 0, second)
