"""What ``exact=True`` costs: backward TFLOP/s of the default and the exact arithmetic.

The grid and timing of ``harness.py`` (16384 tokens, hidden 2048, bf16, full and
causal masks, CUDA-graph replays, median of ``--reps``), on the schedule ``auto`` picks for
each cell. The two arithmetics are timed alternately in one process (default, exact,
default, exact) and each gets the better of its two medians, so drift between them does
not pass for a cost. The ``D`` preprocess is also timed alone in both orders (the rest of
the difference is the software ``exp2``: the exact backward kernel's SASS differs from the
default's only there, ``tests/test_exact_asm.py``). Each cell also checks that two exact
runs give the same bits.

Writes ``exact_cost.json`` and ``exact_cost.md`` under ``--out``::

    PYTHONPATH=. python benchmarks/bench_exact.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

import torch
from harness import (
    environment,
    flops_backward,
    grid_cells,
    grid_inputs,
    save_report,
    timed,
    triton_backward_tiles,
)

import dash_cuda
from dash_cuda import backward_problem, tables
from dash_cuda.prepost import preprocess_delta
from dash_ref import default_schedule


def run(args) -> dict:
    env = environment(args)
    workers = env["num_workers"]
    grid = [(d, h, s, b, causal, default_schedule("causal" if causal else "full", d, s))
            for d, h, s, b, causal in grid_cells(args.head_dims, args.masks, args.seqlens)]
    t0 = time.perf_counter()
    tables.prepare([(backward_problem(b, h, h, s, s, d, causal), name, workers)
                    for d, h, s, b, causal, name in grid], processes=args.processes)
    print(f"built and validated {len(grid)} schedules in {time.perf_counter() - t0:.1f} s",
          flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    records = []
    for d, h, s, b, causal, name in grid:
        q, k, v, do = grid_inputs(d, s, gen)
        o, lse = dash_cuda.attention_forward(q, k, v, causal=causal)
        run_mode = {exact: functools.partial(
            dash_cuda.attention_backward, q, k, v, o, lse, do, causal=causal, schedule=name,
            num_workers=args.workers, exact=exact) for exact in (False, True)}
        first, again = run_mode[True](), run_mode[True]()
        repeats = all(torch.equal(x, y) for x, y in zip(first, again))
        block_m = triton_backward_tiles(d).block_m
        run_d = {exact: functools.partial(preprocess_delta, o, do, block_m, exact)
                 for exact in (False, True)}
        ms = {False: [], True: []}
        ms_d = {False: [], True: []}
        for _ in range(2):
            for exact in (False, True):
                ms[exact].append(timed(run_mode[exact], args.warmup, args.reps)[0])
                ms_d[exact].append(timed(run_d[exact], args.warmup, args.reps)[0])
        flops = flops_backward(b, h, s, d, causal)
        best = {exact: min(ms[exact]) for exact in ms}
        rec = dict(d=d, H=h, S=s, B=b, mask="causal" if causal else "full", schedule=name,
                   ms_default=round(best[False], 4), ms_exact=round(best[True], 4),
                   tflops_default=round(flops / best[False] / 1e9, 1),
                   tflops_exact=round(flops / best[True] / 1e9, 1),
                   exact_over_default=round(best[False] / best[True], 3),
                   ms_d_default=round(min(ms_d[False]), 4), ms_d_exact=round(min(ms_d[True]), 4),
                   exact_repeats_bitwise=repeats)
        records.append(rec)
        print(f"d={d:<3} {rec['mask']:<6} S={s:<5} {name:<16} default "
              f"{rec['tflops_default']:6.1f}  exact {rec['tflops_exact']:6.1f} TFLOP/s  "
              f"ratio {rec['exact_over_default']:.3f}  D {rec['ms_d_default']:.4f} / "
              f"{rec['ms_d_exact']:.4f} ms  repeats={repeats}", flush=True)
        del run_mode, run_d, first, again
        torch.cuda.empty_cache()
    return {"environment": env, "results": records}


def markdown(report: dict) -> str:
    env, rows = report["environment"], report["results"]
    ratios = [r["exact_over_default"] for r in rows]
    lines = [
        "# The cost of `exact=True` (backward TFLOP/s)",
        "",
        f"`{env['command']}`",
        "",
        f"{env['gpu']} ({env['sm_count']} SMs), torch {env['torch']}, triton {env['triton']}; "
        f"git {env['git_revision']}; {env['date_utc']}; num_workers {env['num_workers']}; "
        f"bf16, 16384 tokens, hidden 2048; the schedule `auto` picks; the better of two "
        f"medians of {env['reps']} CUDA-graph replays per arithmetic, timed alternately.",
        "",
        "| d | mask | S | B | schedule | default | exact | exact / default | D default ms "
        "| D exact ms | exact repeats |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {r['B']} | {r['schedule']} | "
                     f"{r['tflops_default']:.1f} | {r['tflops_exact']:.1f} | "
                     f"{r['exact_over_default']:.3f} | {r['ms_d_default']:.4f} | "
                     f"{r['ms_d_exact']:.4f} | {'yes' if r['exact_repeats_bitwise'] else 'NO'} |")
    if ratios:
        lines += ["", f"exact / default: {min(ratios):.3f} to {max(ratios):.3f}, geometric "
                  f"mean {statistics.geometric_mean(ratios):.3f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--masks", nargs="+", default=["full", "causal"],
                        choices=["full", "causal"])
    parser.add_argument("--workers", type=int, default=None, help="default: SM count")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    report = run(args)
    save_report(args.out, "exact_cost", report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
