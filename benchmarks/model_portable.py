"""Portable schedules in the calibrated DAG model, on the paper's grid: how close to the best?

For every cell of the grid (W = 132 workers, the CuTe backend's tiles) this simulates every
deterministic schedule in the ``sync`` worker model with the calibration of
``model_vs_measured.json`` (the hand-off cost ``r / c`` per head dim and the median fitted
hand-off latency ``l / c`` over S = 1k - 4k), and reports each schedule's predicted time
relative to the best schedule of the cell, marking the portable ones
(``dash_ref.PORTABLE``: the same bits for every worker count). CPU only, a few minutes::

    python benchmarks/model_portable.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import CALIBRATION, HIDDEN, SEQLENS, TOKENS, model_calibration, save_report

from dash_ref import DETERMINISTIC, PORTABLE, Problem, build_schedule, simulate
from dash_ref.cpu import one_thread

TILES = {64: (128, 128), 128: (64, 128)}  # the CuTe backward's


def calibration(path: Path) -> dict[int, tuple[float, float]]:
    """``{d: (r / c, l / c)}`` from the committed model-vs-measured fit."""
    return {d: model_calibration(path, d) for d in TILES}


def run(calib: dict[int, tuple[float, float]], workers: int) -> list[dict]:
    rows = []
    for d, (bm, bn) in TILES.items():
        rho, lat = calib[d]
        for mask in ("full", "causal"):
            for s in SEQLENS:
                t0 = time.perf_counter()
                p = Problem(TOKENS // s, HIDDEN // d, HIDDEN // d, s, s, d, mask, bm, bn)
                with one_thread():
                    span = {n: simulate(build_schedule(p, n, workers), "sync", 1.0, rho,
                                        handoff_latency=lat).makespan
                            for n in DETERMINISTIC}
                best = min(span.values())
                best_portable = min(span[n] for n in PORTABLE)
                rows.append({"d": d, "mask": mask, "S": s, "r_over_c": rho, "l_over_c": lat,
                             "makespan_c": span,
                             "speed_vs_best": {n: round(best / t, 4) for n, t in span.items()},
                             "best": min(span, key=span.get),
                             "best_portable": min(PORTABLE, key=span.get),
                             "best_portable_vs_best": round(best / best_portable, 4)})
                print(f"d={d} {mask:6s} S={s:5d}: best {rows[-1]['best']}, best portable "
                      f"{rows[-1]['best_portable']} at {rows[-1]['best_portable_vs_best']:.3f}"
                      f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def markdown(report: dict) -> str:
    names = list(DETERMINISTIC)
    lines = [
        "# Portable schedules in the calibrated DAG model (paper's grid, W = "
        f"{report['workers']})", "",
        f"`python benchmarks/model_portable.py --out benchmarks/results`; calibration from "
        f"`{report['calibration']}`: r / c and the median hand-off latency l / c per head dim."
        " Each cell: predicted speed relative to the cell's best schedule (1 = the best); "
        "portable schedules (the same bits for every worker count) are marked `*`.", "",
        "| d | mask | S | " + " | ".join(n + ("*" if n in PORTABLE else "") for n in names)
        + " | best portable / best |",
        "|---" * (4 + len(names)) + "|",
    ]
    for r in report["rows"]:
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | "
                     + " | ".join(f"{r['speed_vs_best'][n]:.3f}" for n in names)
                     + f" | {r['best_portable_vs_best']:.3f} ({r['best_portable']}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--workers", type=int, default=132)
    args = ap.parse_args(argv)
    if not args.calibration.exists():
        print(f"model_portable: no calibration at {args.calibration}", file=sys.stderr)
        return 2
    rows = run(calibration(args.calibration), args.workers)
    report = {"workers": args.workers, "calibration": str(args.calibration), "rows": rows}
    save_report(args.out, "model_portable", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
