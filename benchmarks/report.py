"""Where every benchmark puts its results: ``STEM.json`` (the data) and ``STEM.md`` (the table)."""

from __future__ import annotations

import json
from pathlib import Path


def save_report(out: Path, stem: str, report: dict, table: str) -> None:
    """``OUT/STEM.json`` (every measurement) and ``OUT/STEM.md`` (the table); prints the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{stem}.md").write_text(table)
    print(table)
