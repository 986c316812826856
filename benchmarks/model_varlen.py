"""Schedules on packed batches of ragged lengths, in the DAG model: what ``lpt`` buys.

For each mix of sequence lengths (equal lengths, lengths drawn uniformly, a heavy-tailed
mix; fixed seeds) at 16k and 64k tokens in all, causal self-attention, d = 128 with the
CuTe backward's tiles (64 x 128), 16 heads (hidden 2048), W = 132 workers, this builds
every schedule on the packed :class:`dash_ref.Problem` and reports its predicted makespan
in units of ``c`` (one tile pair's compute), two ways:

- ``dag``: the critical path of the DAG model (``dash_ref.model.critical_path``, ``sync``
  worker model, ``c = 1``, ``r = r / c`` of the calibration, every active tile at full cost);
- ``sim``: the simulator with the calibrated hand-off latency on top
  (``dash_ref.model.simulate(..., handoff_latency=l / c)``).

``r / c`` and ``l / c`` for d = 128 come from ``results/model_vs_measured.json``, as in
``model_portable.py`` (the median latency over S = 1k - 4k). ``bound`` is the larger of
the total work over W workers and the longest chain. CPU only, a few minutes::

    python benchmarks/model_varlen.py --out benchmarks/results
"""

from __future__ import annotations

import random
import sys
import time

from harness import model_main

from dash_ref import Problem, build_schedule, critical_path, simulate
from dash_ref.cpu import one_thread

HEAD_DIM, BLOCK_M, BLOCK_N, HEADS = 128, 64, 128, 16
TOTALS = (16384, 65536)
NAMES = ("naive", "spt", "descending", "interleaved", "lpt")
SEED = 2024


def lengths(mix: str, total: int, seed: int = SEED) -> list[int]:
    """Sequence lengths summing to ``total`` (the last one cut to fit)."""
    rng = random.Random(f"{seed}-{mix}-{total}")
    out: list[int] = []
    while sum(out) < total:
        if mix == "equal":
            s = 2048
        elif mix == "uniform":
            s = rng.randint(1, 4096)  # mean 2048
        elif mix == "heavy":
            # log-normal with median 512: most documents short, a few very long
            s = max(1, min(total, round(rng.lognormvariate(6.24, 1.5))))
        else:
            raise ValueError(f"unknown mix {mix!r}")
        out.append(min(s, total - sum(out)))
    return out


def run(rho: float, latency: float, workers: int) -> list[dict]:
    rows = []
    for total in TOTALS:
        for mix in ("equal", "uniform", "heavy"):
            t0 = time.perf_counter()
            seqlens = lengths(mix, total)
            p = Problem.packed(seqlens, seqlens, HEADS, HEADS, HEAD_DIM, "causal", BLOCK_M,
                               BLOCK_N)
            longest = max(len(rows) for b in range(p.batch) for rows in p.chain_rows_of(b))
            bound = max(p.num_visits * (1 + rho) / workers, longest * (1 + rho))
            dag, sim = {}, {}
            with one_thread():
                for name in NAMES:
                    s = build_schedule(p, name, workers).validate()
                    dag[name] = critical_path(s, "sync", 1.0, rho).length
                    sim[name] = simulate(s, "sync", 1.0, rho, handoff_latency=latency).makespan
            rows.append({"tokens": total, "mix": mix, "sequences": len(seqlens),
                         "longest": max(seqlens), "visits": p.num_visits, "bound": bound,
                         "dag": dag, "sim": sim, "seqlens": seqlens})
            print(f"{total} {mix:8s} B={len(seqlens):3d} longest={max(seqlens):5d}: "
                  + " ".join(f"{n} {dag[n]:.0f}/{sim[n]:.0f}" for n in NAMES)
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = [
        "# Schedules on ragged packed batches in the DAG model (causal, d = 128, W = "
        f"{report['workers']})", "",
        "`python benchmarks/model_varlen.py --out benchmarks/results` (CPU only). Packed "
        f"causal self-attention, {HEADS} heads, d = {HEAD_DIM}, tiles {BLOCK_M} x {BLOCK_N} "
        f"(the CuTe backward's), {report['workers']} workers, `sync` worker model; c = 1 "
        f"per tile pair, r / c = {report['r_over_c']:.4f} and hand-off latency l / c = "
        f"{report['l_over_c']:.3f} from `{report['calibration']}` (as in "
        "`model_portable.py`). Lengths: `equal` 2048 each, `uniform` drawn from 1 - 4096, "
        "`heavy` log-normal with median 512 and sigma 1.5 (Python's `random`, seed "
        f"{SEED}; the last sequence cut to the total; every length in `model_varlen.json`).",
        "",
        "Each cell: the DAG model's critical path / the simulator with the hand-off latency, "
        "in units of c; `bound` is max(total work / W, longest chain), each visit costing "
        "c + r. `lpt` (head group by head group, longest chain first, `descending`'s orders) "
        "and the "
        "other four are portable: the same bits for every W and, per sequence, for every "
        "packing. `best other / lpt`: the fastest of the other four over `lpt`, simulated "
        "(above 1: `lpt` is faster).", "",
        "| tokens | mix | sequences | longest | bound | " + " | ".join(NAMES)
        + " | best other / lpt (sim) | lpt / bound (dag) |",
        "|---" * (7 + len(NAMES)) + "|",
    ]
    for r in report["rows"]:
        others = min(r["sim"][n] for n in NAMES if n != "lpt")
        lines.append(
            f"| {r['tokens']} | {r['mix']} | {r['sequences']} | {r['longest']} | "
            f"{r['bound']:.0f} | "
            + " | ".join(f"{r['dag'][n]:.0f} / {r['sim'][n]:.0f}" for n in NAMES)
            + f" | {others / r['sim']['lpt']:.3f} | {r['dag']['lpt'] / r['bound']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return model_main("model_varlen", __doc__.splitlines()[0], HEAD_DIM, run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
