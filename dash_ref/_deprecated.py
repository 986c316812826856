"""Old module paths, kept importable for one release with a ``DeprecationWarning``.

A package that moved modules calls :func:`alias_modules` with ``{old: new}``; importing an
old path then warns and hands back the module at the new path (the same object, so
``isinstance`` checks and monkeypatching see one module). Delete the entries, and this
file with the last of them, one release after the move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Mapping


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec):
        warnings.warn(f"{self.old} moved to {self.new}; the old path goes away in the next "
                      "release", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._original = (module.__spec__, module.__loader__)
        return module

    def exec_module(self, module) -> None:
        # the module is already executed; the import system has just stamped the alias's
        # spec on it, so give it back its own
        module.__spec__, module.__loader__ = self._original


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.moved: dict[str, str] = {}

    def find_spec(self, fullname, path=None, target=None):
        new = self.moved.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, new))


_FINDER = _AliasFinder()


def alias_modules(moved: Mapping[str, str]) -> None:
    """Make each old module path in ``moved`` import the module at its new path."""
    _FINDER.moved.update(moved)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
