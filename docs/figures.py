"""Regenerate every figure of the docs, the numbers the prose quotes, and the transcripts.

    python -m docs.figures [--out DIR] [--fast]

Writes PNG figures, ``numbers.json`` (every number the pages quote), ``*.txt`` command
transcripts and ``*.md`` generated tables (the arithmetic contract of ``design.md``) into
``DIR`` (default ``docs/figures``). When ``DIR`` is ``docs/figures`` the generated numbers,
transcripts and tables inside the Markdown pages are refreshed too (:mod:`docs.markers`),
and a full run rewrites ``docs/api.md``.

``--fast`` draws sections 1 to 3 and writes section 5's fingerprint table and the
contract table (5-15 s on two cores); the full set (25-60 s) adds section 4 (every
schedule emulated, exact mpmath gradients) and the ``dash-verify`` transcripts of section 5.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import audit, contract, order, schedules
from .markers import refresh_pages

DOCS = Path(__file__).resolve().parent
DEFAULT_OUT = DOCS / "figures"
NUMBERS = "numbers.json"


def generate(out: Path = DEFAULT_OUT, fast: bool = False, pages: bool | None = None,
             log: Callable[[str], None] = print) -> dict:
    """Write the figures, numbers and transcripts into ``out``; return what was written.

    ``pages`` (default: ``out`` is ``docs/figures``) refreshes the Markdown pages.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if pages is None:
        pages = out.resolve() == DEFAULT_OUT.resolve()
    t0 = time.perf_counter()
    numbers: dict = {}
    figures: dict = {}
    texts: dict = {}

    def step(label: str) -> None:
        log(f"  {label:<46} {time.perf_counter() - t0:6.1f} s")

    n, f = order.run(out)
    numbers.update(n)
    figures.update(f)
    step("1 order of additions")
    n, f = schedules.run(out)
    numbers.update(n)
    figures.update(f)
    step("2-3 tiles, schedules, DAG, lemma")
    tables = {"contract": contract.render()}
    step("design: the arithmetic contract")
    n, texts["fingerprints"] = audit.fingerprint_table(emulate_bits=not fast)
    numbers.update(n)
    step("5 fingerprints" + ("" if fast else " (with emulated bits)"))
    if not fast:
        from . import bits

        n, f, t = bits.run(out)
        numbers.update(n)
        figures.update(f)
        texts.update(t)
        step("4 bits and errors (emulator, mpmath)")
        n, t = audit.transcripts()
        numbers.update(n)
        texts.update(t)
        step("5 dash-verify transcripts")
        from . import mufu

        n, f = mufu.run(out)
        numbers.update(n)
        figures.update(f)
        step("6 the hardware's exp2 (the shipped tables)")

    for name, text in texts.items():
        (out / f"{name}.txt").write_text(text.rstrip("\n") + "\n")
    for name, text in tables.items():
        (out / f"{name}.md").write_text(text.rstrip("\n") + "\n")
    path = out / NUMBERS
    if fast and path.exists():  # keep the numbers of the sections a fast run skips
        numbers = {**json.loads(path.read_text()), **numbers}
    path.write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    changed = []
    if pages:
        all_texts = {p.stem: p.read_text() for p in out.glob("*.txt")}
        all_tables = {p.stem: p.read_text() for p in out.glob("*.md")}
        changed = refresh_pages(DOCS, numbers, all_texts, all_tables)
        if not fast:
            from .api import render

            (DOCS / "api.md").write_text(render())
    elapsed = time.perf_counter() - t0
    log(f"wrote {len(figures)} figures, {len(texts)} transcripts and {NUMBERS} to {out} "
        f"in {elapsed:.1f} s" + (f"; refreshed {len(changed)} pages" if changed else ""))
    return {"figures": sorted(figures), "transcripts": sorted(texts), "tables": sorted(tables),
            "numbers": numbers,
            "pages": [str(p) for p in changed], "seconds": elapsed}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help="where to write (default: docs/figures, which also refreshes "
                             "the numbers quoted in the pages)")
    parser.add_argument("--fast", action="store_true",
                        help="sections 1-3 and fingerprints only (a few seconds)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    generate(args.out, args.fast)
    return 0


if __name__ == "__main__":
    sys.exit(main())
