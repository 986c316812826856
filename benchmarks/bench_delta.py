"""What the pairwise ``D`` costs the CuTe backward: the whole call with each ``D`` order.

The CuTe backend's default arithmetic takes ``D = rowsum(dO * O)`` as the pairwise tree
that ``dash_ref`` reproduces (``dash_ref.arithmetic.steps.FAST``); before, it took ``D``
from ``tl.sum``, whose order and contractions have no CPU counterpart. For every cell of
the grid (bf16, 16384 tokens, hidden 2048, both masks, ``auto``'s schedule) this times the
whole backward call with each ``D`` (CUDA-graph replays, interleaved rounds, best median
of each) and the ``D`` kernel alone, and reports ``pairwise / tl.sum`` time ratios::

    python benchmarks/bench_delta.py --out OUT

Writes ``bench_delta.json`` and ``bench_delta.md``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from harness import (
    HEAD_DIMS,
    SEQLENS,
    cute_backward_tiles,
    environment,
    grid_inputs,
    interleaved_rounds,
    no_cuda,
    provenance,
    replayable,
    save_report,
)


def run(args) -> dict:
    import torch

    import dash_cuda
    from dash_cuda import prepost

    pairwise_delta = prepost.preprocess_delta

    def tl_sum_delta(o, do, block_m, pairwise=False):
        return pairwise_delta(o, do, block_m, False)

    def backward_with(delta_fn, q, k, v, o, lse, do, causal):
        def call():
            prepost.preprocess_delta = delta_fn
            try:
                return dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                                    backend="cute")
            finally:
                prepost.preprocess_delta = pairwise_delta
        return call

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d in HEAD_DIMS:
        for causal in (False, True):
            for s in SEQLENS:
                q, k, v, do = grid_inputs(d, s, gen)
                block_m = cute_backward_tiles(d, "causal" if causal else "full").block_m
                o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend="cute")
                runs, modes = {}, {}
                for name, fn in (("pairwise", pairwise_delta), ("tl.sum", tl_sum_delta)):
                    runs[name], modes[name] = replayable(
                        backward_with(fn, q, k, v, o, lse, do, causal), args.warmup)
                    runs[f"D {name}"], _ = replayable(
                        functools.partial(fn, o, do, block_m, True), args.warmup)
                ms = {name: min(times) for name, times in
                      interleaved_rounds(runs, args.rounds, args.reps).items()}
                row = {"d": d, "mask": "causal" if causal else "full", "seqlen": s,
                       "ms": ms, "modes": modes,
                       "ratio": ms["pairwise"] / ms["tl.sum"]}
                rows.append(row)
                print(f"d={d} {row['mask']:<6} S={s:<5} backward pairwise {ms['pairwise']:.3f} "
                      f"ms, tl.sum {ms['tl.sum']:.3f} ms (x{row['ratio']:.3f}); D alone "
                      f"{ms['D pairwise'] * 1e3:.1f} / {ms['D tl.sum'] * 1e3:.1f} us", flush=True)
    return {"environment": environment(args), **provenance("bench_delta.py", args.argv),
            "rows": rows}


def markdown(report: dict) -> str:
    lines = ["# The pairwise D in the CuTe backward", "",
             f"`{report['command']}` at git `{report['git_revision']}` on "
             f"{report['environment'].get('gpu', 'the GPU')}: the whole backward call "
             "(`auto`, bf16, 16384 tokens, hidden 2048) with `D` as the pairwise tree (the "
             "default, reproduced by `dash_ref`) and as `tl.sum` (before), CUDA-graph replays "
             "in interleaved rounds, the best median of each; and the `D` kernel alone.", "",
             "| d | mask | S | backward, pairwise (ms) | backward, tl.sum (ms) | ratio | "
             "D pairwise (us) | D tl.sum (us) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["rows"]:
        ms = r["ms"]
        lines.append(f"| {r['d']} | {r['mask']} | {r['seqlen']} | {ms['pairwise']:.3f} | "
                     f"{ms['tl.sum']:.3f} | {r['ratio']:.3f} | {ms['D pairwise'] * 1e3:.1f} | "
                     f"{ms['D tl.sum'] * 1e3:.1f} |")
    ratios = [r["ratio"] for r in report["rows"]]
    lines += ["", f"Ratio (pairwise / tl.sum) {min(ratios):.3f} - {max(ratios):.3f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    if no_cuda("bench_delta"):
        return 2
    report = run(args)
    save_report(args.out, "bench_delta", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
