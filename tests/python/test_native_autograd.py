"""The C++ autograd operator (fmha/_native.py, csrc/native_autograd.cpp).

From the third call of a plan key on (ops._plan_key), the attention functions go through
``torch.ops.fmha.attention``, whose backward node is C++. These tests check that it is taken, that its results
follow the field's rule against the float64 reference, that they equal the Python path's (same kernels: the
forward bitwise, the deterministic backward bitwise), and that it keeps autograd's contracts: saved tensors
modified in place are refused, any dO layout is read, streams other than the default get their own workspace,
CUDA graphs capture it, varlen steps of other token counts share a plan.

Runs where the operator is built for the running PyTorch and the build is a GPU one (``fmha.native_autograd()``
says which), e.g. ``FMHA_NATIVE_AUTOGRAD=.devbuild/native_autograd-<torch>.so`` on the GPU machine.
"""

import pytest
import torch
from attn_ref import (
    FLOOR_GRAD,
    check_rule,
    cu_seqlens,
    default_scale,
    flash_mask,
    randn,
)
from test_backward import reference_grads

import fmha
from fmha import _native, ops

pytestmark = pytest.mark.skipif(_native.attention() is None, reason=f"C++ autograd operator: {_native.status()}")

CASES = {
    "batch-causal-gqa": dict(varlen=None, heads=(8, 2), causal=True, window=(-1, -1), dims=(128, 128)),
    "batch-window-d64": dict(varlen=None, heads=(4, 4), causal=False, window=(64, 16), dims=(64, 64)),
    "batch-none-mqa-d256": dict(varlen=None, heads=(4, 1), causal=False, window=(-1, -1), dims=(256, 256)),
    "varlen-causal-gqa": dict(varlen=([0, 17, 300, 1, 128], [5, 40, 300, 0, 200]), heads=(8, 2), causal=True,
                              window=(-1, -1), dims=(128, 128)),
    "varlen-window-d192x128": dict(varlen=([64, 0, 129], [64, 77, 300]), heads=(4, 2), causal=False,
                                   window=(30, 70), dims=(192, 128)),
}


def _inputs(case, dtype):
    hq, hk = case["heads"]
    d, dv = case["dims"]
    if case["varlen"]:
        lens_q, lens_k = case["varlen"]
        q, k, v = randn(sum(lens_q), hq, d, dtype=dtype), randn(sum(lens_k), hk, d, dtype=dtype), randn(
            sum(lens_k), hk, dv, dtype=dtype)
        vl = (cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k))
    else:
        q, k, v = randn(2, 200, hq, d, dtype=dtype), randn(2, 333, hk, d, dtype=dtype), randn(2, 333, hk, dv,
                                                                                             dtype=dtype)
        vl = None
    return [t.requires_grad_() for t in (q, k, v)], vl


def _call(case, q, k, v, vl, deterministic):
    kw = dict(causal=case["causal"], window_size=case["window"], deterministic=deterministic)
    if vl:
        return fmha.flash_attn_varlen_func(q, k, v, *vl, **kw)
    return fmha.flash_attn_func(q, k, v, **kw)


def _python_path(case, q, k, v, vl, deterministic):
    """The same call through the Python autograd Function."""
    bounds = (vl[2], vl[3]) if vl else (q.shape[1], k.shape[1])
    mask_type, left, right = ops._flash_mask(case["causal"], case["window"], *bounds)
    cu_q, cu_k, max_q, max_k = vl or (None,) * 4
    return ops.FmhaAttnFunc.apply(q, k, v, cu_q, cu_k, max_q, max_k, None, mask_type, left, right, deterministic,
                                  False)


def _native_call(case, dtype, deterministic):
    """Fresh inputs of the case's shapes, the call made until it takes the operator; (q, k, v, vl, out)."""
    for _ in range(3):
        (q, k, v), vl = _inputs(case, dtype)
        out = _call(case, q, k, v, vl, deterministic)
    assert "Attention" in out.grad_fn.name(), f"the third call did not take the operator: {out.grad_fn.name()}"
    return q, k, v, vl, out


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_against_reference_and_python_path(dtype, case, deterministic):
    c = CASES[case]
    q, k, v, vl, out = _native_call(c, dtype, deterministic)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    resolved = flash_mask(c["causal"], c["window"])
    scale = default_scale(q.shape[-1])
    varlen = vl and (vl[0], vl[1], vl[2], vl[3])
    refs = reference_grads(q, k, v, dout, resolved, scale, varlen, upcast=True)
    pts = reference_grads(q, k, v, dout, resolved, scale, varlen, upcast=False)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
        check_rule(name, g, r, p, 3, FLOOR_GRAD)

    py_out = _python_path(c, q, k, v, vl, deterministic)
    assert py_out.grad_fn.name().startswith("FmhaAttnFunc")
    assert torch.equal(out, py_out), "the operator's forward differs from the Python path's"
    py_grads = torch.autograd.grad(py_out, (q, k, v), dout)
    for name, a, b in zip(("dq", "dk", "dv"), grads, py_grads):
        if deterministic:
            assert torch.equal(a, b), f"{name}: the operator's deterministic backward differs from the Python path's"
    for name, g, r, p in zip(("dq", "dk", "dv"), py_grads, refs, pts):
        check_rule(name + " (Python path)", g, r, p, 3, FLOOR_GRAD)


