"""Where a backward's time goes: every GPU kernel of one backward call, ours beside FA4's.

For each cell of the paper's grid named on the command line, each implementation runs its
backward ``--reps`` times under ``torch.profiler``; the report lists, per implementation, the
mean GPU time per call of every kernel it launched (the main kernel, the pre- and
post-processing passes, memsets and copies) and their sum. Comparing the main kernels alone
with the whole calls separates the schedule-driven kernel from the fixed cost around it.
Writes ``<tag>.json`` and ``<tag>.md`` to ``--out``::

    PYTHONPATH=. python benchmarks/profile_backward.py --out benchmarks/results \
        --cells 64:full:512 128:full:512 --impls cute:shift cute:atomic fa4-det
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import (
    HIDDEN,
    TOKENS,
    grid_inputs,
    group_error,
    kernel_times,
    no_cuda,
    parse_cell,
    peer_closures,
    save_report,
)


def markdown(report: dict) -> str:
    lines = [f"# Kernels of one backward call ({report['environment']})", ""]
    for cell in report["cells"]:
        kv = f", H_kv={cell['H_kv']}" if cell.get("H_kv", cell["H"]) != cell["H"] else ""
        lines += [f"## d={cell['d']} {cell['mask']} S={cell['S']} (B={cell['B']}, "
                  f"H={cell['H']}{kv})", "", "| impl | kernel | us per call |", "|---|---|---|"]
        for impl, times in cell["kernels"].items():
            if isinstance(times, str):
                lines.append(f"| {impl} | FAILED: {times} | |")
                continue
            for name, us in times.items():
                lines.append(f"| {impl} | `{name}` | {us:.1f} |")
            lines.append(f"| {impl} | **all** | **{sum(times.values()):.1f}** |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", default="profile_backward")
    ap.add_argument("--cells", type=parse_cell, nargs="+",
                    default=[(64, "full", 512), (64, "full", 4096), (128, "full", 512),
                             (128, "full", 4096)], help="D:MASK:S")
    ap.add_argument("--impls", nargs="+", default=["cute:shift", "cute:atomic", "fa4-det",
                                                   "fa4"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--group", type=int, default=1,
                    help="query heads per KV head (grouped-query attention)")
    args = ap.parse_args(argv)
    error = group_error(args.group, sorted({d for d, _, _ in args.cells}))
    if error:
        print(f"profile_backward: --group: {error}", file=sys.stderr)
        return 2

    if no_cuda("profile_backward"):
        return 2
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    cells = []
    for d, mask, s in args.cells:
        h, b = HIDDEN // d, TOKENS // s
        q, k, v, do = grid_inputs(d, s, gen, args.group)
        kernels: dict[str, object] = {}
        for impl in args.impls:
            try:
                _, bwd = peer_closures(impl, q, k, v, do, mask == "causal")
                kernels[impl] = kernel_times(bwd, args.reps)
                print(f"d={d} {mask} S={s} {impl}: {sum(kernels[impl].values()):.1f} us "
                      f"({len(kernels[impl])} kernels)", flush=True)
            except Exception as err:  # noqa: BLE001 - record, keep profiling
                kernels[impl] = f"{type(err).__name__}: {str(err)[:200]}"
                print(f"d={d} {mask} S={s} {impl}: FAILED {kernels[impl]}", flush=True)
        cells.append({"d": d, "mask": mask, "S": s, "B": b, "H": h, "H_kv": h // args.group,
                      "kernels": kernels})
    env = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, mean of {args.reps}"
    report = {"environment": env, "cells": cells}
    save_report(args.out, args.tag, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
