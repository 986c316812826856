"""L2 of the default arithmetic: the CPU reproduces the CuTe forward and backward bit for bit.

``dash_ref``'s FAST arithmetic (the MUFU models, the tensor-core model, the pairwise ``D``,
the CuTe forward's order of steps) recomputes every step of a default CuTe run from its
inputs: ``O`` and ``LSE2``, then, from the kernel's own ``O`` and ``LSE2``, ``D``, every dQ
partial, the accumulators and ``dQ``, ``dK``, ``dV``. Each is compared with what the GPU
wrote (outputs poisoned with NaN first) with ``torch.equal``, for every deterministic
schedule and both masks, over ragged lengths, GQA, both head dims and both dtypes.
``scripts/l2_matrix.py`` runs the full product of those (``benchmarks/results/l2_fast.md``).
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import inputs

from dash_ref import DETERMINISTIC
from verify.capture import capture, check
from verify.l2 import first_difference

# (B, H, H_kv, S_q, S_k), d, dtype, num_workers: several Q and KV tiles, ragged ends
CASES = [
    ((1, 4, 1, 250, 300), 64, torch.bfloat16, None),
    ((1, 2, 2, 200, 136), 128, torch.float16, 3),
    ((1, 4, 2, 190, 260), 96, torch.bfloat16, 2),  # D over the zero-padded width
]


@pytest.fixture(autouse=True)
def _cute_only():
    from dash_cuda.backends import get_backend

    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


@pytest.mark.parametrize("schedule", DETERMINISTIC)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dtype, num_workers", CASES)
def test_the_cpu_reproduces_every_step_of_the_default_cute_run(schedule, causal, shape, d,
                                                               dtype, num_workers):
    seed = DETERMINISTIC.index(schedule) * 4 + 2 * causal + d // 96
    q, k, v, do = inputs(shape, d, dtype, seed)
    c = capture(q, k, v, do, causal=causal, schedule=schedule, num_workers=num_workers)
    assert c.meta["arithmetic"] == "fast" and not c.meta["flush_subnormals"]
    steps = check(c)
    assert [s for s, _, _ in steps][:3] == ["O", "LSE2", "D"]
    for name, got, want in steps:
        assert torch.equal(got, want), name


def test_the_forward_bits_do_not_depend_on_the_grid():
    """Tile height, grid size and how CTAs take tiles change no bit, and the CPU agrees."""
    from dash_cuda.backends.cute.launch import run_forward
    from verify.l2 import forward_steps

    q, k, v, _ = inputs((1, 2, 1, 1100, 1000), 64, torch.bfloat16, seed=5)
    runs = [run_forward(q, k, v, True, 0.125, poison=True, block_m=bm, num_ctas=ctas,
                        dynamic=dyn)
            for bm, ctas, dyn in [(192, None, None), (128, 1, False), (192, 7, True),
                                  (128, 132, True)]]
    for o, lse in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(lse, runs[0][1])
    o, lse = runs[0]
    steps = forward_steps((q.cpu(), k.cpu(), v.cpu()), o.cpu(), lse.cpu(), True, 0.125, 128)
    assert first_difference(steps) is None


def test_a_negative_scale_is_reproduced():
    from dash_cuda.backends.cute.launch import run_forward
    from verify.l2 import forward_steps

    q, k, v, _ = inputs((1, 2, 2, 130, 140), 128, torch.float16, seed=6)
    for scale in (-0.2, 0.0):
        o, lse = run_forward(q, k, v, False, scale, poison=True)
        steps = forward_steps((q.cpu(), k.cpu(), v.cpu()), o.cpu(), lse.cpu(), False, scale,
                              128)
        assert first_difference(steps) is None, scale


@pytest.mark.parametrize("window_size, softcap, sinks", [
    ((40, 0), 0.0, True), ((-1, -1), 30.0, True), ((64, 16), 50.0, False)],
    ids=["causal-window-sinks", "softcap-sinks", "window-softcap"])
def test_a_capture_with_the_options_is_reproduced_on_the_cpu(tmp_path, window_size, softcap,
                                                            sinks):
    """A window, a softcap and sinks captured from the CuTe default (through the file):
    every step, ``dsink`` included, is the CPU's."""
    from verify.capture import load, save

    q, k, v, do = inputs((1, 4, 2, 230, 260), 128, torch.bfloat16, seed=31)
    sink = torch.tensor([2.0, -1.0, 0.5, -6.0], device="cuda") if sinks else None
    c = capture(q * 3, k, v, do, causal=window_size[1] == 0, schedule="shift",
                window_size=window_size, softcap=softcap, learnable_sink=sink)
    save(c, tmp_path / "run.capture")
    steps = check(load(tmp_path / "run.capture"))
    assert [s for s, _, _ in steps][:2] == ["O", "LSE2"]
    assert (steps[-1][0] == "dsink") == sinks
    assert first_difference(steps) is None


def test_a_packed_capture_is_reproduced_on_the_cpu(tmp_path):
    """A packed batch (an empty sequence, S_q != S_k per sequence) with sinks, captured from
    the CuTe default through ``dash-verify capture``: every step is the CPU's."""
    from verify.cli import main

    path = tmp_path / "packed.capture"
    assert main(["capture", "--out", str(path), "--seqlens-q", "300,0,77,129",
                 "--seqlens-k", "250,40,77,300", "--heads", "4", "--heads-kv", "2",
                 "--head-dim", "128", "--mask", "causal", "--schedule", "lpt",
                 "--learnable-sink=1,-2,0.5,-7"]) == 0
    assert main(["reproduce", str(path)]) == 0
