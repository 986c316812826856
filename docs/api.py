"""Render the API reference (``docs/api.md``) from the docstrings of the public functions.

    python -m docs.api > docs/api.md

``dash_cuda`` is imported lazily: if its import fails (it should not, it needs no GPU to
import), its section says so instead of failing.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

SECTIONS: list[tuple[str, str, list[str]]] = [
    ("Problems and schedules", "dash_ref",
     ["Problem", "Mask", "build_schedule", "resolve_name", "default_schedule", "Schedule", "Chain",
      "ScheduleTables", "ScheduleError", "NAMES", "DETERMINISTIC", "RAGGED"]),
    ("Tile-level emulation", "dash_ref.emulate",
     ["emulate", "forward", "backward", "replay", "visit_index", "problem_of",
      "packed_problem_of", "ForwardResult", "BackwardResult"]),
    ("The arithmetic contract", "dash_ref.arithmetic.steps",
     ["Arithmetic", "IEEE", "EXACT", "FAST", "ARITHMETICS", "arithmetic", "STEPS", "Step",
      "steps_of",
      "default_scale", "resolve_scale", "scale_log2", "round_operand", "delta", "qk",
      "softmax_p", "dv_step", "dp", "ds", "dk_step", "dq_partial", "dq_add", "gqa_sum",
      "epilogue", "fwd_scores", "fwd_max", "fwd_probs", "fwd_accumulate", "quad_sums",
      "fwd_finish"]),
    ("schedule=\"auto\"", "dash_ref.schedules.auto",
     ["auto_schedule", "paper_advice", "load_table"]),
    ("Hopper tensor-core arithmetic", "dash_ref.arithmetic.tensorcore",
     ["mma", "mma_k16", "mma_bits", "MMAConfig", "HOPPER", "MMA_SIM"]),
    ("The special-function unit: exp2 and log2", "dash_ref.arithmetic.mufu",
     ["ex2_approx_ftz", "lg2_approx_ftz", "tables", "using", "MufuTables", "table_inputs",
      "encode_tables", "decode_tables"]),
    ("A replayable exp2", "dash_ref.arithmetic.exp2", ["exp2_fma"]),
    ("The DAG model", "dash_ref.model.dag",
     ["build_dag", "critical_path", "DAG", "CriticalPath", "Task", "parallel_chains",
      "depth_condition", "edge_keeps_critical_path"]),
    ("The event simulator", "dash_ref.model.simulator", ["simulate", "SimResult", "Interval"]),
    ("Gantt charts", "dash_ref.model.gantt", ["save_gantt", "text_timeline"]),
    ("Rounding, bits and ULPs", "dash_ref.arithmetic.numerics",
     ["f32_bits", "bits_f32", "bf16_bits", "bits_bf16", "fp16_bits", "bits_fp16",
      "round_f32_to", "fp32_add_rne", "fma_f32", "flush_subnormals_f32",
      "cpu_keeps_subnormals", "ulp",
      "ulp_distance", "ulp_error", "unit_roundoff", "float_format", "FloatFormat"]),
    ("Determinism audit", "verify.audit", ["audit", "AuditReport", "OutputAudit"]),
    ("Shape fuzzing and one-case checks", "verify.fuzz",
     ["fuzz", "check", "FuzzResult", "CheckResult"]),
    ("Hypothesis strategies", "verify.strategies",
     ["cases", "problems", "seqlens", "head_layouts", "Case", "elements", "packed_problems",
      "packed_cases", "ragged_lengths"]),
    ("Implementations under audit", "verify.impls", ["get_impl", "Impl"]),
    ("L2: a run step by step", "verify.l2",
     ["record_steps", "l2_steps", "forward_steps", "first_difference", "record_arithmetic",
      "kernel_values", "KERNEL_VALUES"]),
    ("Captures: a GPU run in one file", "verify.capture",
     ["capture", "save", "load", "check", "Capture", "CaptureError"]),
    ("Bitwise comparison", "verify.compare",
     ["compare", "TensorDiff", "first_dq_mismatch", "trace_dq", "dq_divergence", "Divergence"]),
    ("Exact gradients and the error bound", "verify.highprec",
     ["reference_grads", "HighPrecResult", "grad_error_reports", "error_report", "ErrorReport",
      "error_bound"]),
    ("Float64 reference", "verify.reference",
     ["attention_f64", "grad_checks", "attention_f64_packed", "packed_grad_checks",
      "PackedGrads"]),
    ("GPU kernels", "dash_cuda", ["attention", "attention_forward", "attention_backward",
                                  "attention_varlen", "attention_varlen_forward",
                                  "attention_varlen_backward", "flash_attn_func",
                                  "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                                  "flash_attn_varlen_func",
                                  "flash_attn_varlen_qkvpacked_func",
                                  "flash_attn_varlen_kvpacked_func", "backward_problem",
                                  "BackwardAudit", "BACKENDS", "HEAD_DIMS", "LAYOUTS"]),
    ("Kernel backends", "dash_cuda.backends", ["Backend", "Case", "Launch", "Instruction",
                                               "choose_backend", "get_backend", "PREFERENCE"]),
    ("The Triton backend's tiles", "dash_cuda.backends.triton.config",
     ["backward_config", "forward_config", "TileConfig"]),
]

HEADER = """# API reference

