"""``dash-verify simulate``: makespan and idle time of schedules in the DAG model.

Each schedule runs in the discrete-event simulator (:mod:`dash_ref.model.simulator`); the
report also shows the DAG's critical path (:mod:`dash_ref.model.dag`), which must equal it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TextIO

from dash_ref.model.dag import MODELS, build_dag
from dash_ref.model.gantt import save_gantt, text_timeline
from dash_ref.model.simulator import simulate
from dash_ref.schedules.schedule import BANDED, NAMES, build_schedule

from . import budget
from .args import (
    EXIT_OK,
    SCHEDULES,
    Outcome,
    add_shape_args,
    at_least,
    cost,
    output_file,
    problem_from_args,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate", help="makespan and idle time of schedules in the DAG model",
        description="Simulate schedules on W workers with compute cost c and reduce cost r "
                    "per tile (docs/design.md section 4).")
    p.add_argument("--name", choices=(*SCHEDULES, *BANDED, "all"), default="all",
                   help="a schedule, or all of them (banded too where --window-size is given)")
    add_shape_args(p, windows=True)
    p.add_argument("--cost-compute", type=cost, default=1.0, metavar="C",
                   help="cost of one tile's compute stage (finite, >= 0)")
    p.add_argument("--cost-reduce", type=cost, default=0.5, metavar="R",
                   help="cost of one dQ reduce (finite, >= 0)")
    p.add_argument("--model", choices=MODELS, default="sync",
                   help="sync: compute then reduce on one unit; async: separate dQ writer")
    p.add_argument("--staging", type=at_least(1), default=None, metavar="S",
                   help="async: S staging buffers between a worker's computes and its dQ "
                        "writer (the CuTe kernel has 2; default unbounded)")
    p.add_argument("--partial", action="store_true",
                   help="weight each compute by its tile's unmasked fraction (otherwise "
                        "every active tile costs C, the idealized model)")
    p.add_argument("--gantt", type=output_file, metavar="FILE.png", default=None,
                   help="also draw a Gantt chart (needs matplotlib)")
    p.add_argument("--timeline", action="store_true",
                   help="also print a plain-text timeline per schedule")
    p.add_argument("--width", type=at_least(20), default=72, help="timeline width in columns")
    budget.add_allow_large(p)
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    if args.gantt is not None and importlib.util.find_spec("matplotlib") is None:
        raise RuntimeError("--gantt needs matplotlib (pip install 'dash-attention[plot]')")
    problem = problem_from_args(args)
    # all: every schedule of NAMES, and banded where the problem has a window
    everything = (*NAMES, *BANDED) if problem.is_windowed else NAMES
    names = everything if args.name == "all" else (args.name,)
    budget.require(budget.schedule_cost(problem, args.workers, len(names), simulate=True), args)
    schedules = [build_schedule(problem, n, args.workers) for n in names]
    c, r = args.cost_compute, args.cost_reduce
    results, paths = [], []
    for s in schedules:
        results.append(simulate(s, args.model, c, r, args.partial, staging=args.staging))
        dag = build_dag(s, args.model, c, r, args.partial, staging=args.staging)
        paths.append((dag, dag.critical_path()))

    p = problem
    print(f"B={p.batch} H={p.heads} H_kv={p.heads_kv} S_q={p.seqlen_q} S_k={p.seqlen_k} "
          f"mask={p.mask}{f' window={p.window_size}' if p.is_windowed else ''} "
          f"BM={p.block_m} BN={p.block_n} (n_q={p.n_q}, n_kv={p.n_kv}); "
          f"W={args.workers} c={c:g} r={r:g} model={args.model}"
          f"{f' staging={args.staging}' if args.staging else ''}"
          f"{' partial' if args.partial else ''}", file=out)
    best = min((res.makespan for res in results), default=0.0)
    print(f"{'schedule':<16} {'makespan':>10} {'critical path':>14} {'idle':>7} "
          f"{'vs best':>8}", file=out)
    for res, (_, cp) in zip(results, paths, strict=True):
        ratio = res.makespan / best if best > 0 else 1.0
        print(f"{res.name:<16} {res.makespan:>10.6g} {cp.length:>14.6g} "
              f"{res.idle_fraction:>7.1%} {ratio:>7.3f}x", file=out)
    if args.timeline:
        for res in results:
            print(text_timeline(res, args.width), file=out)
    if args.gantt:
        save_gantt(results, args.gantt, critical=[dag.path_keys(cp) for dag, cp in paths])
        print(f"wrote {args.gantt}", file=sys.stderr)
    fastest = min(results, key=lambda res: res.makespan)
    return Outcome(EXIT_OK, f"{len(results)} schedule(s) simulated; fastest {fastest.name} "
                            f"({fastest.makespan:.6g})",
                   {res.name: {"makespan": res.makespan, "critical_path": cp.length,
                               "idle_fraction": res.idle_fraction}
                    for res, (_, cp) in zip(results, paths, strict=True)})
