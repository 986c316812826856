"""The performance model: a schedule as a DAG, its event simulator, and Gantt charts.

- :mod:`~dash_ref.model.dag`: tasks and edges, the critical path, the lemma behind shift
  scheduling;
- :mod:`~dash_ref.model.simulator`: per-worker timelines of a schedule under costs ``c``,
  ``r`` (and an optional hand-off latency);
- :mod:`~dash_ref.model.gantt`: those timelines as text or PNG.
"""

from .dag import DAG, MODELS, CriticalPath, build_dag, critical_path
from .gantt import save_gantt, text_timeline
from .simulator import SimResult, simulate

__all__ = ["DAG", "MODELS", "CriticalPath", "SimResult", "build_dag", "critical_path",
           "save_gantt", "simulate", "text_timeline"]
