#!/usr/bin/env python3
"""TFLOPS against sequence length, one line per implementation, one panel per (pass, head dim, mask): the
FlashAttention README's figures, from an `fmha-bench` JSON and (optionally) a `bench/attention.py` JSON
of the same run for the rivals (FlashAttention-3's forward where installed, PyTorch SDPA's flash =
FlashAttention-2, and cuDNN).

    python3 bench/plot.py --fmha full.json [--rivals bench-attention.json] --out docs/perf/full.png
    python3 bench/plot.py --rivals bench-attention.json --out docs/perf/run.png   # fmha's line from it too

Only the FlashAttention grid's shapes are drawn (batch · seqlen = 16k tokens, nhead_q = nhead_k,
seqlen_q = seqlen_k, batch mode, non-deterministic): fmha-bench's mask "0" is "no mask" and "b"
(bottom-right causal) is "causal", which on a square problem is SDPA's causal too.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RIVALS = {"fa3": "FlashAttention-3", "sdpa_flash": "FlashAttention-2 (SDPA flash)", "sdpa_cudnn": "cuDNN (SDPA)"}
# One colour per implementation in every panel (a panel without FA3 keeps the others' colours).
COLORS = dict(zip(["fmha", *RIVALS.values()], ["tab:blue", "tab:orange", "tab:green", "tab:red"]))


def fmha_points(report):
    """{(pass, (hdim_q, hdim_v), causal): {"fmha": [(seqlen, tflops)]}} from fmha-bench rows."""
    points = defaultdict(lambda: defaultdict(list))
    for r in report["rows"]:
        square = r["seqlen_q"] == r["seqlen_k"] and r["nhead_q"] == r["nhead_k"]
        grid = r["batch"] * r["seqlen_q"] == 16384 and not r["varlen"] and not r["deterministic"]
        if r["op"] not in ("fwd", "bwd") or r["dtype"] not in ("bf16", "fp16") or not (square and grid):
            continue
        if r["status"] != "ok" or r["mask"] not in ("0", "b"):
            continue
        points[(r["op"], (r["hdim_q"], r["hdim_v"]), r["mask"] == "b")]["fmha"].append((r["seqlen_q"], r["tflops"]))
    return points


def add_rivals(points, bench, with_fmha):
    """The rivals' lines from a bench/attention.py JSON (and fmha's, `with_fmha`)."""
    labels = {"fmha": "fmha", **RIVALS} if with_fmha else RIVALS
    for row in bench["rows"]:
        sh = row["shape"]
        if sh.get("varlen_lengths") or sh["nhead_q"] != sh["nhead_k"] or sh["batch"] * sh["seqlen"] != 16384:
            continue
        key = (row["pass"], (sh["head_dim"], sh.get("head_dim_v", sh["head_dim"])), sh["causal"])
        for impl, label in labels.items():
            res = row["results"].get(impl, {})
            if "tflops" in res:
                points[key][label].append((sh["seqlen"], res["tflops"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fmha", help="fmha-bench --json output (without it, fmha's line is --rivals' fmha column)")
    ap.add_argument("--rivals", help="bench/attention.py's bench-attention.json from the same run")
    ap.add_argument("--title", default=None, help="figure title (default: from the JSON)")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args()
    if not (args.fmha or args.rivals):
        raise SystemExit("plot.py: give --fmha, --rivals or both")
    points, title = defaultdict(lambda: defaultdict(list)), args.title
    if args.fmha:
        with open(args.fmha) as f:
            report = json.load(f)
        points = fmha_points(report)
        title = args.title or f"fmha {report['fmha_version']} ({report['backend']}), matrix {report['matrix']}"
    if args.rivals:
        with open(args.rivals) as f:
            bench = json.load(f)
        add_rivals(points, bench, with_fmha=not args.fmha)
        meta = bench.get("meta", {})
        title = args.title or f"{meta.get('gpu', '')} · {meta.get('date', '')} · {meta.get('dtype', '')}"
    panels = sorted(points)
    if not panels:
        raise SystemExit("plot.py: no rows of the FlashAttention grid in the input")
    # Each pass's panels (head dims × masks) in rows of at most four.
    order = sorted({(d, c) for _, d, c in panels})
    directions = sorted({p for p, _, _ in panels}, key=lambda p: p != "fwd")
    cols = min(4, len(order))
    per_pass = -(-len(order) // cols)
    fig, axes = plt.subplots(per_pass * len(directions), cols, figsize=(4.2 * cols, 3.4 * per_pass * len(directions)),
                             squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for k, direction in enumerate(directions):
        for i, (d, causal) in enumerate(order):
            ax = axes[k * per_pass + i // cols][i % cols]
            ax.set_visible(True)
            lines = points.get((direction, d, causal), {})
            for label, pts in sorted(lines.items(), key=lambda kv: kv[0] != "fmha"):
                pts = sorted(pts)
                ax.plot([s for s, _ in pts], [t for _, t in pts], marker="o", label=label, color=COLORS.get(label),
                        linewidth=2.4 if label == "fmha" else 1.4)
            ax.set_xscale("log", base=2)
            dims = str(d[0]) if d[0] == d[1] else f"{d[0]}/{d[1]}"
            ax.set_title(f"{direction}, D = {dims}, {'causal' if causal else 'no mask'}", fontsize=10)
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOPS")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
