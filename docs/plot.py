"""Shared matplotlib plumbing: figures without pyplot state, PNGs without version stamps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

WORKER_COLORS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
                 "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")
MASKED = "#eeeeee"


def figure(width: float, height: float) -> Figure:
    """A new figure (no global pyplot state, so figures can be built in any order)."""
    return Figure(figsize=(width, height))


def save(fig: Figure, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG with no software/version metadata (stable bytes)."""
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})
    return path


def worker_color(w: int) -> str:
    return WORKER_COLORS[w % len(WORKER_COLORS)]
