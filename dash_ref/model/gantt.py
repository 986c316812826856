"""Gantt charts of a simulation: a PNG (matplotlib, optional) and a plain-text timeline.

Rows are workers (``sync``) or, for the ``async`` model, two rows per worker: its compute
unit and its dQ writer. Compute is blue / ``#``, reduce orange / ``=``, a reduce blocked on
its dQ semaphore grey / ``~``, idle white / ``.``. Tasks on the critical path (from
:meth:`dash_ref.model.dag.DAG.critical_path`) can be outlined in red.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from .dag import COMPUTE, REDUCE, TaskKey
from .simulator import WAIT, SimResult

CHARS = {COMPUTE: "#", REDUCE: "=", WAIT: "~"}
IDLE_CHAR = "."
COLORS = {COMPUTE: "#4C72B0", REDUCE: "#DD8452", WAIT: "#BBBBBB"}


def _rows(result: SimResult, max_workers: int) -> list[tuple[str, int, tuple[str, ...]]]:
    """``(label, worker, kinds shown on the row)`` for every row of the chart."""
    shown = range(min(result.num_workers, max_workers))
    if result.model == "sync":
        return [(f"w{w}", w, (COMPUTE, REDUCE, WAIT)) for w in shown]
    rows = []
    for w in shown:
        rows.append((f"w{w} c", w, (COMPUTE,)))
        rows.append((f"w{w} r", w, (REDUCE, WAIT)))
    return rows


def _row_of(result: SimResult, rows: Sequence[tuple[str, int, tuple[str, ...]]]
            ) -> dict[tuple[int, str], int]:
    return {(w, kind): n for n, (_, w, kinds) in enumerate(rows) for kind in kinds}


def text_timeline(result: SimResult, width: int = 72, max_workers: int = 32) -> str:
    """A terminal timeline: one line per row, exactly ``width`` characters between ``|``.

    Each column covers ``makespan / width`` of time and shows what fills most of it.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    rows = _rows(result, max_workers)
    row_of = _row_of(result, rows)
    kinds = (COMPUTE, REDUCE, WAIT)
    cover = [[[0.0] * len(kinds) for _ in range(width)] for _ in rows]
    span = result.makespan
    step = span / width if span > 0 else 1.0
    for x in result.intervals:
        n = row_of.get((x.worker, x.kind))
        if n is None or x.end <= x.start:
            continue
        k = kinds.index(x.kind)
        first = min(int(x.start / step), width - 1)
        last = min(int(x.end / step), width - 1)
        for col in range(first, last + 1):
            lo, hi = max(x.start, col * step), min(x.end, (col + 1) * step)
            if hi > lo:
                cover[n][col][k] += hi - lo
    label_w = max((len(label) for label, _, _ in rows), default=2)
    lines = [
        f"{result.name} ({result.model}): makespan {span:g}, idle {result.idle_fraction:.1%}, "
        f"{result.num_workers} workers; one column = {step:.4g}",
        f"legend: {CHARS[COMPUTE]} compute  {CHARS[REDUCE]} reduce  "
        f"{CHARS[WAIT]} waiting on a dQ semaphore  {IDLE_CHAR} idle",
    ]
    for n, (label, _, _) in enumerate(rows):
        bar = []
        for col in range(width):
            c = cover[n][col]
            best = max(range(len(kinds)), key=lambda k, c=c: c[k])
            busy = c[best]
            bar.append(CHARS[kinds[best]] if busy > 0 and busy >= step - sum(c) else IDLE_CHAR)
        lines.append(f"{label:<{label_w}} |{''.join(bar)}|")
    if result.num_workers > max_workers:
        lines.append(f"... {result.num_workers - max_workers} more workers")
    end = f"{span:g}"
    lines.append(" " * (label_w + 2) + "0" + end.rjust(width - 1))
    return "\n".join(lines)


def save_gantt(
    results: SimResult | Sequence[SimResult],
    path: str | os.PathLike,
    critical: Sequence[Iterable[TaskKey] | None] | None = None,
    max_workers: int = 64,
) -> None:
    """Write a PNG with one Gantt panel per result (shared time axis).

    ``critical[k]``, if given, is the set of task keys of result ``k``'s critical path,
    outlined in red. Needs matplotlib (``pip install dash-attention[plot]``).
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("save_gantt needs matplotlib: pip install matplotlib") from e
    if isinstance(results, SimResult):
        results = [results]
    crit = list(critical) if critical is not None else [None] * len(results)
    if len(crit) != len(results):
        raise ValueError("critical must have one entry per result")
    heights = [max(1, len(_rows(r, max_workers))) for r in results]
    fig_h = min(40.0, 1.2 + sum(0.6 + 0.16 * h for h in heights))
    fig = Figure(figsize=(12, fig_h))
    axes = fig.subplots(len(results), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, result, keys in zip(axes, results, crit, strict=True):
        rows = _rows(result, max_workers)
        row_of = _row_of(result, rows)
        bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
        outlined: dict[int, list[tuple[float, float]]] = {}
        keyset = set(keys) if keys is not None else set()
        for x in result.intervals:
            n = row_of.get((x.worker, x.kind))
            if n is None:
                continue
            bars.setdefault((n, x.kind), []).append((x.start, x.end - x.start))
            if x.kind != WAIT and x.key in keyset:
                outlined.setdefault(n, []).append((x.start, x.end - x.start))
        for (n, kind), spans in bars.items():
            ax.broken_barh(spans, (n - 0.4, 0.8), facecolors=COLORS[kind], linewidth=0)
        for n, spans in outlined.items():
            ax.broken_barh(spans, (n - 0.4, 0.8), facecolors="none", edgecolors="red",
                           linewidth=1.2)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        step = max(1, len(rows) // 24)
        ax.set_yticks(range(0, len(rows), step))
        ax.set_yticklabels([rows[n][0] for n in range(0, len(rows), step)], fontsize=7)
        more = f", first {max_workers} of {result.num_workers} workers" \
            if result.num_workers > max_workers else ""
        ax.set_title(f"{result.name} ({result.model}): makespan {result.makespan:g}, "
                     f"idle {result.idle_fraction:.1%}{more}", fontsize=9, loc="left")
    axes[-1].set_xlabel("time")
    handles = [Patch(color=COLORS[k], label=k) for k in (COMPUTE, REDUCE, WAIT)]
    if any(c is not None for c in crit):
        handles.append(Patch(facecolor="none", edgecolor="red", label="critical path"))
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(os.fspath(path), dpi=110, format="png")

