"""The CuTe kernels against FlashAttention-4 on the paper's grid, timed in interleaved rounds.

``bench_attention.py`` times each implementation once, one after another; at long sequences
two runs of one kernel there differ by up to about 5 %, as much as many of the gaps it
reports. Here every row of a cell is timed in each of ``--rounds`` rounds, in an order that
rotates from round to round; ratios are taken within a round (the same clock and temperature
for both sides) and reported as the median over the rounds with their range::

    python benchmarks/versus_fa4.py --out benchmarks/results --rounds 4

Every row is reached as a training step reaches it: the forward on inputs that require
gradients, the backward by ``torch.autograd.grad`` of one forward's output. Each ratio comes
in two columns, every implementation timed the same way in each:

* ``kernels``: CUDA-graph replays where every row of the ratio can be captured; where one
  cannot (FlashAttention-4's backward), every row of that ratio as back-to-back calls timed
  by CUDA events (the host runs ahead, so this too is the GPU's time); the report says
  which;
* ``calls``: single calls, a synchronize on each side, by the host's clock (what one call of
  a user's step sees, host included).

Rows per cell (bf16, 16384 tokens, hidden 2048; ``--group G`` gives K and V ``H / G`` heads,
grouped-query attention):

* backward: every deterministic CuTe schedule of ``--schedules`` and ``auto`` (the one
  ``dash_cuda`` picks), FA4 with ``deterministic=True`` (``fa4-det``) and without (``fa4``).
  "best" is the schedule with the lowest median kernel time over the rounds (one choice per
  cell, not the fastest of each round, which would favour us by the noise);
* forward: CuTe and FA4; step: forward + backward (best schedule against ``fa4-det``).

Writes ``<tag>.json`` (every round's time of every row in every timing) and ``<tag>.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from harness import (
    HIDDEN,
    SEQLENS,
    TOKENS,
    dash_autograd_closures,
    environment,
    fa4_closures,
    grid_inputs,
    group_error,
    load_fa4,
    median_ms,
    no_cuda,
    provenance,
    replayable,
    rotating_rounds,
    save_report,
    single_call_ms,
)

SCHEDULES = {"full": ["shift", "symmetric_shift", "spt", "descending", "naive"],
             "causal": ["symmetric_shift", "spt", "descending", "shift", "naive"]}

#: the ratios of a cell: (ours, the peer's), each a list of rows whose times add up
RATIOS = {
    "fwd_vs_fa4": (["cute:fwd"], ["fa4:fwd"]),
    "bwd_best_vs_fa4_det": (["best"], ["fa4-det:bwd"]),
    "bwd_auto_vs_fa4_det": (["cute:auto:bwd"], ["fa4-det:bwd"]),
    "bwd_best_vs_fa4": (["best"], ["fa4:bwd"]),
    "step_vs_fa4_det": (["cute:fwd", "best"], ["fa4:fwd", "fa4-det:bwd"]),
}


def ratio_stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def summarize(cell: dict) -> dict:
    """Per-round speed ratios (time of the peer / time of ours) of one measured cell, in
    both columns. ``cell["ms"]``: ``{"graph": {row: [ms per round]}`` (the rows that were
    captured), ``"queued"`` and ``"single"`` (every row)}."""
    ms = cell["ms"]
    rounds = len(ms["queued"]["fa4-det:bwd"])

    def kernel_ms(row: str) -> list[float]:
        return ms["graph"].get(row) or ms["queued"][row]

    scheds = [k for k in ms["queued"] if k.startswith("cute:") and k.endswith(":bwd")]
    best = min(scheds, key=lambda k: statistics.median(kernel_ms(k)))

    def per_round(times: dict, ours: list[str], peer: list[str]) -> dict:
        return ratio_stats([sum(times[p][r] for p in peer) / sum(times[o][r] for o in ours)
                            for r in range(rounds)])

    out = {"best_schedule": best.split(":")[1]}
    for name, (ours, peer) in RATIOS.items():
        ours = [best if row == "best" else row for row in ours]
        timing = "graph" if all(row in ms["graph"] for row in ours + peer) else "queued"
        out[name] = {"kernels": {**per_round(ms[timing], ours, peer), "timing": timing},
                     "calls": per_round(ms["single"], ours, peer)}
    return out


def timed_rows(closures: dict, rounds: int, reps: int, warmup: int) -> dict:
    """``{"graph": ..., "queued": ..., "single": ...}``: every row's milliseconds per round
    as a replay (the rows that capture), as back-to-back calls and as single calls, all
    interleaved in rotating rounds."""
    measures = {}
    for key, fn in closures.items():
        replay, mode = replayable(fn, warmup)
        if mode == "graph":
            measures[("graph", key)] = partial(median_ms, replay, reps)
        measures[("queued", key)] = partial(median_ms, fn, reps)
        measures[("single", key)] = partial(single_call_ms, fn, reps)
    out: dict[str, dict] = {"graph": {}, "queued": {}, "single": {}}
    for (timing, key), times in rotating_rounds(measures, rounds).items():
        out[timing][key] = times
    return out


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
        # the closures own the tensors their graphs read (the forward's outputs, ...): they
        # stay referenced until the cell is done
        closures = {}
        for name in ["auto", *SCHEDULES[mask][:args.schedules]]:
            fwd, bwd = dash_autograd_closures("cute", name, q, k, v, do, causal, args.workers)
            closures[f"cute:{name}:bwd"] = bwd
        closures["cute:fwd"] = fwd
        for peer in ("fa4", "fa4-det"):
            fwd, bwd = fa4_closures(fa, peer == "fa4-det", q, k, v, do, causal)
            closures[f"{peer}:bwd"] = bwd
            if peer == "fa4":
                closures["fa4:fwd"] = fwd
        ms = timed_rows(closures, args.rounds, args.reps, args.warmup)
        cell = {"d": d, "mask": mask, "S": s, "B": b, "H": h, "H_kv": h // args.group,
                "ms": ms, "captured": sorted(ms["graph"])}
        cell.update(summarize(cell))
        out.append(cell)
        print(f"[{n}/{len(cells)}] d={d} {mask} S={s}: fwd "
              f"{cell['fwd_vs_fa4']['kernels']['median']:.3f} bwd {cell['best_schedule']} "
              f"{cell['bwd_best_vs_fa4_det']['kernels']['median']:.3f} of FA4-det", flush=True)
        del closures
        torch.cuda.empty_cache()
    return {"environment": env, "cells": out}


def timing_note(report: dict) -> str:
    """Which ratios' kernel column came from graph replays and which from queued calls."""
    used: dict[str, set] = {}
    for c in report["cells"]:
        for name in RATIOS:
            used.setdefault(c[name]["kernels"]["timing"], set()).add(name)
    labels = {"fwd_vs_fa4": "forward", "bwd_best_vs_fa4_det": "backward",
              "bwd_auto_vs_fa4_det": "backward", "bwd_best_vs_fa4": "backward",
              "step_vs_fa4_det": "step"}
    return "; ".join(f"{mode}: {', '.join(sorted({labels[n] for n in names}))}"
                     for mode, names in sorted(used.items()))


