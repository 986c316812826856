"""Which backend runs a call, and what a user is told when the one asked for cannot."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dash_cuda.backends import Case, choose_backend, get_backend

CASE = Case(head_dim=64, dtype=torch.bfloat16, exact=False, deterministic=True)


@pytest.fixture
def without(monkeypatch):
    """``without(*modules)``: those modules look uninstalled to the backends."""
    real = importlib.util.find_spec

    def hide(*modules):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name in modules else real(name, *a))
    return hide


def test_cute_without_cute_dsl_says_what_to_install(without):
    without("cutlass")
    with pytest.raises(ValueError) as err:
        choose_backend("cute", CASE)
    message = str(err.value)
    assert "backend 'cute' cannot run this call" in message
    assert "nvidia-cutlass-dsl" in message and "dash-attention[gpu]" in message
    assert "\n" not in message


def test_auto_names_every_backend_it_could_not_use(without):
    without("cutlass", "triton")
    with pytest.raises(ValueError, match=r"no backend can run this call \(cute: .*; triton: "):
        choose_backend("auto", CASE)


def test_a_named_backend_refuses_what_it_does_not_support():
    if get_backend("cute").missing():
        pytest.skip("CuTe DSL is not installed here")
    with pytest.raises(ValueError, match="backend 'cute' cannot run this call: head dim 32"):
        choose_backend("cute", Case(32, torch.bfloat16, exact=False, deterministic=True))
    with pytest.raises(ValueError, match="backend 'triton' cannot run this call: head dim 80"):
        choose_backend("triton", Case(80, torch.bfloat16, exact=False, deterministic=True))
    with pytest.raises(ValueError, match="backend 'cute' cannot run this call: value head dim"):
        choose_backend("cute", Case(128, torch.bfloat16, exact=False, deterministic=True,
                                    head_dim_v=64))


def test_auto_takes_each_head_dim_to_a_backend_that_runs_it():
    """d = 96, 128, 192 (``d_v`` 192 or 128) and 256 run on the CuTe kernels first, d = 32
    and other ``d_v != d`` on the Triton ones only."""
    if get_backend("cute").missing() or get_backend("triton").missing():
        pytest.skip("CuTe DSL or Triton is not installed here")
    for head_dim, head_dim_v, name in ((96, None, "cute"), (32, None, "triton"),
                                       (128, None, "cute"), (256, None, "cute"),
                                       (192, 128, "cute"), (128, 64, "triton")):
        case = Case(head_dim, torch.bfloat16, exact=False, deterministic=True,
                    head_dim_v=head_dim_v)
        assert choose_backend("auto", case).name == name


def test_an_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown backend 'cuda'; choose from 'auto', triton"):
        choose_backend("cuda", CASE)


def test_cute_takes_the_wide_head_dims_and_refuses_a_value_head_dim_it_lacks():
    """192 (``d_v`` 192 or 128) and 256 run on CuTe's head-dim split; a value head dim with
    no kernel is refused in one line."""
    if get_backend("cute").missing():
        pytest.skip("CuTe DSL is not installed here")
    for head_dim, head_dim_v in ((256, None), (192, None), (192, 128)):
        case = Case(head_dim, torch.bfloat16, exact=False, deterministic=True,
                    head_dim_v=head_dim_v)
        assert choose_backend("cute", case).name == "cute"
    with pytest.raises(ValueError, match="value head dim 64 at head dim 256"):
        choose_backend("cute", Case(256, torch.bfloat16, exact=False, deterministic=True,
                                    head_dim_v=64))
