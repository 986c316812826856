"""``benchmarks/host_overhead.py``'s breakdown: it times the steps it names while a call
runs and leaves every function as it found it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")  # the steps live in modules that import both kernel compilers
pytest.importorskip("cutlass")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import host_overhead  # noqa: E402, I001


def test_breakdown_times_the_named_steps_and_restores_them():
    def current():  # every step's function, methods of classes included
        return {(m, n): getattr(*host_overhead.step_owner(m, n)) for m, n in host_overhead.STEPS}

    before = current()
    assert any("." in n for _, n in host_overhead.STEPS)  # a Class.method step is covered
    api = importlib.import_module("dash_cuda.api")
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)

    def call():  # a call that passes through one named step (the checks), on the CPU
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            importlib.import_module("dash_cuda.api")._checked(
                {"q": q, "k": q, "v": q}, "bshd", None, lambda: None)

    steps = host_overhead.breakdown(call, calls=3)
    assert set(steps) == {"_checked"} and steps["_checked"] > 0
    assert current() == before
    assert api._checked is before[("dash_cuda.api", "_checked")]
