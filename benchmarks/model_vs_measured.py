"""The DAG model against the H200: calibrate per-tile costs, predict every schedule, compare.

Calibration (per head dim), from a ``bench_attention.py`` JSON:

- ``c``, the compute of one dense tile pair, per cell: the atomic peer has no dQ order,
  so its simulated makespan with ``c = 1, r = 0`` (diagonal tiles weighted by their
  unmasked fraction) is ``M_a`` tile-times and ``c = T_atomic / M_a``;
- ``r``, the dQ hand-off, as the ratio ``rho = r / c``: on full masks ``shift`` makes
  nobody wait in the model, so its makespan is affine in ``r``; ``rho`` solves
  ``M_shift(1, rho) * c = T_shift`` in each full-mask cell, and the median over the
  calibration lengths is used everywhere.

Prediction: every deterministic schedule's makespan with ``(c, rho * c)`` in the worker
model of the backend (``sync`` for Triton, whose program adds its partials in line;
``async`` for CuTe, whose dQ writer warp adds them beside the MMAs), reported as speed-up
over ``naive`` beside the measured one. Runs on the CPU (pure Python simulation; minutes
for the whole grid)::

    python benchmarks/model_vs_measured.py benchmarks/results/bench_attention.json

The ``async`` model has as many staging buffers per worker as the kernel (a visit starts
once the partial two visits back has been added). A hand-off shorter than a visit hides
behind the next visits, so the grid's times cannot fit ``rho``; give it from the timing
probe instead (``--rho D=VALUE``, the dQ writer's add latency over the visit period of
``probe_backward.md``)::

    python benchmarks/model_vs_measured.py benchmarks/results/bench_attention.json \
        --backend cute --rho 64=0.32 128=0.39
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness import cute_backward_tiles, save_report

from dash_cuda.api import backward_problem
from dash_ref import DETERMINISTIC, Problem, build_schedule
from dash_ref.model.simulator import simulate

#: per backend: the grid's impl prefixes and the worker model of its kernel
BACKENDS = {"triton": (("dash", "triton"), "sync"), "cute": (("cute",), "async")}


def makespan(p: Problem, name: str, workers: int, c: float, r: float, lat: float = 0.0,
             model: str = "sync", staging: int | None = None) -> float:
    return simulate(build_schedule(p, name, workers), model, c, r, partial=True,
                    handoff_latency=lat, staging=staging).makespan


def staging_of(backend: str, head_dim: int, mask: str) -> int | None:
    """The staged partials between a worker's MMAs and its dQ writer (CuTe's
    ``BackwardConfig.dq_stages``); None where the model has no bound (Triton: ``sync``)."""
    if BACKENDS[backend][1] != "async":
        return None
    return cute_backward_tiles(head_dim, mask).dq_stages


def problem_of(key: tuple, backend: str) -> Problem:
    """The grid cell ``(d, mask, S, B, H)`` with the tiles ``backend``'s backward ran."""
    d, mask, s, b, h = key
    return backward_problem(b, h, h, s, s, d, mask == "causal", backend=backend)


def fit_latency(p: Problem, workers: int, rho: float, target: float, model: str,
                staging: int | None, hi: float = 4.0,
                steps: int = 10) -> float:
    """The hand-off latency (in units of c) at which ``naive``'s makespan meets ``target``."""
    lo = 0.0
    if makespan(p, "naive", workers, 1.0, rho, hi, model, staging) < target:
        return float("inf")
    for _ in range(steps):
        mid = (lo + hi) / 2
        if makespan(p, "naive", workers, 1.0, rho, mid, model, staging) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def latency_study(report: dict, rho: dict[int, float], max_seqlen: int, backend: str
                  ) -> list[dict]:
    """Full masks: the latency that would explain naive's measured time, cell by cell."""
    workers, model = report["environment"]["num_workers"], BACKENDS[backend][1]
    rows = []
    for key, t in sorted(cells(report, max_seqlen, backend).items()):
        if key[1] != "full":
            continue
        p = problem_of(key, backend)
        staging = staging_of(backend, key[0], key[1])
        c = t["atomic"] / makespan(p, "atomic", workers, 1.0, 0.0, model=model, staging=staging)
        lat = fit_latency(p, workers, rho[key[0]], t["naive"] / c, model, staging)
        rows.append({"d": key[0], "S": key[2], "c_us": round(c * 1e3, 3),
                     "latency_over_c": round(lat, 3), "latency_us": round(lat * c * 1e3, 3),
                     "measured_shift_over_naive": round(t["naive"] / t["shift"], 3)})
        print(f"latency fit d={key[0]} S={key[2]}: l/c = {lat:.3f}", flush=True)
    return rows


def cells(report: dict, max_seqlen: int, backend: str) -> dict[tuple, dict[str, float]]:
    out: dict[tuple, dict[str, float]] = {}
    for row in report["results"]:
        prefix, _, name = row["impl"].rpartition(":")
        if prefix in BACKENDS[backend][0] and "bwd_ms" in row and row["S"] <= max_seqlen:
            out.setdefault((row["d"], row["mask"], row["S"], row["B"], row["H"]), {})[name] = \
                row["bwd_ms"]
    return out


