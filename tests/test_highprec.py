"""verify.highprec: exact reference gradients, error metrics and the accuracy bound."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from dash_ref.arithmetic.numerics import round_f32_to, ulp, unit_roundoff
from verify.highprec import (
    KAPPA_DEFAULT,
    SAFETY,
    HighPrecResult,
    error_bound,
    error_report,
    grad_error_reports,
    reference_grads,
    rounded_size,
    storage_tiny,
)

LOG2E = math.log2(math.e)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_inputs(
    seed: int,
    b: int,
    s_q: int,
    s_k: int,
    h: int,
    h_kv: int,
    d: int,
    dtype: torch.dtype = torch.bfloat16,
    d_v: int | None = None,
    offsets: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
) -> tuple[torch.Tensor, ...]:
    """Random q, k, v, do in (B, S, H, d) layout, rounded to ``dtype``."""
    g = gen(seed)
    d_v = d if d_v is None else d_v
    shapes = [(b, s_q, h, d), (b, s_k, h_kv, d), (b, s_k, h_kv, d_v), (b, s_q, h, d_v)]
    return tuple(
        (torch.randn(s, generator=g) + off).to(dtype)
        for s, off in zip(shapes, offsets, strict=True)
    )


def visible(s_q: int, s_k: int, causal: bool) -> torch.Tensor:
    r = torch.arange(s_q)[:, None]
    c = torch.arange(s_k)[None, :]
    return c <= r + s_k - s_q if causal else torch.ones(s_q, s_k, dtype=torch.bool)


def float64_autograd(q, k, v, do, causal, scale=None):
    """Plain float64 attention with an explicit mask, differentiated by autograd."""
    q, k, v = (t.double().detach().requires_grad_(True) for t in (q, k, v))
    _, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    kr, vr = (t.repeat_interleave(h // h_kv, dim=2) for t in (k, v))
    mask = visible(s_q, s_k, causal)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.where(mask, torch.exp(s - safe[..., None]), torch.zeros_like(s))
    o = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    o.backward(do.double())
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    n = float(torch.linalg.vector_norm(b))
    return float(torch.linalg.vector_norm(a - b)) / (n if n else 1.0)


def assert_close_f64(res: HighPrecResult, ref, tol: float = 1e-12) -> None:
    o, lse, dq, dk, dv = ref
    assert torch.equal(torch.isinf(res.lse), torch.isinf(lse))
    fin = torch.isfinite(lse)
    assert float((res.lse[fin] - lse[fin]).abs().amax()) < tol * 100
    for got, want in ((res.o, o), (res.dq, dq), (res.dk, dk), (res.dv, dv)):
        assert got.dtype == torch.float64 and got.shape == want.shape
        assert rel(got, want) < tol
        if want.numel():
            scale = float(want.abs().amax()) or 1.0
            assert float((got - want).abs().amax()) < tol * scale


# -- reference vs float64 -------------------------------------------------------------------
CASES = [
    # seed, B, S_q, S_k, H, H_kv, d, causal
    (1, 1, 24, 24, 2, 2, 16, False),
    (2, 1, 24, 24, 2, 2, 16, True),
    (3, 2, 9, 17, 4, 2, 8, True),  # S_q < S_k, GQA
    (4, 1, 17, 9, 3, 1, 8, True),  # S_q > S_k: first 8 rows see no key; MQA
    (5, 2, 13, 5, 2, 1, 12, False),
    (6, 1, 1, 7, 2, 2, 8, True),
    (7, 1, 7, 1, 2, 2, 8, True),  # only the last row sees the single key
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{c[0]}" for c in CASES])
def test_matches_float64_autograd(case) -> None:
    seed, b, s_q, s_k, h, h_kv, d, causal = case
    q, k, v, do = make_inputs(seed, b, s_q, s_k, h, h_kv, d)
    res = reference_grads(q, k, v, do, causal=causal)
    assert_close_f64(res, float64_autograd(q, k, v, do, causal))


def test_rows_without_keys_are_zero() -> None:
    q, k, v, do = make_inputs(8, 1, 12, 5, 2, 1, 8, torch.float16)
    res = reference_grads(q, k, v, do, causal=True)
    empty = 12 - 5  # rows r < S_q - S_k see nothing
    assert bool(torch.isneginf(res.lse[:, :, :empty]).all())
    assert bool(torch.isfinite(res.lse[:, :, empty:]).all())
    assert bool((res.o[:, :empty] == 0).all()) and bool((res.dq[:, :empty] == 0).all())
    assert bool((res.o[:, empty:] != 0).any()) and bool((res.dq[:, empty + 1 :] != 0).any())
    # the first row that sees a key sees exactly one: P = 1, O = V, dS = 0
    assert torch.equal(res.o[0, empty, 0], v[0, 0, 0].double())
    assert bool((res.dq[:, empty] == 0).all())
    # no key at all
    res0 = reference_grads(q, k[:, :0], v[:, :0], do)
    assert bool(torch.isneginf(res0.lse).all())
    assert not bool(res0.o.any()) and not bool(res0.dq.any()) and res0.dk.shape[1] == 0


def test_matches_sdpa_and_custom_scale_and_layout() -> None:
    q, k, v, do = make_inputs(9, 2, 11, 16, 4, 2, 8, d_v=6)
    for causal in (False, True):
        res = reference_grads(q, k, v, do, causal=causal, softmax_scale=0.3)
        tq, tk, tv = (t.double().transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
        mask = visible(11, 16, causal)
        o = F.scaled_dot_product_attention(
            tq, tk.repeat_interleave(2, dim=1), tv.repeat_interleave(2, dim=1), mask, scale=0.3
        )
        o.backward(do.double().transpose(1, 2))
        assert rel(res.o, o.detach().transpose(1, 2)) < 1e-12
        for got, t in ((res.dq, tq), (res.dk, tk), (res.dv, tv)):
            assert rel(got, t.grad.transpose(1, 2)) < 1e-12
        # SDPA layout in, SDPA layout out, same numbers
        bhsd = reference_grads(
            *(t.transpose(1, 2) for t in (q, k, v, do)),
            causal=causal,
            softmax_scale=0.3,
            layout="bhsd",
        )
        for a, c in ((bhsd.o, res.o), (bhsd.dq, res.dq), (bhsd.dk, res.dk), (bhsd.dv, res.dv)):
            assert torch.equal(a.transpose(1, 2), c)
        assert torch.equal(bhsd.lse, res.lse)


def test_gqa_sums_over_query_heads() -> None:
    q, k, v, do = make_inputs(10, 1, 10, 14, 6, 2, 8, torch.float16)
    gqa = reference_grads(q, k, v, do, causal=True)
    mha = reference_grads(
        q, k.repeat_interleave(3, dim=2), v.repeat_interleave(3, dim=2), do, causal=True
    )
    assert torch.equal(gqa.dq, mha.dq) and torch.equal(gqa.o, mha.o)
    for got, per_head in ((gqa.dk, mha.dk), (gqa.dv, mha.dv)):
        summed = per_head.reshape(1, 14, 2, 3, 8).sum(dim=3)
        assert rel(got, summed) < 1e-15


def test_precision_50_vs_30_digits() -> None:
    q, k, v, do = make_inputs(11, 1, 16, 20, 2, 1, 12, torch.float16)
    a = reference_grads(q, k, v, do, causal=True, dps=50)
    c = reference_grads(q, k, v, do, causal=True, dps=30)
    for x, y in ((a.o, c.o), (a.lse, c.lse), (a.dq, c.dq), (a.dk, c.dk), (a.dv, c.dv)):
        assert torch.equal(x, y)
    with pytest.raises(ValueError):
        reference_grads(q, k, v, do, dps=20)


def fraction_reference(q, k, v, do, n_keys: int):
    """Exact rational gradients for ``q == 0`` (uniform softmax, P = 1/S_k), one head."""
    Q, K, V, dO = ([[Fraction(float(x)) for x in row] for row in t[0, :, 0]] for t in (q, k, v, do))
    s_q, s_k, d = len(Q), len(K), len(K[0])
    scale = Fraction(1, 4)  # d = 16
    p = Fraction(1, n_keys)
    O = [[sum(p * V[c][j] for c in range(s_k)) for j in range(d)] for _ in range(s_q)]
    dP = [[sum(dO[r][j] * V[c][j] for j in range(d)) for c in range(s_k)] for r in range(s_q)]
    D = [sum(dO[r][j] * O[r][j] for j in range(d)) for r in range(s_q)]
    dS = [[p * (dP[r][c] - D[r]) for c in range(s_k)] for r in range(s_q)]
    dq = [
        [scale * sum(dS[r][c] * K[c][j] for c in range(s_k)) for j in range(d)] for r in range(s_q)
    ]
    dk = [
        [scale * sum(dS[r][c] * Q[r][j] for r in range(s_q)) for j in range(d)] for c in range(s_k)
    ]
    dv = [[sum(p * dO[r][j] for r in range(s_q)) for j in range(d)] for _ in range(s_k)]
    return tuple(
        torch.tensor([[float(x) for x in row] for row in m], dtype=torch.float64)
        for m in (O, dq, dk, dv)
    )


@pytest.mark.parametrize("s_k", [3, 4])
def test_bitwise_equal_to_exact_rationals(s_k: int) -> None:
    _, k, v, do = make_inputs(12 + s_k, 1, 5, s_k, 1, 1, 16)
    q = torch.zeros(1, 5, 1, 16, dtype=torch.bfloat16)  # the logits are all 0: P = 1/S_k
    res = reference_grads(q, k, v, do)
    o, dq, dk, dv = fraction_reference(q, k, v, do, s_k)
    assert bool(dv.any()) and bool(o.any())
    for got, want in ((res.o, o), (res.dq, dq), (res.dk, dk), (res.dv, dv)):
        assert torch.equal(got[0, :, 0], want)  # correctly rounded from the exact value


def test_small_shape_is_fast() -> None:
    q, k, v, do = make_inputs(13, 1, 40, 40, 2, 2, 16)
    t0 = time.perf_counter()
    reference_grads(q, k, v, do, causal=False)
    assert time.perf_counter() - t0 < 3.0


def test_input_validation() -> None:
    q, k, v, do = make_inputs(14, 1, 4, 4, 3, 3, 8)
    with pytest.raises(ValueError):
        reference_grads(q, k[:, :, :2], v[:, :, :2], do)  # 3 % 2 != 0
    with pytest.raises(ValueError):
        reference_grads(q, k, v, do[:, :3])
    with pytest.raises(ValueError):
        reference_grads(q, k, v, do, layout="sbhd")
    bad = q.float().clone()
    bad[0, 0, 0, 0] = math.inf
    with pytest.raises(ValueError):
        reference_grads(bad, k, v, do)


# -- metrics --------------------------------------------------------------------------------
def test_error_report_sanity() -> None:
    g = gen(15)
    exact = torch.randn(64, 32, generator=g, dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float16):
        u = unit_roundoff(dtype)
        x = round_f32_to(exact.float(), dtype)  # one more fp32 rounding: far below 1e-3 ULP
        rep = error_report(x, exact, dtype)
        assert rep.numel == exact.numel() and rep.passed and rep.n_above == 0
        assert 0.45 < rep.max_ulp <= 0.5 + 1e-3
        assert 0.1 * u < rep.normwise < u
        assert rep.bound == error_bound(dtype)
        # one ULP off everywhere (toward larger magnitude); up to 2.5 ULPs of the exact value
        # where x already rounded up to a power of two
        up = (x.double() + torch.sign(x.double()) * ulp(x, dtype)).to(dtype)
        assert 1.0 < error_report(up, exact, dtype).max_ulp <= 2.5 + 1e-3
        # a planted outlier is counted and moves max_ulp, hardly the norm
        bad = x.clone()
        bad[3, 4] = -bad[3, 4] * 4
        rep_bad = error_report(bad, exact, dtype)
        assert rep_bad.n_above == 1 and rep_bad.max_ulp > 100
    z = torch.zeros(3, 3, dtype=torch.float64)
    assert error_report(z, z, torch.bfloat16).normwise == 0.0
    assert math.isinf(error_report(z + 1e-9, z, torch.bfloat16).normwise)
    assert error_report(z + 1e-9, z, torch.bfloat16, floor=1.0).normwise == pytest.approx(3e-9)
    with pytest.raises(ValueError):
        error_report(z, torch.zeros(3, 4), torch.bfloat16)


def test_error_bound_formula() -> None:
    u = unit_roundoff(torch.bfloat16)
    assert error_bound(torch.bfloat16) == SAFETY * KAPPA_DEFAULT * u
    assert error_bound(torch.float16, "dv", 1.5) == SAFETY * 1.5 * 2.0**-11
    with_shape = error_bound(torch.bfloat16, "dk", 1.5, seqlen_q=64, seqlen_k=32, head_dim=16)
    assert with_shape == SAFETY * 1.5 * u + (16 + 64) * 2.0**-24
    assert error_bound(torch.bfloat16, "dq", 1.0, seqlen_q=10, seqlen_k=4, group=3) > error_bound(
        torch.bfloat16, "dq", 1.0, seqlen_q=10, seqlen_k=4
    )
    with pytest.raises(ValueError):
        error_bound(torch.bfloat16, "dz")


# -- the bound against the section-5 arithmetic -----------------------------------------------
def emulate(q, k, v, do, causal, dtype, block=16, bug=None):
    """The docs/design.md section 5 backward in fp32 with bf16/fp16 roundings, tile by tile.

    ``bug``: ``"no_D"`` drops D, ``"scale"`` scales dQ by ``1/d`` instead of ``1/sqrt(d)``,
    ``"drop_tile"`` loses the partial of KV tile 0 for the last query tile.
    """

    def lp(t: torch.Tensor) -> torch.Tensor:  # round fp32 to the storage format and back
        return round_f32_to(t.contiguous(), dtype).float()

    b_, s_q, h_, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d)
    mask = visible(s_q, s_k, causal)
    dq = torch.zeros(b_, s_q, h_, d)
    dk = torch.zeros(b_, s_k, h_kv, d)
    dv = torch.zeros(b_, s_k, h_kv, v.shape[3])
    for b in range(b_):
        for h in range(h_):
            g = h // (h_ // h_kv)
            Q, K, V, dO = (t.float() for t in (q[b, :, h], k[b, :, g], v[b, :, g], do[b, :, h]))
            # forward: fp32 LSE, O rounded to the storage format
            s = (Q @ K.T * scale).masked_fill(~mask, -math.inf)
            lse2 = torch.logsumexp(s, dim=-1) * LOG2E
            p = torch.where(mask, torch.exp2(Q @ K.T * (scale * LOG2E) - lse2[:, None]), 0.0)
            D = (dO * lp(lp(p) @ V)).sum(dim=-1)
            if bug == "no_D":
                D = torch.zeros_like(D)
            dq_acc = torch.zeros(s_q, d)
            for j0 in range(0, s_k, block):
                cols = slice(j0, j0 + block)
                Kj, Vj = K[cols], V[cols]
                P = torch.where(
                    mask[:, cols], torch.exp2(Q @ Kj.T * (scale * LOG2E) - lse2[:, None]), 0.0
                )
                dv[b, cols, g] += lp(P).T @ dO
                dS = P * (dO @ Vj.T - D[:, None])
                dk[b, cols, g] += lp(dS).T @ Q
                part = lp(dS) @ Kj
                if bug == "drop_tile" and j0 == 0:
                    part[s_q - block :] = 0
                dq_acc = dq_acc + part  # fp32 RNE adds, j ascending
            dq[b, :, h] = dq_acc * (1 / d if bug == "scale" else scale)
    return tuple(round_f32_to(t, dtype) for t in (dq, dk * scale, dv))


BOUND_CASES = [
    # seed, S_q, S_k, H, H_kv, d, causal, offsets (q, k, v, do)
    (20, 64, 64, 2, 1, 32, False, (0, 0, 0, 0)),
    (21, 64, 64, 2, 2, 16, True, (0, 0, 0, 0)),
    (22, 48, 80, 4, 2, 16, True, (0, 0, 0, 0)),
    (23, 80, 33, 2, 2, 32, True, (0, 0, 0, 0)),  # S_q > S_k, empty rows
    (24, 40, 56, 2, 1, 64, False, (0, 0, 0, 0)),
    (25, 48, 48, 2, 1, 16, True, (0, 3, 0, 0)),  # keys with a large common offset
    (26, 48, 40, 2, 2, 16, False, (1, 1, 1, 1)),
    (27, 40, 40, 2, 1, 16, True, (0, 0, 3, 0)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", BOUND_CASES, ids=[f"case{c[0]}" for c in BOUND_CASES])
def test_bound_holds_with_margin(case, dtype: torch.dtype) -> None:
    seed, s_q, s_k, h, h_kv, d, causal, offsets = case
    q, k, v, do = make_inputs(seed, 1, s_q, s_k, h, h_kv, d, dtype, offsets=offsets)
    exact = reference_grads(q, k, v, do, causal=causal)
    reports = grad_error_reports(exact, *emulate(q, k, v, do, causal, dtype))
    u = unit_roundoff(dtype)
    for name, rep in reports.items():
        kappa = exact.kappa[name]
        assert 1.0 <= kappa < 200
        assert rep.passed, (name, rep)
        # the measured error is about 0.42 kappa u: at least twice below the bound
        assert rep.normwise <= 0.5 * SAFETY * kappa * u, (name, rep, kappa)
        assert rep.normwise >= 0.1 * kappa * u  # and the bound is not vacuous


def test_bound_tiny_shapes() -> None:
    g = gen(40)
    for i in range(60):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        s_q, s_k, d = (int(x) for x in torch.randint(1, 7, (3,), generator=g))
        q, k, v, do = make_inputs(100 + i, 1, s_q, s_k, 2, 1, d, dtype)
        causal = i % 3 == 0
        exact = reference_grads(q, k, v, do, causal=causal)
        reports = grad_error_reports(exact, *emulate(q, k, v, do, causal, dtype, block=2))
        for name, rep in reports.items():
            if math.isfinite(exact.kappa[name]):
                assert rep.passed, (i, name, rep, exact.kappa[name])


def test_gradual_underflow_counts_a_value_as_the_formats_smallest_normal() -> None:
    """Below its normal range fp16 rounds with an absolute error of up to 2**-25, far more
    than ``u |x|``, never more than ``u * tiny``; an exact zero rounds exactly."""
    assert storage_tiny(torch.float16) == 2.0**-14
    assert storage_tiny(torch.bfloat16) == 2.0**-126
    u, tiny = unit_roundoff(torch.float16), storage_tiny(torch.float16)
    x = torch.tensor([3.01e-6, -2e-7, 4.4e-5, 1e-3, 0.0], dtype=torch.float64)
    err = (x.to(torch.float16).double() - x).abs()
    size = torch.from_numpy(rounded_size(x.numpy(), tiny))
    assert (err[:2] > 10 * u * x[:2].abs()).all()  # the relative model alone misses them
    assert (err <= u * size).all()
    assert size[1] == tiny and size[3] == 1e-3 and size[4] == 0.0


def test_kappa_reflects_conditioning() -> None:
    q, k, v, do = make_inputs(41, 1, 32, 32, 1, 1, 16)
    plain = reference_grads(q, k, v, do).kappa
    assert all(1.0 <= plain[n] < 2.5 for n in ("o", "dq", "dk", "dv"))
    q, k, v, do = make_inputs(41, 1, 32, 32, 1, 1, 16, offsets=(0, 3, 0, 0))
    offset = reference_grads(q, k, v, do).kappa
    assert offset["dq"] > 2.5 * plain["dq"]
    assert offset["dv"] < 2.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("bug", ["no_D", "scale", "drop_tile"])
def test_bound_catches_wrong_gradients(bug: str, dtype: torch.dtype) -> None:
    q, k, v, do = make_inputs(42, 1, 64, 64, 2, 1, 16, dtype)
    for causal in (False, True):
        exact = reference_grads(q, k, v, do, causal=causal)
        good = grad_error_reports(exact, *emulate(q, k, v, do, causal, dtype))
        assert all(r.passed for r in good.values())
        rep = grad_error_reports(exact, *emulate(q, k, v, do, causal, dtype, bug=bug))["dq"]
        assert rep.normwise > 3 * rep.bound, (bug, causal, rep)
        assert rep.n_above > 0
        if bug == "drop_tile":
            assert rep.n_above <= 2 * 16 * 16  # the lost partial sits in the last query tile
