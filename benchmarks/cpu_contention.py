"""The CPU jobs on a busy machine: idle, beside busy PyTorch processes, and forced to one thread.

The tile emulator runs thousands of small tensor operations; split across threads, every one
waits for a descheduled thread when other processes keep the cores busy. The library runs
that work on one thread (``dash_ref.cpu``). This measures it: each workload runs

* ``idle``: alone;
* ``busy``: beside ``--busy`` processes that multiply 2000 x 2000 matrices in a loop (each
  with PyTorch's default thread count), as is;
* ``busy, OMP_NUM_THREADS=1``: the same, with the workload forced to one thread;

``--repeats`` times each, in alternation, and reports the medians and the ratio ``busy /
busy-one-thread`` (target: at most 1.3)::

    python benchmarks/cpu_contention.py --out benchmarks/results [--workloads demo figures]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import save_report

ROOT = Path(__file__).resolve().parents[1]
BUSY = ("import torch\n"
        "a = torch.randn(2000, 2000)\n"
        "while True:\n"
        "    a @ a\n")


def workloads(tmp: str) -> dict[str, list[str]]:
    return {
        "demo": [sys.executable, "-m", "verify.cli", "demo"],
        "figures": [sys.executable, "-m", "docs.figures", "--out", tmp],  # a scratch folder
    }


def timed(cmd: list[str], one_thread: bool) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workloads", nargs="+", default=["demo"], choices=["demo", "figures"])
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside the workload")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = workloads(tmp)
        for name in args.workloads:
            cmd = jobs[name]
            times: dict[str, list[float]] = {"idle": [], "busy": [], "busy_one_thread": []}
            for r in range(args.repeats):
                times["idle"].append(timed(cmd, one_thread=False))
                busy = [subprocess.Popen([sys.executable, "-c", BUSY])
                        for _ in range(args.busy)]
                try:
                    time.sleep(2)  # let the busy processes reach their loop
                    # alternate the order, so neither condition always runs first
                    for one in ((False, True) if r % 2 == 0 else (True, False)):
                        key = "busy_one_thread" if one else "busy"
                        times[key].append(timed(cmd, one_thread=one))
                finally:
                    for p in busy:
                        p.kill()
                        p.wait()
                print(f"{name} round {r + 1}: " + ", ".join(
                    f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
            med = {k: statistics.median(v) for k, v in times.items()}
            shown = " ".join("TMPDIR" if part == tmp else part for part in cmd[1:])
            rows.append({"workload": name, "command": shown, "times_s": times,
                         "median_s": med,
                         "busy_over_one_thread": med["busy"] / med["busy_one_thread"],
                         "busy_over_idle": med["busy"] / med["idle"]})
    env = {"cpus": os.cpu_count(), "python": platform.python_version(),
           "machine": platform.machine(), "busy_processes": args.busy,
           "repeats": args.repeats}
    lines = ["# The CPU jobs on a busy machine", "",
             f"`python benchmarks/cpu_contention.py --out benchmarks/results --workloads "
             f"{' '.join(args.workloads)}` on {env['cpus']} CPUs; busy = {args.busy} "
             "processes multiplying 2000 x 2000 matrices in a loop; medians of "
             f"{args.repeats} runs. Target: busy / busy-one-thread <= 1.3.", "",
             "| workload | idle | busy | busy, OMP_NUM_THREADS=1 | busy / one thread | "
             "busy / idle |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        m = row["median_s"]
        lines.append(f"| `{row['command']}` | {m['idle']:.1f} s | {m['busy']:.1f} s | "
                     f"{m['busy_one_thread']:.1f} s | {row['busy_over_one_thread']:.2f} | "
                     f"{row['busy_over_idle']:.2f} |")
    save_report(args.out, "cpu_contention", {"environment": env, "rows": rows},
                "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
