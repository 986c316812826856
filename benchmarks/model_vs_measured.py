"""The DAG model against the H200: calibrate per-tile costs, predict every schedule, compare.

Calibration (per head dim), from a ``bench_attention.py`` JSON:

- ``c``, the compute of one dense tile pair, per cell: the atomic peer has no dQ order,
  so its simulated makespan with ``c = 1, r = 0`` (diagonal tiles weighted by their
  unmasked fraction) is ``M_a`` tile-times and ``c = T_atomic / M_a``;
- ``r``, the dQ hand-off, as the ratio ``rho = r / c``: on full masks ``shift`` makes
  nobody wait in the model, so its makespan is affine in ``r``; ``rho`` solves
  ``M_shift(1, rho) * c = T_shift`` in each full-mask cell, and the median over the
  calibration lengths is used everywhere.

Prediction: every deterministic schedule's makespan with ``(c, rho * c)`` in the ``sync``
worker model, reported as speed-up over ``naive`` beside the measured one. Runs on the
CPU (pure Python simulation; minutes for the whole grid)::

    python benchmarks/model_vs_measured.py benchmarks/results/bench_attention.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from report import save_report

from dash_ref import DETERMINISTIC, Problem, build_schedule
from dash_ref.model.simulator import simulate

BM, BN = 64, 128  # the backward tiles the benchmark ran (dash_cuda.backends.triton.config)


def makespan(p: Problem, name: str, workers: int, c: float, r: float, lat: float = 0.0
             ) -> float:
    return simulate(build_schedule(p, name, workers), "sync", c, r, partial=True,
                    handoff_latency=lat).makespan


def fit_latency(p: Problem, workers: int, rho: float, target: float, hi: float = 4.0,
                steps: int = 10) -> float:
    """The hand-off latency (in units of c) at which ``naive``'s makespan meets ``target``."""
    lo = 0.0
    if makespan(p, "naive", workers, 1.0, rho, hi) < target:
        return float("inf")
    for _ in range(steps):
        mid = (lo + hi) / 2
        if makespan(p, "naive", workers, 1.0, rho, mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def latency_study(report: dict, rho: dict[int, float], max_seqlen: int) -> list[dict]:
    """Full masks: the latency that would explain naive's measured time, cell by cell."""
    workers = report["environment"]["num_workers"]
    rows = []
    for key, t in sorted(cells(report, max_seqlen).items()):
        if key[1] != "full":
            continue
        p = Problem(key[3], key[4], key[4], key[2], key[2], key[0], "full", BM, BN)
        c = t["atomic"] / makespan(p, "atomic", workers, 1.0, 0.0)
        lat = fit_latency(p, workers, rho[key[0]], t["naive"] / c)
        rows.append({"d": key[0], "S": key[2], "c_us": round(c * 1e3, 3),
                     "latency_over_c": round(lat, 3), "latency_us": round(lat * c * 1e3, 3),
                     "measured_shift_over_naive": round(t["naive"] / t["shift"], 3)})
        print(f"latency fit d={key[0]} S={key[2]}: l/c = {lat:.3f}", flush=True)
    return rows


def cells(report: dict, max_seqlen: int) -> dict[tuple, dict[str, float]]:
    out: dict[tuple, dict[str, float]] = {}
    for row in report["results"]:
        backend, _, name = row["impl"].rpartition(":")
        if backend in ("dash", "triton") and "bwd_ms" in row and row["S"] <= max_seqlen:
            out.setdefault((row["d"], row["mask"], row["S"], row["B"], row["H"]), {})[name] = \
                row["bwd_ms"]
    return out


def run(report: dict, max_seqlen: int, calibrate_max: int) -> dict:
    workers = report["environment"]["num_workers"]
    data = cells(report, max_seqlen)
    problems = {key: Problem(key[3], key[4], key[4], key[2], key[2], key[0], key[1], BM, BN)
                for key in data}
    c_of = {key: t["atomic"] / makespan(problems[key], "atomic", workers, 1.0, 0.0)
            for key, t in data.items()}
    rho: dict[int, float] = {}
    for d in sorted({k[0] for k in data}):
        fits = []
        for key, t in data.items():
            if key[0] != d or key[1] != "full" or key[2] > calibrate_max:
                continue
            m0 = makespan(problems[key], "shift", workers, 1.0, 0.0)
            m1 = makespan(problems[key], "shift", workers, 1.0, 1.0)
            fits.append((t["shift"] / c_of[key] - m0) / (m1 - m0))
        rho[d] = statistics.median(fits)
        print(f"d={d}: rho = r / c = {rho[d]:.3f} (fits {[round(f, 3) for f in fits]})",
              flush=True)
    rows = []
    for key, t in sorted(data.items()):
        d, mask, s = key[:3]
        t0 = time.perf_counter()
        pred = {n: makespan(problems[key], n, workers, 1.0, rho[d]) for n in DETERMINISTIC}
        rows.append({
            "d": d, "mask": mask, "S": s, "c_us": round(c_of[key] * 1e3, 3),
            "predicted_speedup": {n: round(pred["naive"] / pred[n], 3) for n in pred},
            "measured_speedup": {n: round(t["naive"] / t[n], 3) for n in pred if n in t},
            "predicted_ms": {n: round(pred[n] * c_of[key], 3) for n in pred},
            "measured_ms": {n: t[n] for n in pred if n in t},
        })
        print(f"d={d} {mask} S={s}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return {"source": "benchmarks/results/bench_attention.json", "workers": workers,
            "tiles": [BM, BN], "rho": rho, "rows": rows,
            "latency": latency_study(report, rho, calibrate_max)}


def markdown(out: dict) -> str:
    names = [n for n in DETERMINISTIC if n != "naive"]
    lines = ["# The DAG model against the H200", "",
             f"`python benchmarks/model_vs_measured.py {out['source']}`", "",
             "Sync worker model, diagonal tiles weighted by their unmasked fraction, "
             f"{out['workers']} workers, tiles {out['tiles'][0]} x {out['tiles'][1]}. "
             "Calibrated hand-off over dense-tile compute: "
             + ", ".join(f"d = {d}: r / c = {v:.2f}" for d, v in out["rho"].items()) + ".",
             "", "Speed-up over `naive`, predicted / measured:", "",
             "| d | mask | S | c (us) | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for r in out["rows"]:
        meas = r["measured_speedup"]
        vals = [f"{r['predicted_speedup'][n]:.2f} / {meas.get(n, float('nan')):.2f}"
                for n in names]
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {r['c_us']:.2f} | "
                     + " | ".join(vals) + " |")
    lines += ["", "## A hand-off latency for `naive`'s gap on full masks", "",
              "The latency `l` between a release and the next rank's acquire (simulator "
              "option `handoff_latency`) that would make the simulated `naive` as slow as "
              "measured, with the calibrated `c` and `r` (`shift` is insensitive to it up "
              "to `l = c`):", "",
              "| d | S | c (us) | l / c | l (us) | measured shift / naive |",
              "|---|---|---|---|---|---|"]
    for r in out.get("latency", []):
        lines.append(f"| {r['d']} | {r['S']} | {r['c_us']:.2f} | {r['latency_over_c']:.2f} | "
                     f"{r['latency_us']:.2f} | {r['measured_shift_over_naive']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--max-seqlen", type=int, default=16384)
    ap.add_argument("--calibrate-max", type=int, default=4096,
                    help="longest full-mask cell used to fit r / c")
    ap.add_argument("--latency-only", action="store_true",
                    help="keep the committed predictions, redo only the latency study")
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    if args.latency_only:
        out = json.loads((args.out / "model_vs_measured.json").read_text())
        rho = {int(d): v for d, v in out["rho"].items()}
        out["latency"] = latency_study(report, rho, args.calibrate_max)
    else:
        out = run(report, args.max_seqlen, args.calibrate_max)
    save_report(args.out, "model_vs_measured", out, markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
