#!/usr/bin/env python3
"""TFLOPS against sequence length, one line per implementation, one panel per (pass, head dim, mask): the
FlashAttention README's figures, from an `fmha-bench` JSON and (optionally) a `bench/attention.py` JSON
of the same run for the rivals (FlashAttention-3's forward where installed, PyTorch SDPA's flash =
FlashAttention-2, and cuDNN).

    python3 bench/plot.py --fmha full.json [--rivals bench-attention.json] --out docs/perf/full.png

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
    """{(pass, head_dim, causal): {"fmha": [(seqlen, tflops)]}} from fmha-bench rows."""
    points = defaultdict(lambda: defaultdict(list))
    for r in report["rows"]:
        square = r["seqlen_q"] == r["seqlen_k"] and r["nhead_q"] == r["nhead_k"] and r["hdim_q"] == r["hdim_v"]
        grid = r["batch"] * r["seqlen_q"] == 16384 and not r["varlen"] and not r["deterministic"]
        if r["op"] not in ("fwd", "bwd") or r["dtype"] not in ("bf16", "fp16") or not (square and grid):
            continue
        if r["status"] != "ok" or r["mask"] not in ("0", "b"):
            continue
        points[(r["op"], r["hdim_q"], r["mask"] == "b")]["fmha"].append((r["seqlen_q"], r["tflops"]))
    return points


def add_rivals(points, bench):
    for row in bench["rows"]:
        sh = row["shape"]
        if sh.get("varlen_lengths") or sh["nhead_q"] != sh["nhead_k"] or sh["batch"] * sh["seqlen"] != 16384:
            continue
        key = (row["pass"], sh["head_dim"], sh["causal"])
        for impl, label in RIVALS.items():
            res = row["results"].get(impl, {})
            if "tflops" in res:
                points[key][label].append((sh["seqlen"], res["tflops"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fmha", required=True, help="fmha-bench --json output")
    ap.add_argument("--rivals", help="bench/attention.py's bench-attention.json from the same run")
    ap.add_argument("--title", default=None, help="figure title (default: from the JSON)")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args()
    with open(args.fmha) as f:
        report = json.load(f)
    points = fmha_points(report)
    title = args.title or f"fmha {report['fmha_version']} ({report['backend']}), matrix {report['matrix']}"
    if args.rivals:
        with open(args.rivals) as f:
            bench = json.load(f)
        add_rivals(points, bench)
        meta = bench.get("meta", {})
        title = args.title or f"{meta.get('gpu', '')} · {meta.get('date', '')} · {meta.get('dtype', '')}"
    panels = sorted(points)
    if not panels:
        raise SystemExit("plot.py: no rows of the FlashAttention grid in the input")
    cols = max(1, len({(d, c) for _, d, c in panels}))
    rows = len({p for p, _, _ in panels})
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    order = sorted({(d, c) for _, d, c in panels})
    for ax_row, direction in zip(axes, sorted({p for p, _, _ in panels}, key=lambda p: p != "fwd")):
        for ax, (d, causal) in zip(ax_row, order):
            lines = points.get((direction, d, causal), {})
            for label, pts in sorted(lines.items(), key=lambda kv: kv[0] != "fmha"):
                pts = sorted(pts)
                ax.plot([s for s, _ in pts], [t for _, t in pts], marker="o", label=label, color=COLORS.get(label),
                        linewidth=2.4 if label == "fmha" else 1.4)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{direction}, D = {d}, {'causal' if causal else 'no mask'}", fontsize=10)
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
