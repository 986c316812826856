"""Generated numbers and transcripts inside the Markdown pages.

A number the prose quotes is written between two HTML comments, which a repository
browser hides::

    <!--n:order.fp32_differ_pct:.1f-->31.8<!--/n-->

``order.fp32_differ_pct`` is a key of ``docs/figures/numbers.json`` and ``.1f`` an optional
format spec after a colon (a ``|`` would split a Markdown table cell); the default is
``str`` for ints and strings, ``.3g`` for floats. A command transcript is a fenced block
between ``<!--begin:NAME-->`` and ``<!--end:NAME-->`` whose body is
``docs/figures/NAME.txt``; a generated Markdown part (a table) sits between
``<!--begin-md:NAME-->`` and ``<!--end-md:NAME-->`` and is ``docs/figures/NAME.md``, as is.
:func:`refresh` rewrites all three from fresh data.

A marker must not start a line (a line that starts with ``<!--`` is an HTML block in
Markdown, shown raw) nor sit inside code (shown literally). ``tests/test_docs.py`` checks
that, and that the pages and the data agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

NUMBER = re.compile(r"<!--n:([\w.\-]+)(?::([^>]*?))?-->(.*?)<!--/n-->", re.S)
BLOCK = re.compile(r"(<!--begin:([\w.\-]+)-->\n)(.*?)(<!--end:\2-->)", re.S)
MARKDOWN = re.compile(r"(<!--begin-md:([\w.\-]+)-->\n)(.*?)(<!--end-md:\2-->)", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def code_spans(text: str, inline: bool = True) -> list[tuple[int, int]]:
    """``(start, end)`` of every fenced block and (with ``inline``) inline code span.

    Markdown shows comments inside code literally, so markers there are not markers: the
    functions below skip them.
    """
    spans = [m.span() for m in FENCE.finditer(text)]
    if inline:
        outside = FENCE.sub(lambda m: " " * len(m.group(0)), text)
        spans += [m.span() for m in INLINE_CODE.finditer(outside)]
    return spans


def _in(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in spans)


def fmt(value: object, spec: str | None = None) -> str:
    """How a value of ``numbers.json`` is printed in the prose."""
    if spec:
        return format(value, spec)
    if isinstance(value, float):
        return format(value, ".3g")
    return str(value)


def numbers_in(text: str) -> Iterator[tuple[str, str | None, str]]:
    """``(key, spec, shown text)`` of every generated number in a page."""
    code = code_spans(text)
    for m in NUMBER.finditer(text):
        if not _in(m.start(), code):
            yield m.group(1), m.group(2), m.group(3)


def blocks_in(text: str) -> Iterator[tuple[str, str]]:
    """``(name, body)`` of every generated transcript block (body without the fence)."""
    for m in BLOCK.finditer(text):
        yield m.group(2), unfence(m.group(3))


def markdown_in(text: str) -> Iterator[tuple[str, str]]:
    """``(name, body)`` of every generated Markdown part of a page."""
    for m in MARKDOWN.finditer(text):
        yield m.group(2), m.group(3)


def fence(body: str) -> str:
    return "```text\n" + body.rstrip("\n") + "\n```\n"


def unfence(block: str) -> str:
    lines = block.strip("\n").split("\n")
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].startswith("```"):
        lines = lines[:-1]
    return "\n".join(lines)


def refresh(text: str, numbers: Mapping[str, object], transcripts: Mapping[str, str],
            markdown: Mapping[str, str] | None = None) -> str:
    """``text`` with every generated number, transcript block and Markdown part rewritten.

    Unknown keys are left as they are (the test reports them).
    """
    code = code_spans(text)

    def number(m: re.Match) -> str:
        key, spec = m.group(1), m.group(2)
        if key not in numbers or _in(m.start(), code):
            return m.group(0)
        return f"<!--n:{key}{':' + spec if spec else ''}-->{fmt(numbers[key], spec)}<!--/n-->"

    def block(m: re.Match) -> str:
        name = m.group(2)
        if name not in transcripts:
            return m.group(0)
        return m.group(1) + fence(transcripts[name]) + m.group(4)

    def part(m: re.Match) -> str:
        name = m.group(2)
        if markdown is None or name not in markdown:
            return m.group(0)
        return m.group(1) + markdown[name].rstrip("\n") + "\n" + m.group(4)

    text = NUMBER.sub(number, text)
    text = MARKDOWN.sub(part, text)
    return BLOCK.sub(block, text)


def refresh_pages(docs: Path, numbers: Mapping[str, object],
                  transcripts: Mapping[str, str], markdown: Mapping[str, str] | None = None
                  ) -> list[Path]:
    """Rewrite every ``*.md`` under ``docs`` whose generated parts changed; return them."""
    changed = []
    for page in sorted(docs.glob("*.md")):
        old = page.read_text()
        new = refresh(old, numbers, transcripts, markdown)
        if new != old:
            page.write_text(new)
            changed.append(page)
    return changed
