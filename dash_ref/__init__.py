"""dash_ref: schedules as data, the DAG model, and a tile-level reference of the attention backward."""

from .problem import Problem
from .schedule import (
    DETERMINISTIC,
    NAMES,
    Chain,
    Schedule,
    ScheduleError,
    ScheduleTables,
    build_schedule,
    default_schedule,
)

__all__ = [
    "DETERMINISTIC",
    "NAMES",
    "Chain",
    "Problem",
    "Schedule",
    "ScheduleError",
    "ScheduleTables",
    "build_schedule",
    "default_schedule",
]
