"""Schedules as data: a problem's tiling, every schedule built once, and what ``auto`` picks.

- :mod:`~dash_ref.schedules.problem`: :class:`Problem`, the shape and its tiles;
- :mod:`~dash_ref.schedules.schedule`: :func:`build_schedule`, :class:`Schedule` (visit
  orders, dQ orders, validity checks, fingerprint, the kernel tables);
- :mod:`~dash_ref.schedules.auto`: the measured table behind ``schedule="auto"``.
"""

from .auto import auto_schedule
from .problem import MASKS, Problem
from .schedule import (
    DETERMINISTIC,
    NAMES,
    PORTABLE,
    Chain,
    Schedule,
    ScheduleError,
    ScheduleTables,
    build_schedule,
    default_schedule,
    resolve_name,
)

__all__ = [
    "DETERMINISTIC",
    "MASKS",
    "NAMES",
    "PORTABLE",
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
