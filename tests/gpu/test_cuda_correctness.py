"""dash_cuda against float64: every backend, schedule, mask, dtype, head dim, GQA, odd shapes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from gpu_cases import DTYPES, SHAPES, bound, inputs, need, normwise, reference

import dash_cuda
from dash_ref import NAMES

CASES = [
    (name, causal, dtype, d, SHAPES[n % len(SHAPES)])
    for n, (name, causal, dtype, d) in enumerate(
        itertools.product(NAMES, (False, True), DTYPES, (64, 96, 128)))
]


def check_against_float64(backend, shape, d, dtype, causal, schedule, seed,
                          forward_backend=None, **kw):
    """O, LSE2 and the gradients within the bound; ``forward_backend`` (default: ``backend``)
    runs the forward whose O and LSE2 the backward takes."""
    kw.setdefault("deterministic", schedule != "atomic")
    forward_backend = forward_backend or backend
    need(backend, d, dtype, kw.get("exact", False), kw["deterministic"])
    need(forward_backend, d, dtype)
    q, k, v, do = inputs(shape, d, dtype, seed)
    scale = kw.get("softmax_scale")
    ref, lse_ref = reference(q, k, v, do, causal, scale)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, softmax_scale=scale,
                                         backend=forward_backend)
    dq, dk, dv = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                              schedule=schedule, backend=backend, **kw)
    for name, x, exact in (("o", o, ref.o), ("dq", dq, ref.dq), ("dk", dk, ref.dk),
                           ("dv", dv, ref.dv)):
        assert x.dtype == dtype and x.shape == exact.shape
        assert torch.isfinite(x).all(), name
        err = normwise(x, exact)
        assert err <= bound(dtype, name, shape, d), f"{name}: normwise error {err:.2e}"
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    assert (lse[~seen] == -math.inf).all()
    assert (lse[seen].double() - lse_ref[seen]).abs().max() <= 1e-4 * (1 + lse_ref[seen].abs()
                                                                       .max())


@pytest.mark.parametrize("schedule, causal, dtype, d, shape", CASES)
def test_schedule_matches_float64(backend, schedule, causal, dtype, d, shape):
    check_against_float64(backend, shape, d, dtype, causal, schedule, seed=len(shape) * d + causal)


@pytest.mark.parametrize("forward_backend, backward_backend", [("cute", "triton"),
                                                               ("triton", "cute")])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_any_forward_pairs_with_any_backward(forward_backend, backward_backend, d, causal):
    """One O/LSE2 convention: each backend's backward on the other's forward, same bound."""
    from dash_cuda.backends import get_backend

    for name in (forward_backend, backward_backend):
        if get_backend(name).missing():
            pytest.skip(f"backend {name!r}: {get_backend(name).missing()}")
    for n, shape in enumerate(SHAPES):
        check_against_float64(backward_backend, shape, d, torch.bfloat16, causal, "auto",
                              seed=7 * n + d + causal, forward_backend=forward_backend)


@pytest.mark.parametrize("causal", [False, True])
def test_cute_forward_bits_do_not_depend_on_its_tile_height(causal):
    """At d=64 the CuTe forward runs 192-row tiles (128 for short causal problems): both give
    the same O and LSE2 bits, since a row's sums never leave its warpgroup. The shape (GQA,
    S_q > S_k, causal rows that see no key) is one the measured rule gives 192 rows."""
    need("cute", 64)
    from dash_cuda.backends.cute.config import forward_config
    from dash_cuda.backends.cute.launch import run_forward

    q, k, v, _ = inputs((2, 3, 1, 1300, 1250), 64, torch.bfloat16, seed=41 + causal)
    assert forward_config(64, "causal" if causal else "full", 1300).block_m == 192
    tall = run_forward(q, k, v, causal, 0.125, poison=True, block_m=192)
    short = run_forward(q, k, v, causal, 0.125, poison=True, block_m=128)
    assert torch.equal(tall[0], short[0]) and torch.equal(tall[1], short[1])
    check_against_float64("cute", (2, 3, 1, 1300, 1250), 64, torch.bfloat16, causal, "auto",
                          seed=43 + causal)


@pytest.mark.parametrize("causal", [False, True])
def test_negative_softmax_scale(backend, causal):
    """A negative scale turns the scores around; the CuTe forward, which applies the scale to
    each row's largest raw score, runs it as ``(-Q) K^T |c|``. Same bound as 1/sqrt(d)."""
    check_against_float64(backend, SHAPES[2], 64, torch.bfloat16, causal, "auto", seed=17,
                          softmax_scale=-0.3)


