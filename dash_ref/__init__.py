"""dash_ref: schedules as data, the DAG model, and a tile-level reference of the backward."""

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

# the DAG model, the event simulator and their renderings (DESIGN.md section 4)
from .dag import DAG, CriticalPath, build_dag, critical_path  # noqa: E402
from .gantt import save_gantt, text_timeline  # noqa: E402
from .simulator import SimResult, simulate  # noqa: E402

__all__ += [
    "DAG",
    "CriticalPath",
    "SimResult",
    "build_dag",
    "critical_path",
    "save_gantt",
    "simulate",
    "text_timeline",
]

# exact rounding on raw bits, ULPs and the fp32 add contract (DESIGN.md section 5)
from .numerics import (  # noqa: E402
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

__all__ += [
    "NAN_DISTANCE",
    "bf16_bits",
    "bits_bf16",
    "bits_f32",
    "bits_fp16",
    "f32_bits",
    "flush_subnormals_f32",
    "fp16_bits",
    "fp32_add_rne",
    "round_f32_to",
    "ulp",
    "ulp_distance",
    "ulp_error",
    "unit_roundoff",
]
