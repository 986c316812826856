"""Print ``red`` if the red.add dQ hand-off beat load-add-store in an A/B, else ``store``.

Reads two ``bench_backward.py`` JSON files (store first, red second) and compares, cell by
cell, the best deterministic schedule's TFLOP/s; ``red`` needs a geometric-mean gain of at
least 2% (below that the difference is within run-to-run noise).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from dash_ref import DETERMINISTIC


def best_per_cell(path: str) -> dict[tuple, float]:
    best: dict[tuple, float] = {}
    for r in json.loads(Path(path).read_text())["results"]:
        if r.get("peer") in DETERMINISTIC and "tflops" in r:
            key = (r["d"], r["mask"], r["S"])
            best[key] = max(best.get(key, 0.0), r["tflops"])
    return best


def main(store_path: str, red_path: str) -> str:
    store, red = best_per_cell(store_path), best_per_cell(red_path)
    common = sorted(set(store) & set(red))
    if not common:
        return "store"
    gain = math.exp(sum(math.log(red[c] / store[c]) for c in common) / len(common))
    print(f"red/store geometric mean over {len(common)} cells: {gain:.3f}", file=sys.stderr)
    return "red" if gain >= 1.02 else "store"


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2]))
