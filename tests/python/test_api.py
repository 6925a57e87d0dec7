"""The binding itself: library queries, errors (status + fmha's message, per thread), flash-attn argument
handling, refused features, launcher caching and concurrent use."""

import ctypes
import threading

import pytest
import torch

import fmha
from fmha import _lib, _native, ops

from attn_ref import BOTTOM_RIGHT, DEVICE, GPU, HOST, attention_ref, call_or_skip, cu_seqlens, keep_mask, randn


def test_version_backend_registry():
    assert fmha.version() == "0.2.0" or fmha.version().count(".") == 2
    major, minor, patch = (int(x) for x in fmha.version().split(".")[:3])
    assert fmha.version_number() == major * 10000 + minor * 100 + patch
    assert fmha.backend() in (fmha.BACKEND_HOST, fmha.BACKEND_CUDA, fmha.BACKEND_ROCM)
    assert fmha.backend_name() in ("host", "cuda", "rocm")
    reg = fmha.registry()
    assert isinstance(reg, list)
    for inst in reg:
        for key in ("name", "operation", "arch", "dtype", "hdim_q", "hdim_v", "masked", "deterministic"):
            assert key in inst, f"registry entry without {key}: {inst}"
    if HOST:
        ops_ = {i["operation"] for i in reg}
        assert ops_ == {"fwd", "bwd", "kvcache"}
        assert fmha.registry_supports("kvcache", torch.float8_e4m3fn, 64, 64, True)
        assert fmha.registry_supports("kvcache", "bf16", 128, 128, False)
        assert fmha.registry_supports("bwd", torch.bfloat16, 64, 64, True, True)
        assert not fmha.registry_supports("fwd", torch.bfloat16, 300, 64, True)
    assert fmha.cu_count() >= 1


def test_struct_sizes_match_header():
    """struct_size is what the library checks first; a mismatch would be refused."""
    for struct in (_lib.fmha_fwd_traits, _lib.fmha_fwd_args, _lib.fmha_bwd_traits, _lib.fmha_bwd_args,
                   _lib.fmha_kvcache_traits, _lib.fmha_kvcache_args):
        assert struct().struct_size == ctypes.sizeof(struct)


def test_error_carries_status_and_message():
    q = randn(1, 8, 3, 64, dtype=torch.float16)
    k = randn(1, 8, 2, 64, dtype=torch.float16)
    with pytest.raises(fmha.FmhaError) as info:
        fmha.flash_attn_func(q, k, k)
    e = info.value
    assert e.status == fmha.ERR_INVALID_ARGUMENT
    assert "nhead_q" in e.message and "multiple" in e.message
    assert e.function == "fmha_fwd"
    assert "FMHA_ERR_INVALID_ARGUMENT" in str(e)
    assert fmha.status_string(e.status) == "invalid argument"


def test_unsupported_message_is_fmhas():
    """An UNSUPPORTED answer reaches Python with fmha's own message (here: mask_type 3)."""
    q = randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(fmha.FmhaError) as info:
        ops._fwd(q, q, q, mask_type=3, window=(-1, 0))
    assert info.value.status == fmha.ERR_UNSUPPORTED
    assert "window_generic" in info.value.message


def test_error_message_is_per_thread():
    """Each thread reads the message of its own failed call (fmha_last_error_message is thread-local)."""
    results = {}
    barrier = threading.Barrier(4)

    def worker(i):
        barrier.wait()
        for _ in range(50):
            try:
                _lib.call("fmha_memcpy", None, None, 8, 40 + i)
            except fmha.FmhaError as e:
                if f"{40 + i}" not in e.message:
                    results[i] = e.message
                    return
        results[i] = "ok"

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v == "ok" for v in results.values()), results
    assert len(results) == 4


