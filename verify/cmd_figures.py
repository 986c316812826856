"""``dash-verify figures``: regenerate the documentation's figures (see :mod:`docs.figures`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _docs_figures():
    """Import ``docs.figures`` from the repository (``docs/`` lives beside ``verify/``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "docs" / "figures.py").exists():
        raise SystemExit("dash-verify figures needs the repository's docs/ folder")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from docs import figures

    return figures


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("figures", help="regenerate the documentation's figures and numbers")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="where to write (default: docs/figures, which also refreshes the "
                        "numbers quoted in the pages)")
    p.add_argument("--fast", action="store_true",
                   help="sections 1-3 and fingerprints only (a few seconds)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    figures = _docs_figures()
    figures.generate(args.out or figures.DEFAULT_OUT, fast=args.fast)
    return 0
