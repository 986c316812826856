"""Generated numbers and transcripts inside the Markdown pages.

A number the prose quotes is written between two HTML comments, which a repository
browser hides::

    <!--n:order.fp32_differ_pct|.1f-->31.7<!--/n-->

``order.fp32_differ_pct`` is a key of ``docs/figures/numbers.json`` and ``.1f`` an optional
format spec (default: ``str`` for ints and strings, ``.3g`` for floats). A command
transcript is a fenced block between ``<!--begin:NAME-->`` and ``<!--end:NAME-->``, whose
body is ``docs/figures/NAME.txt``. :func:`refresh` rewrites both from fresh data;
``tests/test_docs.py`` checks that the pages and the data agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

NUMBER = re.compile(r"<!--n:([\w.\-]+)(?:\|([^>]*?))?-->(.*?)<!--/n-->", re.S)
BLOCK = re.compile(r"(<!--begin:([\w.\-]+)-->\n)(.*?)(<!--end:\2-->)", re.S)


def fmt(value: object, spec: str | None = None) -> str:
    """How a value of ``numbers.json`` is printed in the prose."""
    if spec:
        return format(value, spec)
    if isinstance(value, float):
        return format(value, ".3g")
    return str(value)


def numbers_in(text: str) -> Iterator[tuple[str, str | None, str]]:
    """``(key, spec, shown text)`` of every generated number in a page."""
    for m in NUMBER.finditer(text):
        yield m.group(1), m.group(2), m.group(3)


def blocks_in(text: str) -> Iterator[tuple[str, str]]:
    """``(name, body)`` of every generated transcript block (body without the fence)."""
    for m in BLOCK.finditer(text):
        yield m.group(2), unfence(m.group(3))


def fence(body: str) -> str:
    return "```text\n" + body.rstrip("\n") + "\n```\n"


def unfence(block: str) -> str:
    lines = block.strip("\n").split("\n")
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].startswith("```"):
        lines = lines[:-1]
    return "\n".join(lines)


def refresh(text: str, numbers: Mapping[str, object], transcripts: Mapping[str, str]) -> str:
    """``text`` with every generated number and transcript block rewritten.

    Unknown keys are left as they are (the test reports them).
    """
    def number(m: re.Match) -> str:
        key, spec = m.group(1), m.group(2)
        if key not in numbers:
            return m.group(0)
        return f"<!--n:{key}{'|' + spec if spec else ''}-->{fmt(numbers[key], spec)}<!--/n-->"

    def block(m: re.Match) -> str:
        name = m.group(2)
        if name not in transcripts:
            return m.group(0)
        return m.group(1) + fence(transcripts[name]) + m.group(4)

    return BLOCK.sub(block, NUMBER.sub(number, text))


def refresh_pages(docs: Path, numbers: Mapping[str, object],
                  transcripts: Mapping[str, str]) -> list[Path]:
    """Rewrite every ``*.md`` under ``docs`` whose generated parts changed; return them."""
    changed = []
    for page in sorted(docs.glob("*.md")):
        old = page.read_text()
        new = refresh(old, numbers, transcripts)
        if new != old:
            page.write_text(new)
            changed.append(page)
    return changed