def test_dropout_softcap_alibi_refused():
    q = randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="dropout"):
        fmha.flash_attn_func(q, q, q, dropout_p=0.1)
    cu = cu_seqlens([8])
    with pytest.raises(NotImplementedError, match="dropout"):
        fmha.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, dropout_p=0.5)
    with pytest.raises(NotImplementedError, match="softcap"):
        fmha.flash_attn_func(q, q, q, softcap=30.0)
    with pytest.raises(NotImplementedError, match="alibi"):
        fmha.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2))
    out = call_or_skip(lambda: fmha.flash_attn_func(q, q, q, dropout_p=0.0), op="fwd", dtype=q.dtype, hdim_q=64,
                       hdim_v=64, masked=False)
    assert out.shape == q.shape


def test_positional_softcap_is_softcap():
    q = randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="softcap"):
        fmha.flash_attn_func(q, q, q, 0.0, None, False, (-1, -1), 30.0)
    cu = cu_seqlens([8])
    with pytest.raises(NotImplementedError, match="softcap"):
        fmha.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, 0.0, None, False, (-1, -1), 30.0)
    with pytest.raises(NotImplementedError, match="block_table"):
        fmha.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, block_table=cu)


def test_flash_window_mapping_keeps_large_but_bounded_sides():
    """A window side >= seqlen_k is not unbounded when seqlen_q > seqlen_k: with bottom-right alignment
    rows 0..649 of sq 777, sk 63, window (300, 64) see no key at all (out 0, lse -inf)."""
    assert ops._flash_mask(False, (300, 64), 777, 63) == (fmha.MASK_BOTTOM_RIGHT, -1, 64)
    assert ops._flash_mask(False, (62, 776), 777, 63) == (fmha.MASK_NONE, -1, -1)
    assert ops._flash_mask(False, (61, 775), 777, 63) == (fmha.MASK_BOTTOM_RIGHT, 61, 775)
    assert ops._flash_mask(True, (5000, 5000), 10, 10) == (fmha.MASK_BOTTOM_RIGHT, -1, 0)
    q = randn(1, 777, 2, 64, dtype=torch.bfloat16)
    k = randn(1, 63, 2, 64, dtype=torch.bfloat16)
    res = call_or_skip(lambda: fmha.flash_attn_func(q, k, k, window_size=(300, 64), return_attn_probs=True),
                       op="fwd", dtype=q.dtype, hdim_q=64, hdim_v=64, masked=True)
    out, lse, _ = res
    assert torch.all(out[0, :650] == 0)
    assert torch.all(lse[0, :, :650] == float("-inf"))
    assert torch.isfinite(lse[0, :, 650:]).all() and out[0, 650:].abs().amax() > 0
    ref, _ = attention_ref(q, k, k, keep_mask(777, 63, BOTTOM_RIGHT, 300, 64), 64 ** -0.5)
    assert (out.double() - ref).abs().amax() < 2e-2


def test_return_attn_probs_shapes():
    q = randn(2, 9, 4, 64, dtype=torch.bfloat16)
    k = randn(2, 11, 2, 64, dtype=torch.bfloat16)
    res = call_or_skip(lambda: fmha.flash_attn_func(q, k, k, causal=True, return_attn_probs=True), op="fwd",
                       dtype=q.dtype, hdim_q=64, hdim_v=64, masked=True)
    out, lse, p = res
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    # flash-attn's S_dmask without dropout: torch.empty((0,)) of q's dtype and device (flash_api.cpp).
    assert p.shape == (0,) and p.dtype == q.dtype and p.device == q.device
    cu_q, cu_k = cu_seqlens([4, 5]), cu_seqlens([6, 5])
    out, lse, p = fmha.flash_attn_varlen_func(q[0], k[0], k[0], cu_q, cu_k, 5, 6, return_attn_probs=True)
    assert out.shape == q[0].shape and lse.shape == (4, 9)
    assert p.shape == (0,) and p.dtype == q.dtype and p.device == q.device


