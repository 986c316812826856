"""The CuTe kernels against FlashAttention-4 on the paper's grid, timed in interleaved rounds.

``bench_attention.py`` times each implementation once, one after another; at long sequences
two runs of one kernel there differ by up to about 5 %, as much as many of the gaps it
reports. Here every implementation of a cell is captured once (a CUDA graph) and then timed
in each of ``--rounds`` rounds, in an order that rotates from round to round; ratios are
taken within a round (the same clock and temperature for both sides) and reported as the
median over the rounds with their range::

    python benchmarks/versus_fa4.py --out benchmarks/results --rounds 5

Rows per cell (bf16, 16384 tokens, hidden 2048; ``--group G`` gives K and V ``H / G`` heads,
grouped-query attention):

* backward: every deterministic CuTe schedule of ``--schedules`` and ``auto`` (the one
  ``dash_cuda`` picks), FA4 with ``deterministic=True`` (``fa4-det``) and without (``fa4``).
  "best" is the schedule with the lowest median time over the rounds (one choice per cell,
  not the fastest of each round, which would favour us by the noise);
* forward: CuTe and FA4; step: forward + backward (best schedule against ``fa4-det``).

Writes ``<tag>.json`` (every round's time of every row) and ``<tag>.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import (
    HIDDEN,
    SEQLENS,
    TOKENS,
    dash_closures,
    environment,
    fa4_closures,
    grid_inputs,
    group_error,
    interleaved_rounds,
    load_fa4,
    no_cuda,
    provenance,
    replayable,
    save_report,
)

SCHEDULES = {"full": ["shift", "symmetric_shift", "spt", "descending", "naive"],
             "causal": ["symmetric_shift", "spt", "descending", "shift", "naive"]}


def ratio_stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def summarize(cell: dict) -> dict:
    """Per-round speed ratios (time of the peer / time of ours) of one measured cell."""
    ms = cell["ms"]
    rounds = len(ms["fa4-det:bwd"])
    scheds = [k for k in ms if k.startswith("cute:") and k.endswith(":bwd")]
    best = min(scheds, key=lambda k: statistics.median(ms[k]))

    def per_round(ours: list[str], peer: list[str]) -> dict:
        return ratio_stats([sum(ms[p][r] for p in peer) / sum(ms[o][r] for o in ours)
                            for r in range(rounds)])

    return {
        "best_schedule": best.split(":")[1],
        "fwd_vs_fa4": per_round(["cute:fwd"], ["fa4:fwd"]),
        "bwd_best_vs_fa4_det": per_round([best], ["fa4-det:bwd"]),
        "bwd_auto_vs_fa4_det": per_round(["cute:auto:bwd"], ["fa4-det:bwd"]),
        "bwd_best_vs_fa4": per_round([best], ["fa4:bwd"]),
        "step_vs_fa4_det": per_round(["cute:fwd", best], ["fa4:fwd", "fa4-det:bwd"]),
    }


def run(args) -> dict:
    import torch

    fa = load_fa4()
    if fa is None:
        raise SystemExit("versus_fa4: FlashAttention-4 is not importable here")
    env = environment(args)
    env.update(provenance("versus_fa4.py", args.argv), rounds=args.rounds)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cells = [(d, m, s) for d in args.head_dims for m in args.masks for s in args.seqlens]
    out = []
    t0 = time.perf_counter()
    for n, (d, mask, s) in enumerate(cells, 1):
        if time.perf_counter() - t0 > args.time_budget:
            print(f"time budget spent: {len(cells) - n + 1} cells not measured", flush=True)
            break
        h, b, causal = HIDDEN // d, TOKENS // s, mask == "causal"
        q, k, v, do = grid_inputs(d, s, gen, args.group)
        # the closures own the tensors their graphs read (o and LSE of the forward, ...):
        # they stay referenced until the cell is done
        closures = {}
        for name in ["auto", *SCHEDULES[mask][:args.schedules]]:
            fwd, bwd = dash_closures("cute", name, q, k, v, do, causal, args.workers)
            closures[f"cute:{name}:bwd"] = bwd
        closures["cute:fwd"] = fwd
        for peer in ("fa4", "fa4-det"):
            fwd, bwd = fa4_closures(fa, peer == "fa4-det", q, k, v, do, causal)
            closures[f"{peer}:bwd"] = bwd
            if peer == "fa4":
                closures["fa4:fwd"] = fwd
        runs, modes = {}, {}
        for key, fn in closures.items():
            if args.eager:
                runs[key], modes[key] = fn, "eager"
            else:
                runs[key], modes[key] = replayable(fn, args.warmup)
        ms = interleaved_rounds(runs, args.rounds, args.reps)
        cell = {"d": d, "mask": mask, "S": s, "B": b, "H": h, "H_kv": h // args.group, "ms": ms,
                "timing": modes}
        cell.update(summarize(cell))
        out.append(cell)
        print(f"[{n}/{len(cells)}] d={d} {mask} S={s}: fwd {cell['fwd_vs_fa4']['median']:.3f}"
              f" bwd {cell['best_schedule']} {cell['bwd_best_vs_fa4_det']['median']:.3f} of "
              f"FA4-det", flush=True)
        del runs, closures
        torch.cuda.empty_cache()
    return {"environment": env, "cells": out}


def timing_note(report: dict) -> str:
    """Which rows ran as CUDA-graph replays and which as plain calls."""
    modes: dict[str, set] = {}
    for c in report["cells"]:
        for key, mode in c.get("timing", {}).items():
            modes.setdefault(mode, set()).add(key.split(":")[0])
    return "; ".join(f"{mode}: {', '.join(sorted(names))}" for mode, names in sorted(modes.items()))


def _fmt(stat: dict) -> str:
    return f"{stat['median']:.2f} ({stat['min']:.2f} - {stat['max']:.2f})"


def markdown(report: dict) -> str:
    env = report["environment"]
    groups = sorted({c["H"] // c.get("H_kv", c["H"]) for c in report["cells"]})
    gqa = f"; grouped-query attention, {' or '.join(map(str, groups))} query heads per KV head" \
        if groups != [1] else ""
    lines = [
        "# CuTe against FlashAttention-4, interleaved rounds (speed ratios, > 1: ours faster)",
        "", f"`{env['command']}`", "",
        f"{env['gpu']}, torch {env['torch']}, git {env['git_revision'][:7]}, "
        f"{env['date_utc']}; {env['rounds']} rounds, median of {env['reps']} replays per row "
        "and round; each ratio is the median over rounds (range in brackets). Timing: "
        f"{timing_note(report)}{gqa}.", "",
        "| d | mask | S | forward / FA4 | best schedule | backward / FA4 det | auto / FA4 det "
        "| backward / FA4 | step / FA4 det |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        lines.append(
            f"| {c['d']} | {c['mask']} | {c['S']} | {_fmt(c['fwd_vs_fa4'])} | "
            f"{c['best_schedule']} | {_fmt(c['bwd_best_vs_fa4_det'])} | "
            f"{_fmt(c['bwd_auto_vs_fa4_det'])} | {_fmt(c['bwd_best_vs_fa4'])} | "
            f"{_fmt(c['step_vs_fa4_det'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tag", default="versus_fa4")
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--masks", nargs="+", default=["full", "causal"],
                        choices=["full", "causal"])
    parser.add_argument("--seqlens", nargs="+", type=int, default=list(SEQLENS))
    parser.add_argument("--schedules", type=int, default=4,
                        help="how many deterministic schedules per mask besides auto")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--workers", type=int, default=None, help="CuTe workers (default: SMs)")
    parser.add_argument("--eager", action="store_true",
                        help="time every row by plain calls (default: CUDA graph replays "
                             "where capture works)")
    parser.add_argument("--group", type=int, default=1,
                        help="query heads per KV head (grouped-query attention)")
    parser.add_argument("--time-budget", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    args.argv = argv
    if args.rounds < 1 or args.reps < 1 or not 0 <= args.schedules <= 5:
        print("versus_fa4: --rounds and --reps must be >= 1, --schedules in 0..5",
              file=sys.stderr)
        return 2
    error = group_error(args.group, args.head_dims)
    if error:
        print(f"versus_fa4: --group: {error}", file=sys.stderr)
        return 2
    if no_cuda("versus_fa4"):
        return 2
    report = run(args)
    save_report(args.out, args.tag, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
