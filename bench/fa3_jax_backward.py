#!/usr/bin/env python3
"""FlashAttention-3's backward through JAX (flash-attn3-jax), timed and checked in a process of its own.

bench/attention.py runs this as a subprocess (XLA keeps its own stream and memory pool, so it stays out of
the PyTorch process): the shapes come as JSON on stdin, a list of {"name", "b", "s", "h", "d", "causal"}
(batch mode, [b, s, h, d] bf16 or fp16, Sq = Sk), with optional "hk" (KV heads, GQA) and "lengths" (varlen:
the sequences' lengths, packed [sum, h, d] through flash_mha_varlen; b and s are then ignored); the result
goes to stdout as JSON, one entry per name: {"ms": median milliseconds of the jitted vjp (the backward
alone), "rel_diff": max |FA3 - reference| / max |reference| over dQ, dK, dV} or {"unsupported"/"error":
why}. The reference is JAX's own dot_product_attention (cuDNN's fused kernel, else XLA's) on the same
inputs, sequence by sequence for varlen.

Timing: XLA dispatches asynchronously, so each timed sample queues `--calls` backward calls and waits
once (block_until_ready): the host's dispatch overlaps the device work, as PyTorch's event timing of a
stream does. The figure is the median over the samples.

Usage: echo '[{"name": "x", "b": 2, "s": 8192, "h": 16, "d": 128, "causal": true}]' |
       XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/fa3_jax_backward.py [--dtype bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--samples", type=int, default=7, help="timed samples (median)")
    ap.add_argument("--calls", type=int, default=10, help="backward calls per timed sample")
    args = ap.parse_args()
    shapes = json.load(sys.stdin)
    try:
        import jax
        import jax.numpy as jnp
        from flash_attn3_jax import flash_mha, flash_mha_varlen
    except ImportError as e:
        json.dump({sh["name"]: {"unsupported": f"flash-attn3-jax is not installed ({e})"} for sh in shapes}, sys.stdout)
        return
    dtype = {"bf16": jnp.bfloat16, "fp16": jnp.float16}[args.dtype]
    out = {}
    for sh in shapes:
        name = sh["name"]
        if sh["d"] != 128:
            out[name] = {"unsupported": "flash-attn3-jax's backward is built for head dim 128 only"}
            continue
        try:
            out[name] = measure(jax, jnp, (flash_mha, flash_mha_varlen), sh, dtype, args)
        except Exception as e:  # noqa: BLE001 - one failing shape must not end the run
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        jax.clear_caches()
    json.dump(out, sys.stdout)


def measure(jax, jnp, kernels, sh, dtype, args):
    flash_mha, flash_mha_varlen = kernels
    h, d, causal = sh["h"], sh["d"], sh["causal"]
    hk, lengths = sh.get("hk", h), sh.get("lengths")
    keys = jax.random.split(jax.random.PRNGKey(1234), 4)
    rows = (sum(lengths),) if lengths else (sh["b"], sh["s"])
    q, g = (jax.random.normal(key, (*rows, h, d), dtype=jnp.float32).astype(dtype) for key in keys[::3])
    k, v = (jax.random.normal(key, (*rows, hk, d), dtype=jnp.float32).astype(dtype) for key in keys[1:3])
    scale = d**-0.5

    def attention(q, k, v):
        try:
            return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal, implementation="cudnn")
        except Exception:  # noqa: BLE001 - no cuDNN path for this shape: XLA's
            return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal)

    if lengths:
        starts = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        cu = jnp.array(starts, dtype=jnp.int32)

        def fa3(q, k, v):
            return flash_mha_varlen(q, k, v, cu, cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths),
                                    softmax_scale=scale, is_causal=causal)

        def reference(q, k, v):
            # each sequence alone ([1, len, h, d]), packed back
            return jnp.concatenate([attention(*(x[None, a:e] for x in (q, k, v)))[0]
                                    for a, e in zip(starts, starts[1:])])
    else:

        def fa3(q, k, v):
            return flash_mha(q, k, v, softmax_scale=scale, is_causal=causal)

        reference = attention

    _, vjp_fn = jax.vjp(fa3, q, k, v)
    backward = jax.jit(vjp_fn)
    grads = jax.block_until_ready(backward(g))
    _, ref_vjp = jax.vjp(reference, q, k, v)
    ref = jax.block_until_ready(jax.jit(ref_vjp)(g))
    diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32)))) for a, r in zip(grads, ref))
    scale_ref = max(float(jnp.max(jnp.abs(r.astype(jnp.float32)))) for r in ref)
    del ref, ref_vjp
    for _ in range(3):
        jax.block_until_ready(backward(g))
    samples = []
    for _ in range(args.samples):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            grads = backward(g)
        jax.block_until_ready(grads)
        samples.append((time.perf_counter() - t0) * 1e3 / args.calls)
    return {"ms": statistics.median(samples), "rel_diff": diff / max(scale_ref, 1e-30), "max_abs_diff": diff}


if __name__ == "__main__":
    main()