def test_argument_checks():
    q = randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float16"):
        fmha.flash_attn_func(q.float(), q.float(), q.float())
    with pytest.raises(TypeError, match="dtype"):
        fmha.flash_attn_func(q, q.half(), q)
    with pytest.raises(ValueError, match="softmax_scale"):
        fmha.flash_attn_func(q, q, q, softmax_scale=0.0)
    cu64 = torch.tensor([0, 8], dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="int32"):
        fmha.flash_attn_varlen_func(q[0], q[0], q[0], cu64, cu64, 8, 8)
    with pytest.raises(ValueError, match="batch"):
        fmha.flash_attn_func(q, randn(2, 8, 2, 64, dtype=torch.bfloat16), randn(2, 8, 2, 64, dtype=torch.bfloat16))
    other = torch.empty(1, 8, 2, 64, dtype=torch.bfloat16, device="meta" if HOST else "cpu")
    with pytest.raises(ValueError, match="backend"):
        fmha.flash_attn_func(other, other, other)


def test_varlen_generous_max_seqlen_is_clamped():
    """flash-attn accepts any upper bound for max_seqlen: a bound above the total rows still works."""
    q = randn(10, 2, 64, dtype=torch.bfloat16)
    cu = cu_seqlens([3, 7])
    a = fmha.flash_attn_varlen_func(q, q, q, cu, cu, 4096, 4096, causal=True)
    b = fmha.flash_attn_varlen_func(q, q, q, cu, cu, 7, 7, causal=True)
    assert torch.equal(a, b)


@pytest.mark.skipif(GPU, reason="host backend only: on a GPU the failed prepare surfaces in the kernels, whose "
                    "reaction (e.g. a device-side trap) would end the CUDA context of the whole test run")
