"""Regenerate ``dash_ref/schedules/auto_table.json`` (``schedule="auto"``) from a benchmark.

For every grid cell of a ``bench_attention.py`` JSON, the entry names the deterministic
schedule with the highest backward TFLOP/s. Differences under ``--tie`` (default 1%) are
within run-to-run noise; among schedules that close to the best, the paper's advice wins
if it is one of them, else the fastest::

    python benchmarks/make_auto_table.py benchmarks/results/bench_attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dash_ref import DETERMINISTIC
from dash_ref.schedules.auto import TABLE, paper_advice


def make_table(report: dict, tie: float = 0.01, source: str = "") -> dict:
    cells: dict[tuple, dict[str, float]] = {}
    for r in report["results"]:
        backend, _, name = r["impl"].rpartition(":")  # BACKEND:SCHEDULE rows of dash_cuda
        backend = "triton" if backend == "dash" else backend  # rows from before backends
        if name in DETERMINISTIC and "bwd_tflops" in r:
            cells.setdefault((backend, r["mask"], r["d"], r["S"]), {})[name] = r["bwd_tflops"]
    entries = []
    order = {"cute": 0, "triton": 1}  # the order dash_cuda's backend="auto" tries them
    for (backend, mask, d, s), speeds in sorted(cells.items(),
                                                key=lambda kv: (order.get(kv[0][0], 9), kv[0])):
        best = max(speeds.values())
        close = {n for n, t in speeds.items() if t >= best * (1 - tie)}
        advice = paper_advice(mask, d)
        pick = advice if advice in close else max(speeds, key=speeds.get)
        entries.append({"backend": backend, "mask": mask, "head_dim": d, "seqlen": s,
                        "schedule": pick, "bwd_tflops": speeds[pick],
                        "all_tflops": dict(sorted(speeds.items()))})
    env = report["environment"]
    return {"source": source, "gpu": env.get("gpu"), "git_revision": env.get("git_revision"),
            "num_workers": env.get("num_workers"), "tie": tie, "entries": entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--out", type=Path, default=TABLE)
    ap.add_argument("--tie", type=float, default=0.01)
    args = ap.parse_args(argv)
    table = make_table(json.loads(args.report.read_text()), args.tie, args.report.as_posix())
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for e in table["entries"]:
        print(f"{e['backend']:<7} {e['mask']:<7} d={e['head_dim']:<4} S={e['seqlen']:<6} "
              f"{e['schedule']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
