"""L0: deterministic schedules repeat their bits; the atomic peer does not."""

from __future__ import annotations

import hashlib

import pytest
import torch
from gpu_cases import inputs, need

import dash_cuda
from dash_ref import DETERMINISTIC, PORTABLE

TRIALS = 100


class BusyStream:
    """Keeps a second stream busy with matrix products while the audited call runs."""

    def __init__(self, seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.a = torch.randn(4096, 4096, device="cuda", generator=gen).bfloat16()
        self.stream = torch.cuda.Stream()

    def kick(self, products: int = 3) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(products):
                self.a = (self.a @ self.a).clamp_(-1, 1)


def run_trials(args, kwargs, trials: int, busy: BusyStream | None):
    q, k, v, o, lse, do = args
    first = None
    differing = 0
    for _ in range(trials):
        if busy is not None:
            busy.kick()
        grads = dash_cuda.attention_backward(q, k, v, o, lse, do, **kwargs)
        if first is None:
            first = grads
        elif not all(torch.equal(a, b) for a, b in zip(first, grads)):
            differing += 1
    torch.cuda.synchronize()
    return first, differing


@pytest.mark.parametrize("schedule", DETERMINISTIC)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, heads", [(64, (8, 8)), (96, (8, 4)), (128, (8, 2))])
def test_deterministic_schedules_repeat_bit_for_bit(backend, schedule, causal, d, heads):
    need(backend, d)
    q, k, v, do = inputs((2, *heads, 1536, 1536), d, torch.bfloat16, seed=21)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend)
    kwargs = dict(causal=causal, schedule=schedule, backend=backend)
    quiet, differing = run_trials((q, k, v, o, lse, do), kwargs, TRIALS, None)
    assert differing == 0
    busy, differing = run_trials((q, k, v, o, lse, do), kwargs, TRIALS, BusyStream(22))
    assert differing == 0
    for a, b in zip(quiet, busy):
        assert torch.equal(a, b)


def test_atomic_peer_is_not_repeatable(backend):
    # 128 KV tiles add into every dQ tile: the order atomics arrive in changes run to run
    q, k, v, do = inputs((1, 4, 4, 512, 16384), 64, torch.bfloat16, seed=23)
    o, lse = dash_cuda.attention_forward(q, k, v, backend=backend)
    patterns = set()
    dkdv = None
    busy = BusyStream(24)
    for trial in range(20):
        if trial % 2:
            busy.kick()
        dq, dk, dv = dash_cuda.attention_backward(q, k, v, o, lse, do, deterministic=False,
                                                  backend=backend)
        patterns.add(hashlib.sha256(dq.view(torch.int16).cpu().numpy().tobytes()).hexdigest())
        if dkdv is None:
            dkdv = (dk, dv)
        else:  # dK and dV never go through atomics
            assert torch.equal(dkdv[0], dk) and torch.equal(dkdv[1], dv)
    assert len(patterns) > 1, "atomic dQ gave one bit pattern in 20 runs"
    # the same shape under a deterministic schedule: one pattern
    first, differing = run_trials((q, k, v, o, lse, do),
                                  dict(schedule="shift", backend=backend), 20, busy)
    assert differing == 0


@pytest.mark.parametrize("schedule", PORTABLE)
@pytest.mark.parametrize("causal", [False, True])
def test_portable_schedules_give_the_same_bits_on_every_worker_count(backend, schedule,
                                                                       causal):
    """66, 114 and 132 workers: half an H200, an H100 PCIe, an H100 SXM / H200."""
    if torch.cuda.get_device_properties(0).multi_processor_count < 132:
        pytest.skip("needs 132 SMs to run 132 persistent workers")
    q, k, v, do = inputs((2, 8, 4, 1100, 1500), 64, torch.bfloat16, seed=23)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend)
    grads = {w: dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                             schedule=schedule, num_workers=w,
                                             backend=backend)
             for w in (66, 114, 132)}
    for w in (66, 114):
        for a, b in zip(grads[w], grads[132]):
            assert torch.equal(a, b), f"{schedule}: {w} workers differ from 132"


def test_portable_auto_repeats_across_worker_counts(backend):
    if torch.cuda.get_device_properties(0).multi_processor_count < 132:
        pytest.skip("needs 132 SMs to run 132 persistent workers")
    q, k, v, do = inputs((2, 8, 8, 1024, 1024), 64, torch.bfloat16, seed=24)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, backend=backend)
    first = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True, portable=True,
                                         num_workers=66, backend=backend)
    again = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True, portable=True,
                                         num_workers=132, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("d", [64, 96, 128])
def test_cute_forward_repeats_with_tiles_handed_out_from_a_counter(d):
    """L0 for the forward's dynamic tile hand-out (causal, S_q >= DYNAMIC_CAUSAL): which CTA
    takes which tile changes from run to run, more so with a busy second stream; O and LSE2
    must not, and every element is written (outputs poisoned with NaN each time)."""
    from gpu_cases import need

    need("cute", d)
    from dash_cuda.backends.cute.launch import DYNAMIC_CAUSAL, run_forward

    q, k, v, _ = inputs((2, 8, 2, DYNAMIC_CAUSAL + 517, DYNAMIC_CAUSAL + 517), d,
                        torch.bfloat16, seed=31 + d)
    first = run_forward(q, k, v, True, 0.125, poison=True)
    assert torch.isfinite(first[0]).all()
    busy = BusyStream(32)
    for trial in range(TRIALS):
        if trial % 2:
            busy.kick()
        again = run_forward(q, k, v, True, 0.125, poison=True, dynamic=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), trial
    torch.cuda.synchronize()