def test_bad_cu_seqlens_raise():
    """cu_seqlens that point past the tensors' rows fail with fmha's message naming the field, and the
    next, valid call works. (cu_seqlens ending before the last row are valid: the rest is ignored.)"""
    q = randn(10, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    k = randn(12, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    good_q, cu_k = cu_seqlens([7, 3]), cu_seqlens([6, 6])
    past_the_rows = torch.tensor([0, 7, 11], dtype=torch.int32, device=DEVICE)
    with pytest.raises(fmha.FmhaError) as info:
        call_or_skip(lambda: fmha.flash_attn_varlen_func(q, k, k, past_the_rows, cu_k, 7, 6), op="fwd",
                     dtype=q.dtype, hdim_q=64, hdim_v=64, masked=False)
    assert "seqstart_q" in info.value.message, info.value
    short = torch.tensor([0, 7, 9], dtype=torch.int32, device=DEVICE)
    out = fmha.flash_attn_varlen_func(q, k, k, short, cu_k, 7, 6)
    out.sum().backward()
    assert torch.isfinite(q.grad[:9]).all()
    q.grad = k.grad = None
    out = fmha.flash_attn_varlen_func(q, k, k, good_q, cu_k, 7, 6)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_launcher_cache_is_bounded(monkeypatch):
    monkeypatch.setenv("FMHA_LAUNCHER_CACHE_SIZE", "2")
    fmha.clear_launcher_cache()
    dtype = torch.bfloat16
    try:
        for s in (9, 10, 11, 12):
            q = randn(1, s, 2, 64, dtype=dtype, requires_grad=True)
            out = call_or_skip(lambda q=q: fmha.flash_attn_func(q, q, q), op="fwd", dtype=dtype, hdim_q=64,
                               hdim_v=64, masked=False)
            call_or_skip(lambda out=out: out.sum().backward(), op="bwd", dtype=dtype, hdim_q=64, hdim_v=64,
                         masked=False)
            assert fmha.launcher_cache_info()["size"] <= 2
        keys = fmha.launcher_cache_info()["keys"]
        q = randn(1, 12, 2, 64, dtype=dtype, requires_grad=True)
        fmha.flash_attn_func(q, q, q).sum().backward()
        assert fmha.launcher_cache_info()["keys"] == keys  # a hit: nothing created, nothing evicted
    finally:
        fmha.clear_launcher_cache()
    assert fmha.launcher_cache_info()["size"] == 0


def test_varlen_steps_with_different_totals_share_one_launcher():
    """Varlen launchers are keyed by power-of-two bounds: steps whose token counts differ reuse one."""
    fmha.clear_launcher_cache()
    dtype = torch.bfloat16
    try:
        for lengths in ([40, 30], [50, 45], [64, 60], [33, 33]):  # totals 65..128, maxima <= 64
            total = sum(lengths)
            q = randn(total, 2, 64, dtype=dtype, requires_grad=True)
            cu = cu_seqlens(lengths)
            out = call_or_skip(lambda: fmha.flash_attn_varlen_func(q, q, q, cu, cu, max(lengths), max(lengths),
                                                                   causal=True),
                               op="fwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True)
            call_or_skip(lambda: out.sum().backward(), op="bwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True)
            assert torch.isfinite(q.grad).all()
        assert fmha.launcher_cache_info()["size"] == 1
    finally:
        fmha.clear_launcher_cache()


def test_concurrent_backward_threads():
    """Threads sharing one cached launcher get the same (deterministic) gradients as a single thread."""
    dtype = torch.float16
    lens = [30, 0, 50]
    cu = cu_seqlens(lens)
    q = randn(80, 4, 64, dtype=dtype, requires_grad=True)
    k = randn(80, 2, 64, dtype=dtype, requires_grad=True)
    v = randn(80, 2, 64, dtype=dtype, requires_grad=True)
    out = call_or_skip(lambda: fmha.flash_attn_varlen_func(q, k, v, cu, cu, 50, 50, causal=True,
                                                           deterministic=True),
                       op="fwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True)
    dout = torch.randn_like(out)
    expect = call_or_skip(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), op="bwd",
                          dtype=dtype, hdim_q=64, hdim_v=64, masked=True, deterministic=True)
    if GPU:
        torch.cuda.synchronize()
    errors = []

    def worker():
        try:
            for _ in range(5):
                o = fmha.flash_attn_varlen_func(q, k, v, cu, cu, 50, 50, causal=True, deterministic=True)
                got = torch.autograd.grad(o, (q, k, v), dout)
                if GPU:
                    torch.cuda.synchronize()
                for a, b in zip(got, expect):
                    if not torch.equal(a, b):
                        errors.append("gradients differ from the single-thread run")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_misaligned_inputs_are_copied_when_kernels_need_alignment(monkeypatch):
    """Where the build's kernels need aligned tensors (registry `vector_bytes`), a misaligned view is copied
    before the call instead of being refused; the results are the same."""
    monkeypatch.setattr(ops, "_vector_bytes_cache", 16)
    dtype = torch.bfloat16
    buf = randn(1 * 20 * 2 * 64 + 1, dtype=dtype)
    q = buf[1:].view(1, 20, 2, 64)  # 2-byte offset: not 16-byte aligned
    assert q.data_ptr() % 16 != 0
    fixed = ops._prepare_input(q)
    assert fixed.data_ptr() % 16 == 0 and torch.equal(fixed, q)
    aligned = ops._prepare_input(q.contiguous())
    assert ops._prepare_input(aligned) is aligned  # nothing to do: no copy
    out = call_or_skip(lambda: fmha.flash_attn_func(q, q, q, causal=True), op="fwd", dtype=dtype, hdim_q=64,
                       hdim_v=64, masked=True)
    assert torch.equal(out, fmha.flash_attn_func(q.contiguous(), q.contiguous(), q.contiguous(), causal=True))


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_repeated_signatures_reuse_the_call_structs_with_new_data(varlen):
    """A second call with the same shapes, strides and options takes the signature's template (the structs
    the first call built and checked) and only sets the data pointers, and on a GPU a backward reuses its
    launcher's workspace (batch mode without preparing it again): the results equal what a cold call (no templates, a new
    launcher and workspace) gives on the same new data, forward and gradients, bit for bit."""
    dtype = torch.bfloat16
    lengths = [7, 0, 12]
    cu = cu_seqlens(lengths)

    def step(seed):
        g = torch.Generator().manual_seed(seed)
        shape = (sum(lengths), 4, 64) if varlen else (2, 19, 4, 64)
        q, k, v = (torch.randn(*shape, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3))
        if varlen:
            out = fmha.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
        else:
            out = fmha.flash_attn_func(q, k, v, causal=True)
        out.backward(torch.randn(out.shape, generator=g).to(DEVICE, dtype))
        return [t.detach().clone() for t in (out, q.grad, k.grad, v.grad)]

    call_or_skip(lambda: step(1), op="bwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True)
    ops._fwd_templates.clear()
    ops._bwd_templates.clear()
    ops.clear_launcher_cache()
    step(2)  # builds the templates
    assert len(ops._fwd_templates) == 1 and len(ops._bwd_templates) == 1
    warm = step(3)  # served by them
    assert len(ops._fwd_templates) == 1 and len(ops._bwd_templates) == 1
    # On a GPU the launcher keeps its workspace (one per stream) for later steps (varlen: prepared again).
    prepared = [len(e.prepared) for e in ops._cache.values()]
    assert prepared == [1 if GPU else 0], prepared
    ops._fwd_templates.clear()
    ops._bwd_templates.clear()
    ops.clear_launcher_cache()  # and a fresh workspace
    cold = step(3)
    for name, a, b in zip(("out", "dq", "dk", "dv"), warm, cold):
        assert torch.equal(a, b), name


def test_calls_that_copy_or_pass_outputs_get_no_template(monkeypatch):
    """A template holds the caller's strides: an input the call had to copy (misaligned for the kernels)
    or an output the caller passed leaves none behind."""
    monkeypatch.setattr(ops, "_vector_bytes_cache", 16)
    ops._fwd_templates.clear()
    buf = randn(20 * 2 * 64 + 1, dtype=torch.bfloat16)
    q = buf[1:].view(1, 20, 2, 64)
    call_or_skip(lambda: ops._fwd(q, q, q), op="fwd", dtype=q.dtype, hdim_q=64, hdim_v=64, masked=False)
    assert len(ops._fwd_templates) == 0
    q = q.clone()  # aligned
    out = torch.empty_like(q)
    ops._fwd(q, q, q, out=out)
    assert len(ops._fwd_templates) == 0
    ops._fwd(q, q, q)
    assert len(ops._fwd_templates) == 1
    # The same signature with a misaligned pointer takes the checked path again (and copies).
    shifted = buf[1:].view(1, 20, 2, 64)
    assert torch.equal(ops._fwd(shifted, shifted, shifted)[0], ops._fwd(q, q, q)[0])


def test_deterministic_backward_of_a_templated_shape_uses_a_deterministic_launcher():
    """The backward's template key holds what the forward's does not: `deterministic` (and the prepare
    method). A deterministic step after non-deterministic ones of the same shapes runs the deterministic
    launcher."""
    q, k, v = (randn(2, 24, 4, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def step(deterministic):
        out = fmha.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        out.backward(torch.ones_like(out))

    call_or_skip(lambda: step(False), op="bwd", dtype=q.dtype, hdim_q=64, hdim_v=64, masked=True)
    ops.clear_launcher_cache()
    step(False)
    step(False)
    step(True)
    traits = [dict(zip([n for n, _ in _lib.fmha_bwd_traits._fields_[1:]], key[1:])) for key in ops._cache]
    assert sorted(t["is_deterministic"] for t in traits) == [0, 1], traits


def _spy_fwd_workspaces(monkeypatch):
    """(address, bytes) of the scheduler workspace of every fmha_fwd call from here on. The C++ autograd
    operator calls fmha_fwd without ctypes, so it is turned off here (test_native_autograd.py covers it)."""
    monkeypatch.setattr(_native, "attention", lambda: None)
    seen = []
    call = _lib.call

    def spy(name, *args):
        if name == "fmha_fwd":
            a = args[1]._obj
            seen.append((a.workspace, a.workspace_size))
        return call(name, *args)

    monkeypatch.setattr(_lib, "call", spy)
    return seen


def test_forward_workspace_size_and_host_calls_pass_none(monkeypatch):
    """fmha_fwd_workspace_size through ctypes: 16 bytes, NULL refused; on the host backend every forward (the
    checked path and the template's) passes no workspace, and on a GPU each passes one of that size."""
    traits = _lib.fmha_fwd_traits(dtype=_lib.DTYPE_BF16, hdim_q=64, hdim_v=64, mask_type=_lib.MASK_BOTTOM_RIGHT)
    size = ctypes.c_size_t()
    _lib.call("fmha_fwd_workspace_size", ctypes.byref(traits), ctypes.byref(size))
    assert size.value == 16
    with pytest.raises(fmha.FmhaError) as info:
        _lib.call("fmha_fwd_workspace_size", ctypes.byref(traits), None)
    assert info.value.status == fmha.ERR_NULL_POINTER and "bytes" in info.value.message
    bad = _lib.fmha_fwd_traits(dtype=_lib.DTYPE_BF16, hdim_q=0, hdim_v=64)
    with pytest.raises(fmha.FmhaError) as info:
        _lib.call("fmha_fwd_workspace_size", ctypes.byref(bad), ctypes.byref(size))
    assert info.value.status == fmha.ERR_INVALID_ARGUMENT and "hdim_q" in info.value.message

    seen = _spy_fwd_workspaces(monkeypatch)
    q = randn(2, 24, 4, 64, dtype=torch.bfloat16)
    ops._fwd_templates.clear()
    call_or_skip(lambda: fmha.flash_attn_func(q, q, q, causal=True), op="fwd", dtype=q.dtype, hdim_q=64, hdim_v=64,
                 masked=True)
    fmha.flash_attn_func(q, q, q, causal=True)  # the template's path
    cu = cu_seqlens([24, 24])
    flat = q.reshape(48, 4, 64)
    fmha.flash_attn_varlen_func(flat, flat, flat, cu, cu, 24, 24, causal=True)
    assert len(seen) == 3 and len(ops._fwd_templates) >= 1
    if HOST:
        assert seen == [(None, 0)] * 3, seen
    else:
        assert all(address and address % 16 == 0 and n == 16 for address, n in seen), seen


@pytest.mark.skipif(HOST, reason="the scheduler workspace is passed on a GPU only")
def test_forward_workspace_per_stream_thread_and_captured_call(monkeypatch):
    """Eager forwards reuse one cached workspace per (stream, thread): no allocation per call, another on
    another stream or thread. A CUDA graph's captured calls get fresh ones (graphs may replay concurrently),
    and a replay gives the eager call's bits."""
    seen = _spy_fwd_workspaces(monkeypatch)
    q, k, v = (randn(2, 40, 4, 64, dtype=torch.bfloat16) for _ in range(3))

    def call():
        return fmha.flash_attn_func(q, k, v, causal=True)

    eager = call_or_skip(call, op="fwd", dtype=q.dtype, hdim_q=64, hdim_v=64, masked=True)
    call()
    main = seen[-1][0]
    assert seen[-2][0] == main
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
        call()
    torch.cuda.current_stream().wait_stream(side)
    assert seen[-1][0] == seen[-2][0] != main
    other = []
    thread = threading.Thread(target=lambda: (call(), other.append(seen[-1][0])))
    thread.start()
    thread.join()
    assert other and other[0] not in (main, seen[-3][0])
    cached = len(ops._scheduler_workspaces)

    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    outs = []
    for graph in graphs:  # both captured on torch.cuda.graph's one capture stream
        with torch.cuda.graph(graph):
            outs.append(call())
    captured = [address for address, _ in seen[-2:]]
    assert len(set(captured)) == 2 and not set(captured) & {main, seen[-5][0], other[0]}, (captured, main)
    assert len(ops._scheduler_workspaces) == cached  # nothing cached for the graphs
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, eager)