def run(report: dict, max_seqlen: int, calibrate_max: int, backend: str,
        given_rho: dict[int, float]) -> dict:
    workers, model = report["environment"]["num_workers"], BACKENDS[backend][1]
    data = cells(report, max_seqlen, backend)
    problems = {key: problem_of(key, backend) for key in data}
    staging = {key: staging_of(backend, key[0], key[1]) for key in data}
    c_of = {key: t["atomic"] / makespan(problems[key], "atomic", workers, 1.0, 0.0,
                                        model=model, staging=staging[key])
            for key, t in data.items()}
    rho: dict[int, float] = dict(given_rho)
    for d in sorted({k[0] for k in data} - set(rho)):
        fits = []
        for key, t in data.items():
            if key[0] != d or key[1] != "full" or key[2] > calibrate_max:
                continue
            m0 = makespan(problems[key], "shift", workers, 1.0, 0.0, model=model,
                          staging=staging[key])
            m1 = makespan(problems[key], "shift", workers, 1.0, 1.0, model=model,
                          staging=staging[key])
            fits.append((t["shift"] / c_of[key] - m0) / (m1 - m0))
        rho[d] = statistics.median(fits)
        print(f"d={d}: rho = r / c = {rho[d]:.3f} (fits {[round(f, 3) for f in fits]})",
              flush=True)
    rows = []
    for key, t in sorted(data.items()):
        d, mask, s = key[:3]
        t0 = time.perf_counter()
        pred = {n: makespan(problems[key], n, workers, 1.0, rho[d], model=model,
                            staging=staging[key])
                for n in DETERMINISTIC}
        rows.append({
            "d": d, "mask": mask, "S": s, "c_us": round(c_of[key] * 1e3, 3),
            "predicted_speedup": {n: round(pred["naive"] / pred[n], 3) for n in pred},
            "measured_speedup": {n: round(t["naive"] / t[n], 3) for n in pred if n in t},
            "predicted_ms": {n: round(pred[n] * c_of[key], 3) for n in pred},
            "measured_ms": {n: t[n] for n in pred if n in t},
        })
        print(f"d={d} {mask} S={s}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return {"source": "benchmarks/results/bench_attention.json", "backend": backend,
            "model": model, "staging": {k[0]: v for k, v in staging.items()},
            "rho_given": sorted(given_rho), "workers": workers,
            "tiles": {k[0]: [p.block_m, p.block_n] for k, p in problems.items()},
            "rho": rho, "rows": rows,
            "latency": latency_study(report, rho, calibrate_max, backend)}


def markdown(out: dict) -> str:
    modelled = out["rows"][0]["predicted_speedup"] if out["rows"] else {}
    names = [n for n in DETERMINISTIC if n != "naive" and n in modelled]
    backend, given = out.get("backend", "triton"), out.get("rho_given", [])
    rho = {int(d): v for d, v in out["rho"].items()}  # JSON keys are strings
    command = f"python benchmarks/model_vs_measured.py {out['source']}"
    if backend != "triton":
        command += f" --backend {backend}"
    if given:
        command += " --rho " + " ".join(f"{d}={rho[int(d)]:g}" for d in given)
    tiles = out["tiles"]
    tiles = ([tiles] if isinstance(tiles, list)  # files written before tiles per head dim
             else [f"d = {d}: {t[0]} x {t[1]}" for d, t in tiles.items()])
    lines = [f"# The DAG model against the H200: the {backend} backend", "",
             f"`{command}`", "",
             f"{out.get('model', 'sync').capitalize()} worker model"
             + ("" if not any(out.get("staging", {}).values()) else " with staging buffers "
                "per worker (" + ", ".join(f"d = {d}: {v}" for d, v in out["staging"].items())
                + ")")
             + ", diagonal tiles weighted "
             f"by their unmasked fraction, {out['workers']} workers, tiles "
             + ", ".join(str(t) for t in tiles) + ". Hand-off over dense-tile compute ("
             + ("given, from the timing probe" if given else "fitted on full masks") + "): "
             + ", ".join(f"d = {d}: r / c = {v:.2f}" for d, v in rho.items()) + ".",
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
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="triton",
                    help="whose grid rows to model (its tiles and worker model)")
    ap.add_argument("--rho", nargs="+", default=[], metavar="D=VALUE",
                    help="hand-off over compute per head dim instead of a fit (needed for "
                         "the async model)")
    args = ap.parse_args(argv)
    try:
        given = {int(d): float(v) for d, v in (x.split("=") for x in args.rho)}
    except ValueError:
        print(f"model_vs_measured: --rho takes D=VALUE pairs, got {args.rho}", file=sys.stderr)
        return 2
    if BACKENDS[args.backend][1] == "async" and not given:
        print("model_vs_measured: the async model cannot fit r / c from the grid; give --rho "
              "D=VALUE per head dim (probe_backward.md)", file=sys.stderr)
        return 2
    tag = "model_vs_measured" + ("" if args.backend == "triton" else f"_{args.backend}")
    report = json.loads(args.report.read_text())
    if args.latency_only:
        out = json.loads((args.out / f"{tag}.json").read_text())
        rho = {int(d): v for d, v in out["rho"].items()}
        out["latency"] = latency_study(report, rho, args.calibrate_max, args.backend)
    else:
        out = run(report, args.max_seqlen, args.calibrate_max, args.backend, given)
    save_report(args.out, tag, out, markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
