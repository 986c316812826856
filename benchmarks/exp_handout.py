"""Experiment: the CuTe backward's chains handed out from a counter, against the placed lists.

Rows per cell (bf16, d = 128, 16 heads, causal, the cells of ``bench_features.py``):
``placed`` and ``handout``, the schedule made for the cell (``lpt`` on packed batches,
``banded`` on windows) run as placed and handed out in launch order
(``dash_cuda.backends.cute.launch.handing_out``; both on the general path, no plan), and
FlashAttention-4 with and without ``deterministic=True``. Backward only: ``torch.autograd.grad``
of one forward's output, eager calls, interleaved rounds (``harness.interleaved_rounds``).
Before timing, the two hand-outs' dQ, dK, dV are compared bit for bit (``torch.equal``)::

    python benchmarks/exp_handout.py --out OUT

Writes ``exp_handout.json`` and ``exp_handout.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench_features import HEAD_DIM, HEADS, _fa4_varlen, _leaves, _randn, fa4_rows
from harness import environment, grad_row, interleaved_rounds, no_cuda, provenance, save_report
from model_varlen import lengths

CELLS = ([{"kind": "varlen", "total": t, "mix": m} for t, m in
          ((16384, "heavy"), (65536, "heavy"), (16384, "uniform"), (65536, "uniform"),
           (16384, "equal"))]
         + [{"kind": "window", "seqlen": s, "batch": 16384 // s, "window": w}
            for s, w in ((8192, 1024), (8192, 4096), (16384, 1024), (16384, 4096))])


def name(cell: dict) -> str:
    if cell["kind"] == "varlen":
        return f"varlen {cell['mix']} {cell['total'] // 1024}k"
    return f"window {cell['window']} S={cell['seqlen']}"


def rows(cell: dict, gen) -> tuple[dict, dict]:
    """``({row: bwd}, {row: grads of one call}``)."""
    import torch

    import dash_cuda
    from dash_cuda.backends.cute.launch import handing_out

    fa, fa_varlen = _fa4_varlen()
    if cell["kind"] == "varlen":
        seqlens = lengths(cell["mix"], cell["total"])
        cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32,
                          device="cuda")
        longest = max(seqlens)
        q, k, v, do = (_randn(gen, cell["total"], HEADS, HEAD_DIM) for _ in range(4))
        schedule = "lpt"

        def ours(x):
            return dash_cuda.attention_varlen(*x, cu, cu, longest, longest, causal=True,
                                              schedule=schedule, backend="cute")

        def peer(*x, det):
            return fa_varlen(*x, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                             max_seqlen_k=longest, causal=True, deterministic=det)
    else:
        w = cell["window"]
        q, k, v, do = (_randn(gen, cell["batch"], cell["seqlen"], HEADS, HEAD_DIM)
                       for _ in range(4))
        schedule = "banded"

        def ours(x):
            return dash_cuda.attention(*x, causal=True, window_size=(w, 0),
                                       schedule=schedule, backend="cute")

        def peer(*x, det):
            return fa(*x, causal=True, window_size=(w, None), deterministic=det)

    out, grads = {}, {}
    for row, on in (("placed", False), ("handout", True)):
        x = _leaves(q, k, v)
        with handing_out(on):
            _, bwd = grad_row(lambda x=x: ours(x), x, do)
            grads[row] = bwd()

        def timed(bwd=bwd, on=on):
            with handing_out(on):
                return bwd()
        out[row] = timed
    if fa is not None:
        out.update({r: f[1] for r, f in fa4_rows(peer, (q, k, v), do).items()})
    return out, grads


def run(args) -> dict:
    import torch

    report = {**provenance("exp_handout.py", args.argv), "environment": environment(args),
              "cells": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    start = time.monotonic()
    for cell in CELLS:
        if time.monotonic() - start > args.time_budget:
            print(f"time budget spent: {name(cell)} and later cells left out")
            break
        bwds, grads = rows(cell, gen)
        cell["bits_equal"] = all(torch.equal(a, b)
                                 for a, b in zip(grads["placed"], grads["handout"]))
        for bwd in bwds.values():
            for _ in range(args.warmup):
                bwd()
        torch.cuda.synchronize()
        cell["ms"] = interleaved_rounds(bwds, args.rounds, args.reps)
        cell["median_ms"] = {r: round(statistics.median(t), 4) for r, t in cell["ms"].items()}
        print(f"{name(cell)}: bits equal {cell['bits_equal']}, {cell['median_ms']}",
              flush=True)
        report["cells"].append(cell)
    return report


def ratio(cell: dict, ours: str, peer: str) -> str:
    ms = cell["ms"]
    if ours not in ms or peer not in ms:
        return "-"
    values = [p / o for o, p in zip(ms[ours], ms[peer])]
    return f"{statistics.median(values):.3f} ({min(values):.3f} - {max(values):.3f})"


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = ["# The backward's chains handed out from a counter, against the placed lists", "",
             f"`{report['command']}` at `{report['git_revision']}`, {env['gpu']}, "
             f"torch {env['torch']}. "
             "bf16, d = 128, 16 heads, causal; backward only (`torch.autograd.grad` of one "
             "forward's output), eager calls, interleaved rounds; ratios within a round, "
             "median (range). `placed`: the schedule made for the cell (`lpt` packed, "
             "`banded` windows) as placed; `handout`: the same tables, each CTA taking its "
             "next chain in launch order from a counter.", "",
             "| cell | ms (median) | placed / handout | fa4-det / handout | fa4-det / placed "
             "| fa4 / handout | bits equal |", "|---|---|---|---|---|---|---|"]
    for cell in report["cells"]:
        ms = ", ".join(f"{r} {t:.3f}" for r, t in cell["median_ms"].items())
        lines.append(f"| {name(cell)} | {ms} | {ratio(cell, 'handout', 'placed')} | "
                     f"{ratio(cell, 'handout', 'fa4-det')} | {ratio(cell, 'placed', 'fa4-det')} "
                     f"| {ratio(cell, 'handout', 'fa4')} | {cell['bits_equal']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--time-budget", type=float, default=240.0)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if no_cuda("exp_handout"):
        return 2
    report = run(args)
    out = Path(args.out)
    save_report(out, "exp_handout", report, markdown(report))
    return 0 if all(c["bits_equal"] for c in report["cells"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
