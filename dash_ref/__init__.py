"""dash_ref: schedules as data, their performance model, bit-level arithmetic, and emulation.

Three concerns, one subpackage each, and the emulator that joins them:

- :mod:`dash_ref.schedules`: a problem's tiling (:class:`Problem`), every schedule built
  once as data (:func:`build_schedule`, :class:`Schedule`), what ``auto`` picks;
- :mod:`dash_ref.model`: a schedule as a DAG, its critical path, an event simulator and
  Gantt charts;
- :mod:`dash_ref.arithmetic`: exact rounding on raw bits, the tensor-core model, a
  replayable exp2, and the arithmetic contract (:mod:`dash_ref.arithmetic.steps`: every
  floating-point step, named);
- :mod:`dash_ref.emulate`: the tile-level forward and a schedule's backward, built from
  those steps, and :func:`~dash_ref.emulate.replay` of a kernel's dQ partials.

Nothing here needs a GPU, and nothing here imports ``dash_cuda`` or ``verify``.
"""

from .arithmetic.numerics import (
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
from .arithmetic.steps import ARITHMETICS, EXACT, FAST, IEEE, STEPS, Arithmetic
from .model import (
    DAG,
    CriticalPath,
    SimResult,
    build_dag,
    critical_path,
    save_gantt,
    simulate,
    text_timeline,
)
from .schedules import (
    BANDED,
    DETERMINISTIC,
    MASKS,
    NAMES,
    PORTABLE,
    RAGGED,
    Chain,
    Mask,
    Problem,
    Schedule,
    ScheduleError,
    ScheduleTables,
    build_schedule,
    default_schedule,
    resolve_name,
)

#: the version of the whole distribution (dash_ref, dash_cuda, verify), read by the build
__version__ = "0.2.0"

__all__ = [
    "__version__",
    "ARITHMETICS",
    "BANDED",
    "DAG",
    "DETERMINISTIC",
    "EXACT",
    "FAST",
    "IEEE",
    "MASKS",
    "Mask",
    "NAMES",
    "PORTABLE",
    "RAGGED",
    "NAN_DISTANCE",
    "STEPS",
    "Arithmetic",
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
    "resolve_name",
    "round_f32_to",
    "save_gantt",
    "simulate",
    "text_timeline",
    "ulp",
    "ulp_distance",
    "ulp_error",
    "unit_roundoff",
]
