"""fmha's C++ autograd operator (``csrc/native_autograd.cpp``): ``torch.ops.fmha.attention``, whose backward
runs in C++ on autograd's thread instead of a Python ``autograd.Function``.

It is a PyTorch extension, built against one PyTorch version (``python -m fmha.native_build``, which an
installed package can run: it carries the sources; ``FMHA_BUILD_NATIVE_AUTOGRAD=1`` builds it into the wheel),
so it is optional: without a build for the running PyTorch the attention functions use the Python
``FmhaAttnFunc``, with the same results. It serves GPU tensors only.

``$FMHA_NATIVE_AUTOGRAD`` picks it: unset, ``native_autograd-<torch version>.so`` in the package's folder, else
in the user cache folder (where ``fmha.native_build`` puts it when the package's folder is read-only); a
path, that file; ``0``, none.
"""

from __future__ import annotations

import ctypes
import os
import threading

import torch

from . import _lib as L
from .native_build import cache_dir, file_name

_lock = threading.Lock()
_loaded = False
_op = None
_status = "not loaded yet"
_addresses = None  # _function_addresses, once


def default_path() -> str:
    """The build for the running PyTorch: the package's, else the user cache folder's (the package's path
    where neither exists)."""
    name = file_name(torch.__version__)
    package = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    cached = os.path.join(cache_dir(), name)
    return cached if not os.path.isfile(package) and os.path.isfile(cached) else package


def attention():
    """``torch.ops.fmha.attention.default`` once the operator is loaded (on the first call), else None
    (:func:`status` says why)."""
    if _loaded:
        return _op
    return _load()


def status() -> str:
    """Whether the C++ autograd operator is in use, and from where or why not."""
    attention()
    return _status


class Plan:
    """A plan of the operator: the C argument structs of one call signature, forward and backward, in a C++
    object that calls refer to by id (``torch.ops.fmha.plan_create``); released with this object, while the
    autograd graphs of calls that used it keep it alive."""

    __slots__ = ("id", "_release")

    def __init__(self, fwd_traits, fwd_args, fwd_workspace_bytes, bwd_traits, bwd_args, prepare_method, vector_bytes):
        self.id = torch.ops.fmha.plan_create(_function_addresses(), _raw(fwd_traits), _raw(fwd_args),
                                             fwd_workspace_bytes, _raw(bwd_traits), _raw(bwd_args), prepare_method,
                                             vector_bytes)
        self._release = torch.ops.fmha.plan_release

    def __del__(self):
        try:
            self._release(self.id)
        except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone; the process's end frees it
            pass


def _function_addresses():
    """The addresses, in the loaded libfmha, of the functions the operator's plans call, in its order
    (``plan_functions``: the list is the C++ file's)."""
    global _addresses
    if _addresses is None:
        lib = L.library()
        names = torch.ops.fmha.plan_functions()
        _addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in names]
    return _addresses


def _raw(struct):
    """A ctypes struct's bytes as a CPU uint8 tensor (what plan_create reads)."""
    return torch.frombuffer(bytearray(bytes(struct)), dtype=torch.uint8)


def _load():
    global _loaded, _op, _status
    with _lock:
        if _loaded:
            return _op
        choice = os.environ.get("FMHA_NATIVE_AUTOGRAD")
        path = default_path() if choice is None else choice
        if choice == "0":
            _status = "off ($FMHA_NATIVE_AUTOGRAD=0)"
        elif L.backend() == L.BACKEND_HOST:
            _status = "not used: the host backend (the operator serves GPU tensors)"
        elif not os.path.isfile(path):
            _status = (f"not built for torch {torch.__version__} ({path} does not exist; "
                       "`python -m fmha.native_build` builds it)")
        else:
            try:
                torch.ops.load_library(path)
                _op = torch.ops.fmha.attention.default
                _status = f"in use ({path})"
            except (OSError, RuntimeError) as e:
                _status = f"{path} does not load: {e}"
        _loaded = True
        return _op
