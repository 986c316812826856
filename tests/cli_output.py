"""What the tests read of the commands' printed output."""

from __future__ import annotations

import shlex

REPRODUCE = "reproduce: dash-verify "


def reproducer_argv(out: str) -> list[str]:
    """The ``dash-verify`` arguments of the ``reproduce:`` line a failing ``fuzz`` printed
    (``AssertionError`` when it printed none)."""
    lines = [x for x in out.splitlines() if x.startswith(REPRODUCE)]
    assert lines, f"no reproducer line in:\n{out}"
    return shlex.split(lines[0].removeprefix(REPRODUCE))