@pytest.mark.parametrize("causal", [False, True])
def test_zero_softmax_scale_averages_the_visible_values(backend, causal):
    """``softmax_scale=0``: every visible key weighs the same, O is the mean of their V and
    LSE2 the log2 of their count (the gradients of Q and K vanish, so only the forward)."""
    need(backend, 64)
    q, k, v, do = inputs(SHAPES[2], 64, torch.bfloat16, seed=19)
    ref, lse_ref = reference(q, k, v, do, causal, 0.0)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, softmax_scale=0.0,
                                         backend=backend)
    assert normwise(o, ref.o) <= bound(torch.bfloat16, "o", SHAPES[2], 64)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    assert (lse[seen].double() - lse_ref[seen]).abs().max() <= 1e-4 * (1 + lse_ref[seen].abs()
                                                                       .max())


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_cute_forward_bits_do_not_depend_on_the_grid(d, causal):
    """A CTA computes whole Q tiles, so the grid (one CTA, seven, one per SM, one per tile),
    how persistent CTAs take their tiles (every CTAs-th or the next from a counter) and the
    order of the tiles (causal: sections of 1, 2 or all 6 heads) leave the O and LSE2 bits
    as they are."""
    need("cute", d)
    from dash_cuda.backends.cute.launch import run_forward

    q, k, v, _ = inputs((2, 3, 1, 700, 650), d, torch.bfloat16, seed=53 + d + causal)
    first = run_forward(q, k, v, causal, 0.125, poison=True, num_ctas=1, sections=6)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for num_ctas, sections, dynamic in ((7, 1, False), (7, 1, True), (sms, 2, False),
                                        (sms, 2, True), (sms, 6, True), (10_000, 6, None),
                                        (10_000, 1, True), (None, None, None)):
        again = run_forward(q, k, v, causal, 0.125, poison=True, num_ctas=num_ctas,
                            sections=sections, dynamic=dynamic)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), \
            (num_ctas, sections, dynamic)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d", [16, 32])
@pytest.mark.parametrize("causal", [False, True])
def test_small_head_dims(backend, shape, d, causal):
    check_against_float64(backend, shape, d, torch.bfloat16, causal, "auto", seed=d + 3 * causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_exact_arithmetic_matches_float64(backend, dtype, d, causal):
    """``exact=True`` (software exp2, pinned D order) is held to the same bound."""
    shape = SHAPES[(d + causal) % len(SHAPES)]
    check_against_float64(backend, shape, d, dtype, causal, "auto", seed=d + 5 * causal, exact=True)


@pytest.mark.parametrize("causal", [False, True])
def test_pinned_workers(backend, causal):
    check_against_float64(backend, (2, 4, 2, 515, 515), 64, torch.bfloat16, causal, "shift", seed=5,
                          num_workers=7)


def test_autograd_matches_attention_backward_bit_for_bit(backend):
    q, k, v, do = inputs((2, 4, 2, 300, 300), 64, torch.bfloat16, seed=11)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = dash_cuda.attention(*leaves, causal=True, schedule="descending", backend=backend)
    out.backward(do)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, backend=backend)
    grads = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True,
                                         schedule="descending", backend=backend)
    assert torch.equal(out, o)
    for leaf, g in zip(leaves, grads):
        assert torch.equal(leaf.grad, g)


