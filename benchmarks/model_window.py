"""Schedules on sliding windows (banded masks) in the DAG model: what ``banded`` buys.

For each window (256, 1024 and 4096 keys, causal ``(w, 0)`` and two-sided ``(w, w)``) at
S = 8k and 16k (self-attention, ``B = 16384 / S`` as in the paper's grid), d = 128 with the
CuTe backward's tiles (64 x 128), 16 heads, W = 132 workers, this builds every schedule on
the windowed :class:`dash_ref.Problem` and reports its predicted makespan in units of
``c`` (one tile pair's compute), two ways:

- ``dag``: the critical path of the DAG model (``dash_ref.model.critical_path``, ``sync``
  worker model, ``c = 1``, ``r = r / c`` of the calibration, every active tile at full cost);
- ``sim``: the simulator with the calibrated hand-off latency on top
  (``dash_ref.model.simulate(..., handoff_latency=l / c)``).

``r / c`` and ``l / c`` for d = 128 come from ``results/model_vs_measured.json``, as in
``model_portable.py`` and ``model_varlen.py`` (the median latency over S = 1k - 4k).
``bound`` is the larger of the total work over W workers and the longest chain; ``load``
is ``banded``'s most loaded worker (its makespan if no visit ever waited). CPU only, about
a minute::

    python benchmarks/model_window.py --out benchmarks/results
"""

from __future__ import annotations

import sys
import time

from harness import model_main

from dash_ref import Problem, build_schedule, critical_path, simulate
from dash_ref.cpu import one_thread

HEAD_DIM, BLOCK_M, BLOCK_N, HEADS, TOKENS = 128, 64, 128, 16, 16384
SEQLENS = (8192, 16384)
WINDOWS = (256, 1024, 4096)
SIDES = ("causal", "two-sided")
NAMES = ("naive", "spt", "descending", "interleaved", "shift", "symmetric_shift", "lpt",
         "banded")
PEERS = ("naive", "descending", "interleaved")  # what banded is held against


def problem(seqlen: int, window: int, side: str) -> Problem:
    """The windowed problem of one cell."""
    causal = side == "causal"
    return Problem(TOKENS // seqlen, HEADS, HEADS, seqlen, seqlen, HEAD_DIM,
                   "causal" if causal else "full", BLOCK_M, BLOCK_N,
                   window_size=(window, 0 if causal else window))


def run(rho: float, latency: float, workers: int) -> list[dict]:
    rows = []
    for s in SEQLENS:
        for side in SIDES:
            for w in WINDOWS:
                t0 = time.perf_counter()
                p = problem(s, w, side)
                longest = max(len(r) for r in p.chain_rows)
                bound = max(p.num_visits * (1 + rho) / workers, longest * (1 + rho))
                dag, sim = {}, {}
                with one_thread():
                    for name in NAMES:
                        sched = build_schedule(p, name, workers).validate()
                        dag[name] = critical_path(sched, "sync", 1.0, rho).length
                        sim[name] = simulate(sched, "sync", 1.0, rho,
                                             handoff_latency=latency).makespan
                        if name == "banded":
                            load = max(sum(len(c.visits) for c in chains)
                                       for chains in sched.workers) * (1 + rho)
                rows.append({"S": s, "batch": p.batch, "side": side, "window": w,
                             "window_size": list(p.window_size), "visits": p.num_visits,
                             "longest_chain": longest, "bound": bound, "load": load,
                             "dag": dag, "sim": sim})
                print(f"S={s} {side:9s} w={w:4d}: "
                      + " ".join(f"{n} {dag[n]:.0f}/{sim[n]:.0f}" for n in NAMES)
                      + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = [
        "# Schedules on sliding windows in the DAG model (d = 128, W = "
        f"{report['workers']})", "",
        "`python benchmarks/model_window.py --out benchmarks/results` (CPU only). "
        f"Self-attention with a sliding window, {HEADS} heads, d = {HEAD_DIM}, B = "
        f"{TOKENS} / S, tiles {BLOCK_M} x {BLOCK_N} (the CuTe backward's), "
        f"{report['workers']} workers, `sync` worker model; c = 1 per tile pair, r / c = "
        f"{report['r_over_c']:.4f} and hand-off latency l / c = {report['l_over_c']:.3f} "
        f"from `{report['calibration']}` (as in `model_portable.py`). `causal`: "
        "`window_size = (w, 0)` (a causal sliding window); `two-sided`: `(w, w)`.", "",
        "Each cell: the DAG model's critical path / the simulator with the hand-off latency, "
        "in units of c; `bound` is max(total work / W, longest chain), each visit costing "
        "c + r; `load` is `banded`'s most loaded worker (its makespan if no visit ever "
        "waited). `banded` (`dash_ref.BANDED`: `descending`'s orders, launched j by j "
        "across the heads of a head group) is portable, as are naive, spt, descending, "
        "interleaved and lpt; "
        "shift and symmetric_shift order their sums by W. `best peer / banded`: the "
        "fastest of naive, descending and interleaved over `banded`, simulated (above 1: "
        "`banded` is faster).", "",
        "| S | B | window | bound | load | " + " | ".join(NAMES)
        + " | best peer / banded (sim) | banded / bound (sim) |",
        "|---" * (7 + len(NAMES)) + "|",
    ]
    for r in report["rows"]:
        peer = min(r["sim"][n] for n in PEERS)
        lines.append(
            f"| {r['S']} | {r['batch']} | {r['side']} {tuple(r['window_size'])} | "
            f"{r['bound']:.0f} | {r['load']:.0f} | "
            + " | ".join(f"{r['dag'][n]:.0f} / {r['sim'][n]:.0f}" for n in NAMES)
            + f" | {peer / r['sim']['banded']:.3f} | {r['sim']['banded'] / r['bound']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return model_main("model_window", __doc__.splitlines()[0], HEAD_DIM, run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
