"""Where the warps of each range's main kernel wait, by instruction kind, from Nsight Compute's
source page (``ncu --import report.ncu-rep --page source --csv --print-source sass``).

``scripts/gpu_release.sh profile OUT`` writes ``source.csv`` (in ``OUT/profile.tgz``) beside
``ranges.json``; this splits it into ranges at the ``spin_kernel`` markers, takes each
range's kernel with the most warp samples, and reports the share of its samples at each
opcode (``MUFU.EX2``, ``HGMMA``, ``STS`` ...: a warp is sampled at the instruction it is
about to issue, so a share is time spent waiting to issue that kind of instruction) and how
many instructions of each kind the kernel's code has::

    python benchmarks/ncu_hotspots.py OUT/profile --out benchmarks/results --tag ncu_hotspots
"""

from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

from harness import profile_main, ranges_of

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
TOP = 12


def opcode(sass: str) -> str:
    """``MUFU.EX2`` of ``@!P0 MUFU.EX2 R4, R5 ;``: the opcode with its first modifier."""
    words = [w for w in sass.split() if not w.startswith("@")]
    return ".".join(words[0].split(".")[:2]) if words else ""


def kernels(path: Path) -> list[dict]:
    """Every kernel section of the source page: its name and (address, sass, samples,
    executed) rows."""
    out: list[dict] = []
    header: list[str] = []
    for row in csv.reader(path.open()):
        if row and row[0] == "Kernel Name":
            out.append({"name": row[1] if len(row) > 1 else "", "rows": []})
        elif row and row[0] == "Address":
            header = row
        elif out and header and len(row) == len(header):
            rec = dict(zip(header, row))
            out[-1]["rows"].append((rec["Source"].strip(), int(rec.get(SAMPLES) or 0),
                                    int(rec.get(EXECUTED) or 0)))
    return out


def hotspots(folder: Path) -> dict:
    rows = []
    for meta, group in ranges_of(folder, kernels(folder / "source.csv"), "source.csv",
                                 lambda k: k["name"]):
        main = max(group, key=lambda k: sum(s for _, s, _ in k["rows"]))
        total = sum(s for _, s, _ in main["rows"]) or 1
        by_op: Counter = Counter()
        code: Counter = Counter()
        for sass, samples, executed in main["rows"]:
            op = opcode(sass)
            by_op[op] += samples
            if executed:
                code[op] += 1
        rows.append({**meta, "kernel": main["name"][:60], "samples": total,
                     "share": {op: round(100 * n / total, 2) for op, n in by_op.most_common()},
                     "code": dict(code.most_common())})
    return {"rows": rows}


def markdown(report: dict) -> str:
    head = [f"`{report['command']}`; git {report['git_revision']}", ""] \
        if report.get("command") else []
    lines = ["# Warp samples by opcode (Nsight Compute source page), main kernel of each range",
             "", *head, "Share of the kernel's warp samples at each opcode, the largest first "
             f"({TOP} shown), and how many instructions of the kind its code executes.", "",
             "| d | mask | S | impl | pass | samples at (share %) | STS / STSM / LDS / MUFU.EX2 "
             "in the code |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        top = ", ".join(f"{op} {v:.1f}" for op, v in list(r["share"].items())[:TOP])
        kinds: Counter = Counter()
        for op, n in r["code"].items():
            kinds[op.split(".")[0]] += n
        counts = " / ".join(str(kinds[k]) for k in ("STS", "STSM", "LDS"))
        counts += f" / {r['code'].get('MUFU.EX2', 0)}"
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {r['impl']} | {r['pass']} | "
                     f"{top} | {counts} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return profile_main(argv, "ncu_hotspots", __doc__.splitlines()[0], "source.csv",
                        hotspots, markdown)


if __name__ == "__main__":
    sys.exit(main())
