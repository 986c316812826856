"""Sweep the backward's tile shape, warps, stages and prefetch per head dim; commit the table.

Each candidate runs ``bench_backward.py`` in a subprocess with ``DASH_CUDA_BWD_TILES`` set
(``BM,BN,warps,stages,prefetch``), on full and causal masks at two
lengths, for ``shift``, ``symmetric_shift`` and the ``atomic`` peer. Writes
``sweep_tiles.json`` and ``sweep_tiles.md`` to ``--out``; the winner per head dim is the
candidate with the best geometric mean of the best deterministic schedule's TFLOP/s::

    PYTHONPATH=. python benchmarks/sweep_tiles.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from report import save_report

CANDIDATES = {  # head dim -> (BM, BN, warps, stages, prefetch)
    64: [(64, 128, 8, 1, 1), (64, 128, 8, 2, 1), (64, 128, 4, 1, 1), (128, 128, 8, 1, 0),
         (128, 64, 8, 1, 1), (64, 64, 4, 1, 1), (32, 128, 8, 1, 1)],
    128: [(64, 128, 8, 1, 0), (64, 128, 8, 2, 0), (128, 64, 8, 1, 0), (64, 64, 4, 1, 0),
          (64, 64, 8, 1, 1), (128, 128, 8, 1, 0)],
}
SCHEDULES = ("shift", "symmetric_shift", "atomic")


def run_candidate(d: int, cfg: tuple, out: Path, seqlens: list[int]) -> list[dict]:
    tag = f"sweep_d{d}_" + "_".join(map(str, cfg))
    env = dict(os.environ, DASH_CUDA_BWD_TILES=f"{d}:" + ",".join(map(str, cfg)))
    cmd = [sys.executable, str(Path(__file__).with_name("bench_backward.py")), "--out",
           str(out), "--tag", tag, "--head-dims", str(d), "--schedules", *SCHEDULES,
           "--no-cudnn", "--seqlens", *map(str, seqlens)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    path = out / f"{tag}.json"
    if proc.returncode or not path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        print(f"d={d} {cfg}: FAILED {tail[0][:200]}", flush=True)
        return [{"d": d, "config": cfg, "error": tail[0][:500]}]
    rows = json.loads(path.read_text())["results"]
    path.unlink()
    (out / f"{tag}.md").unlink(missing_ok=True)
    for r in rows:
        r["config"] = cfg
    return rows


def score(rows: list[dict]) -> float:
    """Geometric mean over cells of the best deterministic schedule's TFLOP/s."""
    best: dict[tuple, float] = {}
    for r in rows:
        if r.get("peer") in ("shift", "symmetric_shift") and "tflops" in r:
            key = (r["mask"], r["S"])
            best[key] = max(best.get(key, 0.0), r["tflops"])
    if not best:
        return 0.0
    return math.exp(sum(math.log(v) for v in best.values()) / len(best))


def markdown(results: dict) -> str:
    lines = ["# Backward tile sweep (H200, bf16)", "",
             "`BM, BN, warps, stages, prefetch`; score: geometric "
             "mean of the best deterministic schedule's TFLOP/s over the cells; atomic for "
             "reference.", ""]
    for d, cands in results.items():
        lines += [f"## d = {d}", "", "| config | score | cells (mask S: best det / atomic) |",
                  "|---|---|---|"]
        for cfg, rows in sorted(cands.items(), key=lambda kv: -score(kv[1])):
            cells: dict[tuple, dict] = {}
            for r in rows:
                if "tflops" in r:
                    cells.setdefault((r["mask"], r["S"]), {})[r["peer"]] = r["tflops"]
            text = "; ".join(
                f"{m} {s}: {max(v.get('shift', 0), v.get('symmetric_shift', 0)):.0f} / "
                f"{v.get('atomic', 0):.0f}" for (m, s), v in sorted(cells.items()))
            err = next((r["error"][:80] for r in rows if "error" in r), "")
            lines.append(f"| {cfg} | {score(rows):.1f} | {text or err} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--seqlens", nargs="+", type=int, default=[2048, 16384])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict[str, list]] = {}
    for d, cands in CANDIDATES.items():
        results[d] = {}
        for cfg in cands:
            rows = run_candidate(d, cfg, args.out, args.seqlens)
            results[d][",".join(map(str, cfg))] = rows
            print(f"d={d} {cfg}: score {score(rows):.1f}", flush=True)
    save_report(args.out, "sweep_tiles", {str(d): c for d, c in results.items()},
                markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
