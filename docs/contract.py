"""The arithmetic contract as a table: each step beside the instruction it becomes per backend.

Rows come from :data:`dash_ref.arithmetic.steps.STEPS` (the step, what it computes, the
function that mirrors it on the CPU); one column per backend from its ``contract.py``.
``docs/design.md`` section 5 embeds the result (``figures/contract.md``).
"""

from __future__ import annotations

import importlib

from dash_cuda.backends import BACKENDS
from dash_ref.arithmetic.steps import steps_of


def contracts() -> dict[str, dict]:
    """``{backend: {step: Instruction}}`` for every backend."""
    return {name: importlib.import_module(f"dash_cuda.backends.{name}.contract").CONTRACT
            for name in BACKENDS}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _instructions(instruction, stage: str) -> str:
    """One backend's cell: the shared text, or the fast and exact texts where they differ;
    then the CPU functions that reproduce the default instructions, where some do."""
    if instruction.same or stage == "forward":
        text = _cell(instruction.text("fast"))
    else:
        text = f"fast: {_cell(instruction.fast)}<br>exact: {_cell(instruction.exact)}"
    return text + (f"<br>**CPU**: {_cell(instruction.cpu)}" if instruction.cpu else "")


def render() -> str:
    """The Markdown tables of the backward's and the forward's steps."""
    tables = contracts()
    out = []
    for stage in ("backward", "forward"):
        out.append(f"**{stage.capitalize()}**, in the order a tile pair computes them:\n")
        head = ["step", "computes"] + [f"`{b}` backend" for b in tables]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + " --- |" * len(head))
        for s in steps_of(stage):
            row = [f"[`{s.name}`](../dash_ref/arithmetic/steps.py)", _cell(s.formula)]
            row += [_instructions(tables[b][s.name], stage) for b in tables]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)