def test_modified_saved_tensor_is_refused():
    c = CASES["batch-causal-gqa"]
    q, k, v, vl, out = _native_call(c, torch.bfloat16, False)
    with torch.no_grad():
        k.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_any_dout_layout():
    """dO transposed in memory, in another dtype: read as the Python path reads it (deterministic: bitwise)."""
    c = CASES["batch-window-d64"]
    q, k, v, vl, out = _native_call(c, torch.bfloat16, True)
    dout = torch.randn(out.shape[::-1], device=out.device, dtype=torch.float32).permute(3, 2, 1, 0)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    expected = torch.autograd.grad(out, (q, k, v), dout.to(out.dtype).contiguous())
    for name, a, b in zip(("dq", "dk", "dv"), grads, expected):
        assert torch.equal(a, b), f"{name} differs between a strided fp32 dO and its contiguous bf16 copy"


def test_side_stream_and_lse():
    """On a side stream (its own backward workspace), with the LSE returned: same results as on the default."""
    c = CASES["varlen-causal-gqa"]
    q, k, v, vl, out = _native_call(c, torch.float16, True)
    dout = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), dout)
    out = out.detach()  # the graph (and its gradient accumulators, made on the default stream) goes
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out2, lse, _ = fmha.flash_attn_varlen_func(q, k, v, *vl, causal=True, deterministic=True,
                                                   return_attn_probs=True)
        assert "Attention" in out2.grad_fn.name()
        assert lse.grad_fn is None and not lse.requires_grad
        grads = torch.autograd.grad(out2, (q, k, v), dout)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out2, out)
    for name, a, b in zip(("dq", "dk", "dv"), grads, expected):
        assert torch.equal(a, b), f"{name} differs between the side stream and the default stream"


def test_status_names_the_build():
    assert fmha.native_autograd().startswith("in use")


def test_captured_in_a_cuda_graph():
    """Forward calls captured in CUDA graphs (inference: no grad) replay to the eager call's bits; each capture
    takes its own scheduler workspace (the operator's call temporary, from the graph's private pool)."""
    c = CASES["batch-causal-gqa"]
    q, k, v, vl, _ = _native_call(c, torch.bfloat16, False)
    with torch.no_grad():
        eager = _call(c, q, k, v, vl, False)
        graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
        outs = []
        for graph in graphs:
            with torch.cuda.graph(graph):
                outs.append(_call(c, q, k, v, vl, False))
        for graph in graphs:
            graph.replay()
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, eager)


def test_plans_released_while_a_graph_holds_one():
    """clear_launcher_cache() drops Python's plans; a graph recorded with one keeps it for its backward, and
    the next calls build the plan again. An id that names no plan is refused by name."""
    c = CASES["batch-causal-gqa"]
    q, k, v, vl, out = _native_call(c, torch.float16, True)
    expected = _python_path(c, q, k, v, vl, True)
    dout = torch.randn_like(out)
    fmha.clear_launcher_cache()
    assert not ops._plans
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, a, b in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(expected, (q, k, v), dout)):
        assert torch.equal(a, b), name
    _native_call(c, torch.float16, True)
    with pytest.raises(RuntimeError, match="plan -1 does not exist"):
        _native.attention()(q, k, v, None, None, 0, 0, -1)


def test_varlen_steps_with_other_token_counts_share_a_plan():
    """Varlen steps whose token counts and maxima differ share a plan while they stay in its power-of-two
    buckets (totals 129-256, maxima 65-128 here); a step past them takes the Python path and starts a new key."""
    steps = [
        ([100, 0, 60], [100, 30, 90]),
        ([80, 40, 20], [90, 60, 30]),
        ([128, 72, 0], [120, 7, 50]),
        ([120, 10, 120], [110, 0, 90]),
        ([128, 128, 44], [110, 0, 90]),  # q total 300: past the bucket
    ]
    dtype = torch.bfloat16
    fmha.clear_launcher_cache()  # no plan of an earlier test
    for i, (lens_q, lens_k) in enumerate(steps):
        q, k, v = (randn(sum(n), 4, 64, dtype=dtype, requires_grad=True) for n in (lens_q, lens_k, lens_k))
        vl = (cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k))
        out = fmha.flash_attn_varlen_func(q, k, v, *vl, causal=True, deterministic=True)
        native = "Attention" in out.grad_fn.name()
        assert native == (i in (2, 3)), f"step {i}: {out.grad_fn.name()}"
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        case = dict(causal=True, window=(-1, -1))
        py_out = _python_path(case, q, k, v, vl, True)
        assert torch.equal(out, py_out), f"step {i}: out"
        for name, a, b in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(py_out, (q, k, v), dout)):
            assert torch.equal(a, b), f"step {i}: {name}"
        refs = reference_grads(q, k, v, dout, flash_mask(True, (-1, -1)), default_scale(64), vl, upcast=True)
        pts = reference_grads(q, k, v, dout, flash_mask(True, (-1, -1)), default_scale(64), vl, upcast=False)
        for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
            check_rule(f"step {i}: {name}", g, r, p, 3, FLOOR_GRAD)
