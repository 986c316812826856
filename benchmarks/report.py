"""Where every benchmark puts its results: ``STEM.json`` (the data) and ``STEM.md`` (the table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def git_revision(full: bool = False) -> str:
    """The revision the results come from: ``$DASH_GIT_REV`` (the GPU machine's copy has no
    git history, so the caller passes it in), else git's (short unless ``full``), else
    ``"unknown"``."""
    rev = os.environ.get("DASH_GIT_REV")
    if rev:
        return rev
    try:
        return subprocess.run(["git", "rev-parse", *([] if full else ["--short"]), "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(script: str, argv: list[str] | None) -> dict[str, str]:
    """``command`` (how to run ``benchmarks/SCRIPT`` again, with the arguments it was given:
    ``argv``, or the process's own) and ``git_revision`` of a report."""
    args = argv if argv is not None else sys.argv[1:]
    return {"command": " ".join(["python", f"benchmarks/{script}", *args]),
            "git_revision": git_revision()}


def no_cuda(tool: str) -> bool:
    """True, after a one-line message on stderr, where this process sees no CUDA device: a
    GPU benchmark's ``main`` then exits 2."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"{tool}: needs a CUDA device", file=sys.stderr)
    return True


def save_report(out: Path, stem: str, report: dict, table: str) -> None:
    """``OUT/STEM.json`` (every measurement) and ``OUT/STEM.md`` (the table); prints the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{stem}.md").write_text(table)
    print(table)
