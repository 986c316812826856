"""dash_ref: schedules as data, the DAG model, and a tile-level reference of the backward.

- :mod:`~dash_ref.problem`, :mod:`~dash_ref.schedule`, :mod:`~dash_ref.auto`: a problem's
  tiling, every schedule built once as data, and what ``auto`` picks;
- :mod:`~dash_ref.dag`, :mod:`~dash_ref.simulator`, :mod:`~dash_ref.gantt`: the DAG model,
  its event simulator and their pictures (``DESIGN.md`` section 4);
- :mod:`~dash_ref.emulate`: the tile-level forward and the schedule-ordered backward;
- :mod:`~dash_ref.numerics`, :mod:`~dash_ref.tensorcore`, :mod:`~dash_ref.exp2`: exact
  rounding on raw bits and fused multiply-adds, Hopper's tensor-core arithmetic, and an
  exp2 a kernel can compute and the CPU replay (``DESIGN.md`` sections 5 and 6).
"""

from .dag import DAG, CriticalPath, build_dag, critical_path
from .gantt import save_gantt, text_timeline
from .numerics import (
    NAN_DISTANCE,
    bf16_bits,
    bits_bf16,
    bits_f32,
    bits_fp16,
    f32_bits,
    flush_subnormals_f32,
    fp16_bits,
    fp32_add_rne,
    round_f32_to,
    ulp,
    ulp_distance,
    ulp_error,
    unit_roundoff,
)
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
from .simulator import SimResult, simulate

__all__ = [
    "DAG",
    "DETERMINISTIC",
    "NAMES",
    "NAN_DISTANCE",
    "Chain",
    "CriticalPath",
    "Problem",
    "Schedule",
    "ScheduleError",
    "ScheduleTables",
    "SimResult",
    "bf16_bits",
    "bits_bf16",
    "bits_f32",
    "bits_fp16",
    "build_dag",
    "build_schedule",
    "critical_path",
    "default_schedule",
    "f32_bits",
    "flush_subnormals_f32",
    "fp16_bits",
    "fp32_add_rne",
    "round_f32_to",
    "save_gantt",
    "simulate",
    "text_timeline",
    "ulp",
    "ulp_distance",
    "ulp_error",
    "unit_roundoff",
]
