"""Progress of long runs: one line on stderr every few seconds, on a terminal or in a log.

Nothing is printed for a run that ends within the first interval, so quick commands stay
quiet; a long one says how far it is and about how long is left, also when stderr is a
pipe or a file (a progress bar would be a stream of carriage returns there).
"""

from __future__ import annotations

import sys
import time

INTERVAL_S = 5.0


class Progress:
    """Counts done steps; writes ``desc: done/total unit, elapsed, about N s left``."""

    def __init__(self, total: int, desc: str, unit: str = "", enabled: bool = True,
                 interval: float = INTERVAL_S) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.enabled, self.interval = enabled, interval
        self.done = 0
        self.start = time.monotonic()
        self.next = self.start + interval

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now >= self.next:
            self.next = now + self.interval
            elapsed = now - self.start
            left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            unit = f" {self.unit}" if self.unit else ""
            print(f"{self.desc}: {self.done}/{self.total}{unit}, {elapsed:.0f} s, about "
                  f"{left:.0f} s left", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "") -> Progress:
    """A :class:`Progress` of ``total`` steps, silent unless ``enabled``."""
    return Progress(total, desc, unit, enabled)