def test_kernels_run_on_the_callers_current_stream(backend):
    """Every kernel of a call is enqueued on the current stream: inputs written there by a
    copy that waits behind a long sleep are read after it (a kernel enqueued anywhere else
    would run first and read the NaN the inputs start as)."""
    q, k, v, do = inputs((2, 4, 2, 300, 300), 64, torch.bfloat16, seed=16)
    o_ref, lse_ref = dash_cuda.attention_forward(q, k, v, causal=True, backend=backend)
    grads_ref = dash_cuda.attention_backward(q, k, v, o_ref, lse_ref, do, causal=True,
                                             backend=backend)
    late = [torch.full_like(x, math.nan) for x in (q, k, v, do)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 50 ms of GPU clock cycles
        for dst, src in zip(late, (q, k, v, do)):
            dst.copy_(src)
        o, lse = dash_cuda.attention_forward(*late[:3], causal=True, backend=backend)
        grads = dash_cuda.attention_backward(*late[:3], o, lse, late[3], causal=True,
                                             backend=backend)
    torch.cuda.synchronize()
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    for g, g_ref in zip(grads, grads_ref):
        assert torch.equal(g, g_ref)


def test_bhsd_layout_gives_the_same_bits(backend):
    q, k, v, do = inputs((2, 6, 2, 190, 333), 128, torch.float16, seed=12)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, backend=backend)
    grads = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True, backend=backend)
    t = [x.transpose(1, 2).contiguous() for x in (q, k, v, do)]
    o_t, lse_t = dash_cuda.attention_forward(*t[:3], causal=True, layout="bhsd",
                                             backend=backend)
    grads_t = dash_cuda.attention_backward(*t[:3], o_t, lse_t, t[3], causal=True,
                                           layout="bhsd", backend=backend)
    assert o_t.shape == t[0].shape and lse_t.shape == (2, 6, 190)
    assert torch.equal(o_t.transpose(1, 2), o) and torch.equal(lse_t.transpose(1, 2), lse)
    for g, g_t in zip(grads, grads_t):
        assert torch.equal(g_t.transpose(1, 2), g)


def test_sdpa_layout_through_autograd(backend):
    q, k, v, do = inputs((1, 8, 2, 257, 257), 64, torch.bfloat16, seed=13)
    leaves = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out = dash_cuda.attention(*leaves, causal=True, layout="bhsd", backend=backend)
    out.backward(do.transpose(1, 2))
    ref, _ = reference(q, k, v, do, True)
    for leaf, exact, name in zip(leaves, (ref.dq, ref.dk, ref.dv), ("dq", "dk", "dv")):
        assert normwise(leaf.grad.transpose(1, 2), exact) <= bound(
            torch.bfloat16, name, (1, 8, 2, 257, 257), 64)


def test_deterministic_false_runs_the_atomic_peer(backend):
    check_against_float64(backend, (1, 4, 4, 512, 2048), 64, torch.bfloat16, False, "naive",
                          seed=14, deterministic=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 0, 50), (2, 4, 2, 50, 0), (0, 4, 2, 50, 50)])
def test_empty_sequences(backend, shape, causal):
    q, k, v, do = inputs(shape, 64, torch.bfloat16, seed=15)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = dash_cuda.attention(*leaves, causal=causal, backend=backend)
    assert out.shape == q.shape
    assert (out == 0).all()
    out.backward(do)
    for leaf in leaves:
        assert leaf.grad.shape == leaf.shape and (leaf.grad == 0).all()
    _, lse = dash_cuda.attention_forward(q, k, v, causal=causal)
    assert lse.shape == shape[:1] + shape[3:4] + shape[1:2]
    assert (lse == -math.inf).all()


@pytest.mark.parametrize("schedule", NAMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 6, 1, 333, 190), (1, 4, 2, 200, 333)])
def test_poisoned_outputs_are_all_written(backend, schedule, causal, shape):
    q, k, v, do = inputs(shape, 64, torch.bfloat16, seed=16)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, _poison=True,
                                         backend=backend)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    for audit in (False, True) if schedule != "atomic" else (False,):
        out = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                           schedule=schedule,
                                           deterministic=schedule != "atomic",
                                           audit=audit, _poison=True, backend=backend)
        for g in out[:3]:
            assert not torch.isnan(g).any()
        if audit:
            for t in (out[3].dq_acc, out[3].dk_heads, out[3].dv_heads):
                assert not torch.isnan(t).any()


def test_num_workers_larger_than_resident_is_refused(backend):
    q, k, v, do = inputs((1, 2, 2, 128, 128), 64, torch.bfloat16, seed=17)
    o, lse = dash_cuda.attention_forward(q, k, v, backend=backend)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with pytest.raises(ValueError, match="resident"):
        dash_cuda.attention_backward(q, k, v, o, lse, do, num_workers=64 * sms,
                                     backend=backend)


def test_auto_takes_the_first_backend_that_runs_the_call():
    from dash_cuda.backends import PREFERENCE, Case, choose_backend, get_backend

    for d, exact in ((64, False), (128, False), (32, False), (64, True)):
        chosen = choose_backend("auto", Case(d, torch.bfloat16, exact, True)).name
        first = next(n for n in PREFERENCE if not get_backend(n).missing()
                     and not get_backend(n).unsupported(Case(d, torch.bfloat16, exact, True)))
        assert chosen == first
