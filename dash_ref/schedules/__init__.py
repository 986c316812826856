"""Schedules as data: a problem's tiling, every schedule built once, and what ``auto`` picks.

- :mod:`~dash_ref.schedules.mask`: :class:`Mask`, which keys each query row sees (the one
  visibility rule);
- :mod:`~dash_ref.schedules.problem`: :class:`Problem`, the shape and its tiles;
- :mod:`~dash_ref.schedules.schedule`: :func:`build_schedule`, :class:`Schedule` (visit
  orders, dQ orders, validity checks, fingerprint, the kernel tables);
- :mod:`~dash_ref.schedules.auto`: the measured table behind ``schedule="auto"``.
"""

from .auto import auto_schedule
from .mask import MASKS, Mask
from .problem import Problem
from .schedule import (
    BANDED,
    DETERMINISTIC,
    NAMES,
    PORTABLE,
    RAGGED,
    Chain,
    Schedule,
    ScheduleError,
    ScheduleTables,
    build_schedule,
    default_schedule,
    resolve_name,
)

__all__ = [
    "BANDED",
    "DETERMINISTIC",
    "MASKS",
    "Mask",
    "NAMES",
    "PORTABLE",
    "RAGGED",
    "Chain",
    "Problem",
    "Schedule",
    "ScheduleError",
    "ScheduleTables",
    "auto_schedule",
    "build_schedule",
    "default_schedule",
    "resolve_name",
]
