"""``schedule="auto"``: the schedule measured fastest for a (mask, head dim, length).

The table (``auto_table.json`` beside this file) is data, regenerated from a benchmark run
by ``benchmarks/make_auto_table.py``; each entry names the deterministic schedule with the
highest backward TFLOP/s in one grid cell. A lookup takes the entry of the same mask whose
head dim, then length, is nearest (in log2). Without a table entry for the mask, the
paper's advice applies (full: ``shift``; causal: ``descending`` for ``d >= 128``,
``symmetric_shift`` below). The choice depends on the shape alone, so ``auto`` is as
timing-free as any named schedule.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).with_name("auto_table.json")


def paper_advice(mask: str, head_dim: int) -> str:
    """The DASH paper's advice, used where the table has nothing for ``mask``."""
    if mask == "full":
        return "shift"
    return "descending" if head_dim >= 128 else "symmetric_shift"


@lru_cache(maxsize=1)
def load_table(path: str | None = None) -> tuple[dict, ...]:
    """The entries of ``path`` (default: the packaged table), ``{"mask", "head_dim", ...}``."""
    p = TABLE if path is None else Path(path)
    if not p.exists():
        return ()
    return tuple(json.loads(p.read_text())["entries"])


def auto_schedule(mask: str, head_dim: int, seqlen: int, backend: str | None = None,
                  among: tuple[str, ...] | None = None) -> str:
    """The schedule ``auto`` resolves to for this shape (see the module docstring).

    Entries may name the kernel backend they were measured on (``"backend"``); with
    ``backend`` given, that backend's entries are used where it has any. ``among`` restricts
    the choice to those names: the fastest of them in the nearest entry's measurements
    (``all_tflops``), else the first of them.
    """
    entries = [e for e in load_table() if e["mask"] == mask]
    measured = list(dict.fromkeys(e["backend"] for e in entries if "backend" in e))
    if backend not in measured:  # no entries of its own: those of the first backend listed
        backend = measured[0] if measured else None
    entries = [e for e in entries if e.get("backend") == backend]
    if among is not None:
        entries = [e for e in entries if any(n in e.get("all_tflops", {}) for n in among)]
        if not entries:
            return among[0]
    elif not entries:
        return paper_advice(mask, head_dim)

    def distance(e: dict) -> tuple[float, float, int, int]:
        return (abs(math.log2(e["head_dim"]) - math.log2(max(head_dim, 1))),
                abs(math.log2(e["seqlen"]) - math.log2(max(seqlen, 1))),
                e["head_dim"], e["seqlen"])

    nearest = min(entries, key=distance)
    if among is None:
        return nearest["schedule"]
    measured = nearest["all_tflops"]
    return max((n for n in among if n in measured), key=lambda n: measured[n])
