"""Progress output for long runs: a tqdm bar on stderr, or nothing."""

from __future__ import annotations

import sys


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm progress bar on stderr (which leaves stdout to the report), or a silent one.

    The bar shows on a terminal only: in a log (stderr redirected) it would be a stream of
    carriage returns.
    """
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)
