"""Regenerate ``dash_ref/schedules/auto_table.json`` (``schedule="auto"``) from a benchmark.

For every grid cell of a ``bench_attention.py`` JSON, the entry names the deterministic
schedule with the highest backward TFLOP/s. Differences under ``--tie`` (default 1%) are
within run-to-run noise; among schedules that close to the best, the paper's advice wins
if it is one of them, else the fastest::

    python benchmarks/make_auto_table.py benchmarks/results/bench_attention.json

``--head-dims-report`` adds the head-dim cells of a ``bench_features.py`` report run with
``--schedules`` (head dims beyond the grid's, on their own tiles; a cell of ``d`` / ``d_v``
gives the entry of ``d``), their TFLOP/s from the median backward times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dash_ref import DETERMINISTIC, Problem
from dash_ref.schedules.auto import TABLE, paper_advice


def head_dim_speeds(report: dict) -> dict[tuple, dict[str, float]]:
    """``{(backend, mask, d, S): {schedule: backward TFLOP/s}}`` of a ``bench_features.py``
    report's head-dim cells, from each ``BACKEND:SCHEDULE`` row's median backward time."""
    cells: dict[tuple, dict[str, float]] = {}
    for c in report["cells"]:
        if c["kind"] != "headdims":
            continue
        mask = "causal" if c["causal"] else "full"
        flops = Problem(c["batch"], c["heads"], c["heads"], c["seqlen"], c["seqlen"],
                        c["head_dim"], mask, head_dim_v=c["head_dim_v"]).flops_backward()
        for row, ms in c["median_ms"]["backward"].items():
            backend, _, name = row.rpartition(":")
            if backend and name in DETERMINISTIC:
                cells.setdefault((backend, mask, c["head_dim"], c["seqlen"]), {})[name] = \
                    round(flops / ms / 1e9, 1)
    return cells


def make_table(report: dict, tie: float = 0.01, source: str = "",
               head_dims: dict | None = None, head_dims_source: str = "") -> dict:
    """The table of ``report`` (a ``bench_attention.py`` JSON) and of ``head_dims`` (a
    ``bench_features.py`` JSON, :func:`head_dim_speeds`)."""
    cells: dict[tuple, dict[str, float]] = {}
    for r in report["results"]:
        backend, _, name = r["impl"].rpartition(":")  # BACKEND:SCHEDULE rows of dash_cuda
        backend = "triton" if backend == "dash" else backend  # rows from before backends
        if name in DETERMINISTIC and "bwd_tflops" in r:
            cells.setdefault((backend, r["mask"], r["d"], r["S"]), {})[name] = r["bwd_tflops"]
    if head_dims is not None:
        cells.update(head_dim_speeds(head_dims))
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
    table = {"source": source, "gpu": env.get("gpu"), "git_revision": env.get("git_revision"),
             "num_workers": env.get("num_workers"), "tie": tie, "entries": entries}
    if head_dims is not None:
        table["head_dims_source"] = head_dims_source
        table["head_dims_git_revision"] = head_dims.get("git_revision")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--out", type=Path, default=TABLE)
    ap.add_argument("--tie", type=float, default=0.01)
    ap.add_argument("--head-dims-report", type=Path, default=None,
                    help="a bench_features.py JSON whose head-dim cells join the table")
    args = ap.parse_args(argv)
    extra = args.head_dims_report
    table = make_table(json.loads(args.report.read_text()), args.tie, args.report.as_posix(),
                       None if extra is None else json.loads(extra.read_text()),
                       "" if extra is None else extra.as_posix())
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for e in table["entries"]:
        print(f"{e['backend']:<7} {e['mask']:<7} d={e['head_dim']:<4} S={e['seqlen']:<6} "
              f"{e['schedule']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
