"""The public entries check tensors once per signature: inputs whose names, shapes, strides,
dtypes and devices passed the tensor and device checks skip them on later calls; anything
that failed is checked (and refused) again every time."""

from __future__ import annotations

import pytest
import torch

from dash_cuda import api, checks


@pytest.fixture
def counted(monkeypatch):
    """The tensor checks counted, and the device check passed for CPU tensors (standing in
    for CUDA ones)."""
    checks._PASSED.clear()
    calls = []

    def check_tensors(named, layout):
        calls.append(layout)
        checks.check_tensors(named, layout)

    monkeypatch.setattr(api, "check_tensors", check_tensors)
    monkeypatch.setattr(api, "check_devices", lambda named: None)
    yield calls
    checks._PASSED.clear()


def qkv(dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 64, generator=gen).to(dtype) for _ in range(3))
    return {"q": q, "k": k, "v": v}


def test_a_signature_that_passed_skips_the_tensor_checks(counted):
    for _ in range(3):
        assert api._checked(qkv(), "bshd", None, lambda: "options") == "options"
    assert len(counted) == 1
    # other strides (a transposed buffer), another layout: a new signature, checked
    named = qkv()
    named["k"] = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16).transpose(1, 2)
    api._checked(named, "bshd", None, lambda: None)
    api._checked(qkv(), "bhsd", None, lambda: None)
    assert len(counted) == 3


def test_inputs_that_failed_are_checked_and_refused_every_time(counted):
    for _ in range(2):
        with pytest.raises(TypeError, match="q must be bfloat16 or float16"):
            api._checked(qkv(torch.float32), "bshd", None, lambda: None)
    assert len(counted) == 2

    def bad_options():
        raise ValueError("bad option")

    for _ in range(2):  # the tensors pass, the options fail: nothing is remembered
        with pytest.raises(ValueError, match="bad option"):
            api._checked(qkv(), "bshd", None, bad_options)
    assert len(counted) == 4


def test_cpu_tensors_are_refused_on_every_call():
    checks._PASSED.clear()
    for _ in range(2):
        with pytest.raises(ValueError, match="dash_cuda needs CUDA tensors"):
            api.attention(*qkv().values())
