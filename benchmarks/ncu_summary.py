"""Side-by-side hardware counters of the main kernel of every range ``ncu_workload.py`` ran.

Reads ``raw.csv`` (``ncu --import report.ncu-rep --page raw --csv``) and ``ranges.json``
from the profile folder, splits the kernels into ranges at the ``spin_kernel`` markers, takes
each range's longest kernel (the attention kernel; the others are the small pre- and
post-passes) and writes ``ncu_summary.json`` and ``ncu_summary.md`` there::

    python benchmarks/ncu_summary.py OUT/profile [--out benchmarks/results --tag ncu_compare]

Pipe and issue figures are percentages of the peak sustained rate over the kernel's active
cycles; stall figures are ncu's average warps stalled per issued instruction, per reason
(the largest first).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

from harness import profile_main, ranges_of

# (column label, candidate metric names: the first present in the export is used)
METRICS = [
    ("time us", ["gpu__time_duration.sum"]),
    ("SM GHz", ["smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second"]),
    ("tensor %", ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                  "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                  "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"]),
    ("issue %", ["smsp__issue_active.avg.pct_of_peak_sustained_active"]),
    ("MUFU %", ["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
                "sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active"]),
    ("FMA %", ["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"]),
    ("ALU %", ["sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"]),
    ("LSU %", ["sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"]),
    ("instr (M)", ["smsp__inst_executed.sum"]),
    ("regs", ["launch__registers_per_thread"]),
    ("DRAM %", ["dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]),
    ("L2 hit %", ["lts__t_sector_hit_rate.pct"]),
]
# derived: (label, numerator, denominator) as a percentage; SM busy = the average SM's active
# cycles over the elapsed ones (the rest is tail and imbalance), least busy = the same of the
# SM that worked least
DERIVED = [
    ("SM busy %", "sm__cycles_active.avg", "sm__cycles_elapsed.avg"),
    ("least busy SM %", "sm__cycles_active.min", "sm__cycles_elapsed.avg"),
]
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
              "ms": 1e3, "second": 1e6, "s": 1e6}


def read_raw(path: Path) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    """(columns, units, one dict per kernel) of ncu's raw CSV (header row, units row, data)."""
    rows = list(csv.reader(path.open()))
    header = rows[0]
    units = dict(zip(header, rows[1]))
    return header, units, [dict(zip(header, r)) for r in rows[2:] if len(r) == len(header)]


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def summarize(folder: Path) -> dict:
    header, units, kernels = read_raw(folder / "raw.csv")
    time_col = "gpu__time_duration.sum"
    scale = TIME_UNITS.get(units.get(time_col, "usecond"), 1.0)
    rows = []
    for meta, group in ranges_of(folder, kernels, "raw.csv", lambda k: k.get("Kernel Name", "")):
        main = max(group, key=lambda k: number(k.get(time_col, "")) or 0.0)
        rec = dict(meta)
        rec["kernel"] = main.get("Kernel Name", "")[:60]
        rec["kernels_in_range"] = len(group)
        rec["range_us"] = sum((number(k.get(time_col, "")) or 0.0) for k in group) * scale
        for label, names in METRICS:
            name = next((n for n in names if n in main), None)
            value = number(main[name]) if name else None
            if value is not None and label == "time us":
                value *= scale
            if value is not None and label == "SM GHz":
                value /= 1e9 if value > 1e6 else 1.0
            if value is not None and label == "instr (M)":
                value /= 1e6
            rec[label] = value
            rec.setdefault("metric_names", {})[label] = name
        for label, num, den in DERIVED:
            a, b = number(main.get(num, "")), number(main.get(den, ""))
            rec[label] = 100 * a / b if a is not None and b else None
        stalls = {m.group(1): number(main[c]) for c in header if (m := STALL.match(c))}
        rec["stalls"] = dict(sorted(((k, v) for k, v in stalls.items() if v),
                                    key=lambda kv: -kv[1]))
        rows.append(rec)
    return {"rows": rows}


def markdown(report: dict) -> str:
    labels = [label for label, _ in METRICS] + [label for label, _, _ in DERIVED]
    head = ["# Nsight Compute: the main kernel of each range", "",
            f"`{report['command']}`; git {report['git_revision']}; clocks not locked, each "
            "kernel replayed alone with caches flushed between passes (ncu's defaults "
            "besides `--clock-control none`)", ""] if report.get("command") else []
    lines = head + ["| d | mask | S | impl | pass | " + " | ".join(labels)
             + " | top stalls (warps per issue) |", "|" + "---|" * (6 + len(labels))]
    for r in report["rows"]:
        cells = []
        for label in labels:
            v = r.get(label)
            cells.append("-" if v is None else (f"{v:.0f}" if label == "regs" else f"{v:.2f}"
                                                if label == "SM GHz" else f"{v:.1f}"))
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["stalls"].items())[:5])
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {r['impl']} | {r['pass']} | "
                     + " | ".join(cells) + f" | {top} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return profile_main(argv, "ncu_summary", __doc__.splitlines()[0], "raw.csv", summarize,
                        markdown)


if __name__ == "__main__":
    sys.exit(main())
