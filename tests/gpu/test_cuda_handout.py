"""The CuTe backward with its chains handed out from a counter
(``dash_cuda.backends.cute.launch.handing_out``): the placed lists' bits, and one pattern.

Handing out changes who runs a chain and when, never a visit or dQ order, so:

* a packed ragged batch (``lpt``, ``descending``; empty sequences, length 1, lengths off
  the tiles, ``S_q != S_k``), a causal window (``banded``) and a rectangular causal GQA
  problem (``naive``, ``interleaved``) give the placed run's ``dQ``, ``dK``, ``dV`` bit for
  bit, outputs poisoned first, with 1, 3 and 7 workers and the default grid (few workers:
  many chains per counter);
* a schedule without a launch order (``shift``) runs as placed inside the block;
* 200 handed-out backwards of a ragged batch under a busy stream give one bit pattern.
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import busy_trials

import dash_cuda
from dash_cuda.backends import get_backend

SEQLENS_Q = (1, 0, 700, 3, 511, 0, 257, 64, 129, 1)
SEQLENS_K = (1, 7, 900, 3, 300, 0, 257, 130, 129, 0)


@pytest.fixture(autouse=True)
def cute():
    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def handing_out(on: bool):
    from dash_cuda.backends.cute.launch import handing_out

    return handing_out(on)


def randn(gen, *shape):
    return torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def packed_call(seed: int = 0):
    """``backward(schedule, workers)`` of one packed ragged batch (H = 4, H_kv = 2, d =
    128, causal), its forward done once."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (randn(gen, sum(SEQLENS_Q), 4, 128) for _ in range(2))
    k, v = (randn(gen, sum(SEQLENS_K), 2, 128) for _ in range(2))
    cu = (offsets(SEQLENS_Q), offsets(SEQLENS_K), max(SEQLENS_Q), max(SEQLENS_K))
    o, lse = dash_cuda.attention_varlen_forward(q, k, v, *cu, causal=True, backend="cute")

    def backward(schedule, workers=None):
        return dash_cuda.attention_varlen_backward(
            q, k, v, o, lse, do, *cu, causal=True, schedule=schedule, num_workers=workers,
            backend="cute", _poison=True)[:3]
    return backward


def rectangular_call(window, heads_kv, seed: int = 1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (randn(gen, 2, 1100, 4, 128) for _ in range(2))
    k, v = (randn(gen, 2, 1100, heads_kv, 128) for _ in range(2))
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, window_size=window,
                                         backend="cute")

    def backward(schedule, workers=None):
        return dash_cuda.attention_backward(
            q, k, v, o, lse, do, causal=True, window_size=window, schedule=schedule,
            num_workers=workers, backend="cute", _poison=True)[:3]
    return backward


CALLS = {
    "packed-lpt": (packed_call, {}, "lpt"),
    "packed-descending": (packed_call, {}, "descending"),
    "window-banded": (rectangular_call, {"window": (300, 0), "heads_kv": 4}, "banded"),
    "gqa-naive": (rectangular_call, {"window": (-1, -1), "heads_kv": 2}, "naive"),
    "gqa-interleaved": (rectangular_call, {"window": (-1, -1), "heads_kv": 1}, "interleaved"),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_handed_out_chains_give_the_placed_bits(call):
    make, kwargs, schedule = CALLS[call]
    backward = make(**kwargs)
    for workers in (1, 3, 7, None):
        with handing_out(False):
            placed = backward(schedule, workers)
        with handing_out(True):
            handed = backward(schedule, workers)
        for name, a, b in zip(("dQ", "dK", "dV"), placed, handed):
            assert not a.isnan().any(), (name, workers)
            assert torch.equal(a, b), (name, workers)


def test_a_schedule_without_a_launch_order_runs_as_placed():
    backward = rectangular_call((-1, -1), 4)
    with handing_out(False):
        placed = backward("shift", 5)
    with handing_out(True):
        handed = backward("shift", 5)
    for a, b in zip(placed, handed):
        assert torch.equal(a, b)


def test_two_hundred_handed_out_backwards_give_one_bit_pattern():
    backward = packed_call(seed=5)
    with handing_out(True):
        runs = busy_trials(lambda: backward("lpt", 11), 200)
        first = next(runs)
        for again in runs:
            for name, a, b in zip(("dQ", "dK", "dV"), first, again):
                assert torch.equal(a, b), name