def _fmt(stat: dict) -> str:
    k, c = stat["kernels"], stat["calls"]
    return f"{k['median']:.2f} ({k['min']:.2f} - {k['max']:.2f}) / {c['median']:.2f}"


def markdown(report: dict) -> str:
    env = report["environment"]
    groups = sorted({c["H"] // c.get("H_kv", c["H"]) for c in report["cells"]})
    gqa = f"; grouped-query attention, {' or '.join(map(str, groups))} query heads per KV head" \
        if groups != [1] else ""
    lines = [
        "# CuTe against FlashAttention-4, interleaved rounds (speed ratios, > 1: ours faster)",
        "", f"`{env['command']}`", "",
        f"{env['gpu']}, torch {env['torch']}, git {env['git_revision'][:7]}, "
        f"{env['date_utc']}; {env['rounds']} rounds, median of {env['reps']} calls per row, "
        "timing and round; every row through autograd. Each entry: the kernels' ratio, median "
        "over rounds (range), then the single calls' ratio (synchronize, call, synchronize: "
        "host included), median over rounds. The kernels' column times every row of a ratio "
        "the same way: CUDA-graph replays where all of them capture, else back-to-back calls "
        f"timed by CUDA events ({timing_note(report)}; FlashAttention-4's backward cannot be "
        f"captured){gqa}.", "",
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