Generated from the docstrings by `python -m docs.api > docs/api.md` (a full
`python -m docs.figures` run rewrites it too). Names are listed by module; everything here
runs on a CPU except `dash_cuda`'s kernels. For a first run see
[quickstart.md](quickstart.md).

"""


class _Text:
    """An annotation kept as its source text (``from __future__ import annotations``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _unquoted(annotation: object) -> object:
    return _Text(annotation) if isinstance(annotation, str) else annotation


def _signature(name: str, obj: object) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = [p.replace(annotation=_unquoted(p.annotation)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=_unquoted(sig.return_annotation))
    return f"{name}{sig}"


ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc):`~?([^`]+)`")


SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields):\s*$")


def _google(doc: str) -> str:
    """Google-style ``Args:``/``Returns:`` sections as Markdown lists."""
    out: list[str] = []
    inside = False
    for line in doc.split("\n"):
        if SECTION.match(line):
            out += [f"**{line.strip()[:-1]}**", ""]
            inside = True
        elif inside and line.startswith("        "):
            out[-1] += " " + line.strip()
        elif inside and line.startswith("    "):
            out.append("- " + line.strip())
        else:
            inside = inside and bool(line.strip())
            out.append(line)
    return "\n".join(out)


def _doc(obj: object) -> str:
    doc = inspect.getdoc(obj) or "(no docstring)"
    return _google(ROLE.sub(r"``\1``", doc.strip()))


def _methods(cls: type) -> list[tuple[str, object]]:
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            out.append((name, member))
        elif inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod)):
            out.append((name, getattr(cls, name)))
    return out


def _entry(module: str, name: str, obj: object) -> list[str]:
    lines = []
    if inspect.isclass(obj):
        lines += [f"### `{module}.{name}`", "", "```python", f"class {_signature(name, obj)}",
                  "```", "", _doc(obj), ""]
        for mname, member in _methods(obj):
            if isinstance(member, property):
                lines += [f"- `{name}.{mname}` (property): {_first_line(member)}"]
            else:
                lines += [f"- `{name}.{_signature(mname, member)}`: {_first_line(member)}"]
        if _methods(obj):
            lines.append("")
    elif callable(obj):
        lines += [f"### `{module}.{name}`", "", "```python", _signature(name, obj), "```", "",
                  _doc(obj), ""]
    else:
        lines += [f"### `{module}.{name}`", "", "```python", f"{name} = {_value(obj)}", "```",
                  ""]
    return lines


def _value(obj: object) -> str:
    """A constant as the reference shows it: its repr, or a dict's keys when that is long.

    Nothing machine-specific (an object's address, a path) may reach the page: it must be
    the same wherever it is generated.
    """
    text = repr(obj)
    if isinstance(obj, dict) and (len(text) > 200 or " at 0x" in text):
        return "{" + ", ".join(f"{k!r}: ..." for k in obj) + "}"
    if " at 0x" in text:
        raise ValueError(f"the repr of {text[:60]}... names a memory address")
    return text


def _first_line(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    para = doc.split("\n\n")[0].replace("\n", " ").strip()
    return ROLE.sub(r"``\1``", para) or "(no docstring)"


def render() -> str:
    """The whole reference as Markdown."""
    lines = [HEADER.rstrip("\n"), ""]
    lines += ["Contents: " + ", ".join(f"[{title}](#{_anchor(title)})"
                                       for title, _, _ in SECTIONS), ""]
    for title, module, names in SECTIONS:
        lines += [f"## {title}", ""]
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a package being written may not import
            lines += [f"`{module}` could not be imported here ({type(exc).__name__}: {exc}); "
                      "its reference is left out.", ""]
            continue
        summary = ROLE.sub(r"``\1``", (inspect.getdoc(mod) or "").split("\n\n")[0]
                           .replace("\n", " "))
        lines += [f"Module `{module}`: {summary}", ""]
        for name in names:
            if not hasattr(mod, name):
                lines += [f"- `{module}.{name}`: not present in this version", ""]
                continue
            lines += _entry(module, name, getattr(mod, name))
    return "\n".join(lines).rstrip("\n") + "\n"


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


if __name__ == "__main__":
    sys.stdout.write(render())
