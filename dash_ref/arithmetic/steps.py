"""The arithmetic contract as code: every floating-point step of attention, one function each.

Kernels and the CPU reference share one sequence of floating-point operations. Each step is
one function here, registered under the name that the kernels' comments and contract
tables use (:data:`STEPS`); the emulator (:mod:`dash_ref.emulate`) is these steps in the
order a schedule gives, nothing else. A step that can round in more than one way takes an
:class:`Arithmetic`:

- :data:`IEEE`: matrix products as PyTorch computes them on the CPU (fp32 sums of exactly
  upcast operands), a correctly rounded ``exp2``, ``D`` summed by ``torch.sum``, plain fp32
  dQ additions. It fixes *which* sums happen in *what order* at the tile level, which is
  what a schedule decides; the docs use it to show order effects.
- :data:`EXACT`: the operations of the kernels' ``exact=True`` mode, bit for bit: products
  by the tensor-core model (:func:`~dash_ref.arithmetic.tensorcore.mma`, k16 blocks fused,
  ascending; ``dV`` and ``dK`` accumulate inside the MMA), ``P`` from one fused
  multiply-add and :func:`~dash_ref.arithmetic.exp2.exp2_fma`, ``D`` as a pairwise tree,
  dQ additions that flush subnormals (``red.add.f32``).
- :data:`FAST`: the kernels' default arithmetic as the CuTe backend runs it, bit for bit,
  forward and backward: the tensor-core model, ``exp2`` and ``log2`` from the models of
  ``MUFU.EX2`` and ``MUFU.LG2`` (:mod:`~dash_ref.arithmetic.mufu`), ``D`` as a pairwise
  tree, dQ additions that keep subnormals (the bulk reduce-add); the forward in the CuTe
  kernel's order (raw scores, four partial row sums per row, a reciprocal).

Tensors are fp32 unless a step says otherwise; ``rnd`` is round-to-nearest-even to the
input dtype (bf16 or fp16). Tiles are given on the rows and keys that exist: zero padding
changes no bit in either arithmetic (zeros take no part in the tensor-core model and pad
``k`` at its end, as a kernel's masked loads do).

Which instruction each step becomes in each kernel is written in the backend's contract
table (``dash_cuda/backends/<name>/contract.py``); ``docs/design.md`` shows both side by side,
generated from the two.

**Optional features** (FlashAttention's ``softcap`` and FlashAttention-4's
``learnable_sink``) are steps of their own, each registered with its ``feature``
(:attr:`Step.feature`). They are not among the steps every backend's contract must list
(:func:`steps_of` leaves them out unless asked). An arithmetic carries the features whose
steps it models (:attr:`Arithmetic.features`): :data:`IEEE` both, :data:`FAST` the sinks
(the CuTe forward computes them), :data:`EXACT` neither; the others are refused with a
one-line error (:func:`require_feature`), so that an L2 comparison never compares a step
nobody has modelled in the kernels' arithmetic (a kernel's ``tanh.approx.f32`` needs a
bit-exact model first, as ``ex2.approx`` has).

- *Softcap* (Gemma 2, Grok; FlashAttention's ``softcap``): the scores become
  ``softcap * tanh(S * softmax_scale / softcap)`` before the softmax, which then takes no
  further scale, as FlashAttention does (``flash_attn/cute/interface.py``: ``score_mod =
  create_softcap_scoremod(softcap)`` with ``softmax_scale_log2 = log2(e)``; the score mod
  receives ``acc_S * softmax_scale`` (``softmax.apply_score_mod_inner``) and returns
  ``softcap * tanh(score / softcap)`` (``utils.create_softcap_scoremod``); the reference
  ``testing.attention_ref`` computes ``tanh((q * scale) k^T / softcap) * softcap``). Steps
  :func:`softcap` (both passes) and :func:`softcap_grad` (the backward's
  ``dS = dS' (1 - tanh^2)``, ``utils.create_softcap_scoremod_bwd``); the base-2 constant
  is then ``c = fp32(log2 e)`` (:func:`scale_log2` of 1).
- *Learnable sink* (gpt-oss; FlashAttention-4's ``learnable_sink``, one fp32 logit per
  query head): an extra softmax column of logit ``sink_h`` with no value vector. It is in
  the units of the final scores (natural log, after ``softmax_scale`` and softcap, not
  multiplied by either: ``flash_attn/cute/softmax.py``, ``apply_learnable_sink`` and
  ``Softmax.finalize``, which add ``exp2(sink * log2(e) - row_max * scale_log2)`` to the
  row sum); it joins every row's denominator and so the LSE
  (``LSE = log(sum_c exp(s_c) + exp(sink))``; a row that sees no key has ``O = 0`` and
  ``LSE = sink``), and its gradient is ``dsink_h = -sum_rows exp(sink_h - LSE) D``
  (FlashAttention-4's formula; ``D = rowsum(dO * O)``). Steps :func:`fwd_sink` (folded
  into the row's maximum, sum and output after the last KV tile) and :func:`sink_grad`
  (the sum over rows in a fixed order).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from .._checks import choice, number
from .exp2 import exp2_fma
from .mufu import ex2_approx_ftz, lg2_approx_ftz
from .numerics import fma_f32, fp32_add_rne
from .tensorcore import K_STEP, mma

F32 = torch.float32


def exp2_rn(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^x``, correctly rounded: float64 ``exp2`` rounded once to fp32. torch's fp32
    ``exp2`` and ``log2`` are the host's vector routines, within an ulp, and their bits
    differ between AVX2 and AVX-512 hosts; a float64 result (error below an ulp of float64)
    rounds to the correctly rounded fp32 unless the exact value lies within 2^-29 fp32 ulp
    of a tie."""
    return torch.exp2(x.double()).to(F32)


def log2_rn(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``log2(x)``, correctly rounded as :func:`exp2_rn` is."""
    return torch.log2(x.double()).to(F32)
LOG2E = 1.4426950408889634


# -- arithmetics ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Arithmetic:
    """How the steps round: one complete description of an arithmetic."""

    name: str
    tensor_cores: bool  # matrix products by the tensor-core model (else PyTorch's CPU fp32)
    # the backward's exp2: "ieee": exp2_rn of a rounded product and difference; "fma":
    # exp2_fma of an fma; "mufu": the MUFU.EX2 model of an fma
    exp2: str
    delta_order: str  # "torch": torch.sum; "pairwise": an ascending pairwise tree
    flush_dq_adds: bool  # dQ additions flush subnormal inputs and results (red.add.f32)
    # the forward's order of steps: "ieee" (scores scaled one by one, torch.sum rows, a
    # quotient, exp2 and log2 correctly rounded), "cute" (the CuTe kernel's: raw scores,
    # four partial sums per row, a reciprocal, the MUFU models), or None (not emulated)
    forward: str | None = "ieee"
    # the optional features whose steps this arithmetic computes ("softcap", "sinks"): the
    # IEEE arithmetic has both; a kernel's arithmetic those its kernels compute
    features: tuple[str, ...] = ()
    # the sinks' gradient (sink_grad): "rows" (correctly rounded exp2, one row after
    # another) or "lanes" (the one sink kernel every backend runs: exp2_fma, SINK_LANES
    # lanes joined by a pairwise tree)
    sink_order: str = "rows"

    def with_dq_adds(self, flush_subnormals: bool) -> Arithmetic:
        """This arithmetic with dQ additions that do (or do not) flush subnormals."""
        return replace(self, flush_dq_adds=bool(flush_subnormals))


#: the optional features of the steps (module docstring)
FEATURES = ("softcap", "sinks")
IEEE = Arithmetic("ieee", tensor_cores=False, exp2="ieee", delta_order="torch",
                  flush_dq_adds=False, features=FEATURES)
EXACT = Arithmetic("exact", tensor_cores=True, exp2="fma", delta_order="pairwise",
                   flush_dq_adds=True, forward=None, features=FEATURES,
                   sink_order="lanes")
FAST = Arithmetic("fast", tensor_cores=True, exp2="mufu", delta_order="pairwise",
                  flush_dq_adds=False, forward="cute", features=FEATURES,
                  sink_order="lanes")
#: the arithmetics by name (``arithmetic=`` of :func:`dash_ref.emulate.backward`)
ARITHMETICS = {a.name: a for a in (IEEE, EXACT, FAST)}


def arithmetic(spec: str | Arithmetic) -> Arithmetic:
    """The :class:`Arithmetic` named by ``spec`` (``"ieee"``, ``"fast"``, ``"exact"``) or
    ``spec`` itself."""
    if isinstance(spec, Arithmetic):
        return spec
    if spec not in ARITHMETICS:
        raise ValueError(f"arithmetic={spec!r}: expected one of {tuple(ARITHMETICS)}")
    return ARITHMETICS[spec]


_FEATURE_ARGUMENT = {"softcap": "softcap", "sinks": "learnable_sink"}


def require_feature(a: Arithmetic, feature: str) -> None:
    """Refuse, in one line naming the argument, an optional feature ``a`` does not compute
    (module docstring)."""
    choice("feature", feature, FEATURES)
    if feature not in a.features:
        having = [x.name for x in ARITHMETICS.values() if feature in x.features]
        raise ValueError(f"{_FEATURE_ARGUMENT[feature]} is emulated in {having} arithmetic "
                         f"only, not {a.name!r}: there is no bit-exact model of its steps "
                         "in that arithmetic to compare with")


# -- the step registry ----------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One named floating-point step: where it runs, what it computes, its function."""

    name: str
    stage: str  # "forward", "backward" or "both"
    formula: str
    fn: Callable
    # the optional feature the step belongs to ("softcap", "sinks"), or None for a step of
    # every call (the steps every backend's contract lists)
    feature: str | None = None


#: every step by name, in the order a visit computes them (``docs/design.md`` lists them)
STEPS: dict[str, Step] = {}


def step(name: str, stage: str, formula: str, feature: str | None = None
         ) -> Callable[[Callable], Callable]:
    """Register a step function under its contract name (``feature``: the optional feature
    it belongs to, module docstring)."""
    if feature is not None:
        choice("feature", feature, FEATURES)

    def register(fn: Callable) -> Callable:
        if name in STEPS:
            raise ValueError(f"step {name!r} is registered twice")
        STEPS[name] = Step(name, stage, formula, fn, feature)
        fn.step = name
        return fn

    return register


def steps_of(stage: str, features: bool = False) -> list[Step]:
    """The steps a ``"forward"`` or ``"backward"`` pass computes, in order: those of every
    call (what a backend's contract lists), and with ``features=True`` also the steps of
    the optional features (softcap, sinks)."""
    return [s for s in STEPS.values()
            if s.stage in (stage, "both") and (features or s.feature is None)]


def _matmul(a: Arithmetic, x: torch.Tensor, y: torch.Tensor, acc: torch.Tensor | None = None
            ) -> torch.Tensor:
    """``acc + x @ y`` (fresh when ``acc`` is None) in the arithmetic's matrix products.

    ``x``, ``y`` hold operand-dtype values (as fp32 or in that dtype). IEEE: PyTorch's fp32
    product, then one fp32 addition. Tensor cores: the MMA model with ``acc`` inside the
    fused sum; ``k`` is padded with zeros to a multiple of 16, which changes no bit.
    """
    if not a.tensor_cores:
        product = x.to(F32) @ y.to(F32)
        return product if acc is None else acc + product
    pad = -x.shape[1] % K_STEP
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[0], pad)], 1)
        y = torch.cat([y, y.new_zeros(pad, y.shape[1])], 0)
    return mma(x, y, acc)


# -- shared constants -----------------------------------------------------------------------
def default_scale(head_dim: int) -> float:
    """The softmax scale when none is given: ``1 / sqrt(d)`` (float64)."""
    return 1.0 / math.sqrt(head_dim)


def resolve_scale(softmax_scale: float | None, head_dim: int) -> float:
    """``softmax_scale`` (a finite number; bools and strings are refused), or
    :func:`default_scale` when it is None."""
    if softmax_scale is None:
        return default_scale(head_dim)
    return number("softmax_scale", softmax_scale)


@step("scale_log2", "both", "c = fp32(softmax_scale * log2(e))")
def scale_log2(softmax_scale: float) -> torch.Tensor:
    """The fp32 constant scores are multiplied by: the float64 product rounded once."""
    return torch.tensor(softmax_scale * LOG2E, dtype=F32)


@lru_cache(maxsize=64)
def scale_log2_value(softmax_scale: float) -> float:
    """:func:`scale_log2` as a Python float (exactly the fp32 value), for kernel arguments."""
    return float(scale_log2(softmax_scale))


@step("round_operand", "both", "rnd(x): fp32 rounded to the input dtype (RNE)")
def round_operand(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An fp32 value rounded (RNE) to the matmul operand dtype, returned as fp32."""
    return x.to(dtype).to(F32)


# -- softcap (an optional feature, IEEE only) -------------------------------------------------
def tanh_f32(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``tanh``: PyTorch's float64 ``tanh`` of the (exact) fp32 input, rounded once to fp32.

    The float64 result is within an ulp of float64 (2^-52 relative) of the exact value, so
    rounding it gives the correctly rounded fp32 ``tanh`` except where the exact value
    lies within that distance of a midpoint between two fp32 numbers (about one input in
    2^28); there the bits are those of float64 ``tanh`` rounded, which is what this step
    defines. Odd (``tanh(-x) = -tanh(x)``), ``tanh(+-0) = +-0``, ``tanh(+-inf) = +-1``, NaN
    stays NaN.
    """
    return torch.tanh(x.to(torch.float64)).to(F32)


#: lanes of the kernels' sink gradient sum (:func:`sink_grad`; the kernel's ``BLOCK``)
SINK_LANES = 1024


def ratio_softcap(a: Arithmetic) -> bool:
    """Whether ``a`` caps scores in the ratio form ``softcap (1 - 2 r)``, ``r = 1 / (1 +
    e^(2y))`` (the fast and the exact arithmetic: steps the CPU reproduces), which folds the
    gradient's slope into ``P`` before [ds] (:func:`softcap_grad`), rather than with
    ``tanh`` (IEEE)."""
    return a.forward == "cute" or a.exp2 == "fma"


def softcap_constants(softmax_scale: float, cap: float) -> tuple[float, float]:
    """The fast softcap's fp32 constants, as Python floats (kernel arguments): ``k =
    fp32(2 softmax_scale log2(e) / softcap)`` (the float64 value rounded once) and
    ``fp32(softcap)``."""
    k = torch.tensor(2.0 * softmax_scale * LOG2E / cap, dtype=F32)
    return float(k), float(torch.tensor(cap, dtype=F32))


@step("softcap", "both", "x = S * fp32(softmax_scale); t = tanh(x / softcap); "
      "S' = softcap * t; then base 2 with c = fp32(log2 e)", feature="softcap")
def softcap(a: Arithmetic, s: torch.Tensor, softmax_scale: float, cap: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Capped scores ``S'`` (natural-log units) of raw fp32 products ``S``, and what
    :func:`softcap_grad` needs of them: ``t`` (IEEE) or ``r`` (fast).

    IEEE: one fp32 multiply by ``fp32(softmax_scale)``, one correctly rounded fp32 division
    by ``fp32(softcap)``, :func:`tanh_f32`, one fp32 multiply by ``fp32(softcap)``
    (FlashAttention's order: the scale first, then ``softcap * tanh(score / softcap)``).
    The caller multiplies ``S'`` by ``c = fp32(log2 e)`` where the plain path multiplies
    ``S`` by ``fp32(softmax_scale log2 e)``.

    Fast (the CuTe kernels; ``tanh(y) = 1 - 2 / (1 + e^(2y))``): ``u = S * k``
    (``mul.rn.f32``, ``k`` of :func:`softcap_constants`), ``e = ex2(u)``, ``w = e + 1``
    (``add.rn.f32``), ``r = 1 / w`` as ``ex2(-lg2(w))`` (the MUFU models; a correctly
    rounded reciprocal would call a slow-path subroutine per element in the kernels) and
    ``S' = fma.rn(r, -2 softcap, softcap)``; ``r`` goes to :func:`softcap_grad`. Every
    step is one rounding the CPU reproduces, so the capped scores are the kernels' bits;
    against ``softcap * tanh`` they are off by at most 8 ulps of ``softcap`` (the MUFU
    errors, then the cancellation of ``1 - 2r`` near 0: ``tests/test_softcap_fast.py``).

    Exact (the Triton backward with ``exact=True``): the same form with ``e =
    exp2_fma(u)`` (:func:`~dash_ref.arithmetic.exp2.exp2_fma`) and ``r = 1 / w`` by a
    correctly rounded division (``div.rn.f32``), both of which the CPU reproduces.
    """
    require_feature(a, "softcap")
    if ratio_softcap(a):
        k, cap32 = softcap_constants(softmax_scale, cap)
        u = s * torch.tensor(k, dtype=F32)
        if a.exp2 == "fma":
            r = torch.tensor(1.0, dtype=F32) / (exp2_fma(u) + torch.tensor(1.0, dtype=F32))
        else:
            w = ex2_approx_ftz(u) + torch.tensor(1.0, dtype=F32)
            r = ex2_approx_ftz(-lg2_approx_ftz(w))
        return fma_f32(r, -2.0 * cap32, cap32), r
    cap32 = torch.tensor(cap, dtype=F32)
    x = s * torch.tensor(softmax_scale, dtype=F32)
    t = tanh_f32(x / cap32)
    return cap32 * t, t


# -- forward ---------------------------------------------------------------------------------
# Scores are in base-2 units throughout. IEEE: the scores are scaled one by one, rows summed
# by torch.sum, O a quotient. Fast (the CuTe forward, bit for bit): the raw products are
# kept and the scale enters twice (on the row maximum, inside each probability's fma),
# exp2 and log2 come from the MUFU models, each of a row's four threads sums its own
# columns (:func:`quad_sums`) and O is acc times a correctly rounded reciprocal.
@step("fwd_scores", "forward", "s = (Q_i K_j^T) * c; masked elements -inf")
def fwd_scores(a: Arithmetic, q_i: torch.Tensor, k_j: torch.Tensor, c: torch.Tensor,
               visible: torch.Tensor, capped: tuple[float, float] | None = None
               ) -> torch.Tensor:
    """Scores of one tile pair, masked to ``-inf``.

    IEEE: an fp32 product, then one multiply by ``c`` (base-2 units). Fast: the raw
    tensor-core products ``Q_i K_j^T``; ``c`` enters in :func:`fwd_max` and :func:`fwd_probs`.
    With ``capped = (softmax_scale, softcap)`` the product goes through :func:`softcap`
    first (``c`` is then ``fp32(log2 e)``).
    """
    s = _matmul(a, q_i, k_j.T)
    if capped is not None:
        s = softcap(a, s, *capped)[0]
    if a.forward != "cute":
        s = s * c
    return torch.where(visible, s, torch.tensor(-math.inf))


@step("fwd_max", "forward", "m' = max(m, rowmax(s)); m_safe = m' or 0 where m' = -inf")
def fwd_max(a: Arithmetic, m: torch.Tensor, s: torch.Tensor, c: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The running row maximum and the value subtracted before exp2 (0 for unseen rows).

    Fast: ``rnd32(rowmax(x) * c)`` of the raw scores, one ``mul.rn.f32`` per row; rounding
    is monotone and ``c > 0``, so it is the largest rounded scaled score.
    """
    row = s.max(dim=1).values
    if a.forward == "cute":
        row = row * c
    m_new = torch.maximum(m, row)
    return m_new, torch.where(torch.isinf(m_new), torch.zeros(()), m_new)


@step("fwd_probs", "forward", "P = exp2(s - m_safe); alpha = exp2(m - m_safe)")
def fwd_probs(a: Arithmetic, s: torch.Tensor, m: torch.Tensor, m_safe: torch.Tensor,
              c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalized probabilities of the tile and the rescale factor of the old sums.

    Fast: ``P = ex2(fma(x, c, -m_safe))`` of the raw scores and ``alpha = ex2(m - m_safe)``,
    ``ex2`` the MUFU model (:func:`~dash_ref.arithmetic.mufu.ex2_approx_ftz`).
    """
    if a.forward == "cute":
        p = ex2_approx_ftz(fma_f32(s, c, -m_safe[:, None]))
        return p, ex2_approx_ftz(m - m_safe)
    return exp2_rn(s - m_safe[:, None]), exp2_rn(m - m_safe)


def quad_sums(p: torch.Tensor, block_n: int) -> torch.Tensor:
    """``(rows, 4)``: each of a row's four threads' sum of its probabilities, fp32.

    In a wgmma accumulator of ``block_n`` columns, thread ``t`` of a row's four holds
    columns ``8 k + 2 t`` and ``8 k + 2 t + 1`` for ``k = 0, 1, ...`` and adds them from
    ``+0`` in that register order, one fp32 addition each. Columns past ``p``'s are zeros
    (masked keys: ``+0`` probabilities).
    """
    rows, n = p.shape
    padded = torch.cat([p, p.new_zeros(rows, block_n - n)], 1) if n < block_n else p
    per_thread = padded.reshape(rows, block_n // 8, 4, 2).permute(0, 2, 1, 3)
    per_thread = per_thread.reshape(rows, 4, block_n // 4)
    total = torch.zeros(rows, 4, dtype=F32)
    for col in range(block_n // 4):
        total = total + per_thread[:, :, col]
    return total


@step("fwd_accumulate", "forward", "l = l * alpha + rowsum(P); acc = acc * alpha + rnd(P) V_j")
def fwd_accumulate(a: Arithmetic, ell: torch.Tensor, acc: torch.Tensor, alpha: torch.Tensor,
                   p: torch.Tensor, v_j: torch.Tensor, dtype: torch.dtype, block_n: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one KV tile into the running sum and output.

    IEEE: ``l`` is ``(rows,)``, ``torch.sum`` of the row. Fast: ``l`` is ``(rows, 4)``, each
    thread's partial sum: ``fma.rn(l, alpha, quad_sums(P))``; ``acc * alpha`` (one
    ``mul.f32``), then the tensor-core product with ``acc`` as its accumulator.
    """
    if a.forward == "cute":
        ell = fma_f32(ell, alpha[:, None].expand_as(ell), quad_sums(p, block_n))
        acc = _matmul(a, p.to(dtype), v_j, acc * alpha[:, None])
        return ell, acc
    ell = ell * alpha + p.sum(1)
    acc = acc * alpha[:, None] + round_operand(p, dtype) @ v_j.to(F32)
    return ell, acc


def sink_logit(sink: torch.Tensor) -> torch.Tensor:
    """``fp32(sink * log2 e)`` per head: the float64 product of the exact fp32 logit and
    ``log2 e``, rounded once (as :func:`scale_log2` rounds its constant)."""
    return (sink.to(torch.float64) * LOG2E).to(F32)


@step("fwd_sink", "forward", "after the last KV tile: m' = max(m, s2); l = l * exp2(m - m') "
      "+ exp2(s2 - m'); acc = acc * exp2(m - m'); s2 = fp32(sink * log2(e))",
      feature="sinks")
def fwd_sink(a: Arithmetic, m: torch.Tensor, ell: torch.Tensor, acc: torch.Tensor,
             sink2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold a row's sink (base 2, ``s2 = sink_logit(sink)``) into its maximum, sum and output:
    one more column of probability ``exp2(s2 - m')`` and no value.

    IEEE: ``m' = max(m, s2)``, ``alpha = exp2(m - m')`` (correctly rounded, as
    :func:`fwd_probs`), ``l = l * alpha + exp2(s2 - m')`` (two roundings) and
    ``acc = acc * alpha``. Where the sink is not above the row's maximum ``alpha = 1``
    exactly and this is FlashAttention-4's ``row_sum += exp2(sink * log2(e) - row_max *
    scale_log2)``; a row that saw no key gets ``m' = s2``, ``l = 1``, ``acc = 0``, so
    ``O = 0`` and ``LSE2 = s2`` (FlashAttention-4: ``lse = sink``); a sink far above the
    row's scores rescales the row instead of overflowing its sum.

    Fast (the CuTe forward's finish): the row's four partial sums first become one
    (:func:`_row_total`), then ``alpha = ex2(m - m')`` and ``l = fma.rn(l, alpha,
    ex2(s2 - m'))`` with the MUFU model, and ``acc * alpha`` (one ``mul.f32``, before
    :func:`fwd_finish`'s reciprocal); the sum is returned as the first of four partial sums,
    the others ``+0``, so that :func:`fwd_finish`'s butterfly gives it back unchanged.
    """
    require_feature(a, "sinks")
    m_new = torch.maximum(m, sink2.expand_as(m))
    if a.forward == "cute":
        alpha = ex2_approx_ftz(m - m_new)
        total = fma_f32(_row_total(ell), alpha, ex2_approx_ftz(sink2 - m_new).expand_as(m))
        ell = torch.cat([total[:, None], ell.new_zeros(len(total), 3)], 1)
        return m_new, ell, acc * alpha[:, None]
    alpha = exp2_rn(m - m_new)
    ell = ell * alpha + exp2_rn(sink2 - m_new)
    return m_new, ell, acc * alpha[:, None]


def _row_total(ell: torch.Tensor) -> torch.Tensor:
    """The fast forward's row sum from its four threads' partial sums: ``(l_0 + l_1) + (l_2 +
    l_3)``, the butterfly over the row's threads (``shfl.sync.bfly`` 1, then 2; each thread
    gets these bits, the additions being commutative)."""
    return (ell[:, 0] + ell[:, 1]) + (ell[:, 2] + ell[:, 3])


@step("fwd_finish", "forward", "O = rnd(acc / l), LSE2 = m + log2(l); rows that see no key: "
      "O = 0, LSE2 = -inf")
def fwd_finish(a: Arithmetic, acc: torch.Tensor, m: torch.Tensor, ell: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalized output (fp32, rounded by the caller's store) and the base-2 LSE.

    A row that saw no key has ``l = 0``: ``O = 0``, ``LSE2 = -inf``. IEEE: a quotient and a
    correctly rounded log2; a NaN anywhere in a row's scores makes its ``l`` NaN, and so its
    ``O`` and ``LSE2``, as in PyTorch's SDPA. Fast: ``l = (l_0 + l_1) + (l_2 + l_3)`` (the
    butterfly over the row's threads), ``O = acc * rcp.rn(l)``, ``LSE2 = m + lg2(l)`` with
    the MUFU model; rows with ``l > 0`` only (finite inputs: the fast forward does not
    propagate NaN as IEEE does).
    """
    if a.forward == "cute":
        total = _row_total(ell)
        seen = total > 0
        inv = (1.0 / total.double()).to(F32)  # rcp.rn: division double-rounds innocuously
        inv = torch.where(seen, inv, torch.zeros((), dtype=F32))
        lse2 = torch.where(seen, m + lg2_approx_ftz(total), torch.tensor(-math.inf))
        return acc * inv[:, None], lse2
    unseen = ell == 0
    o = torch.where(unseen[:, None], 0.0, acc / torch.where(unseen, 1.0, ell)[:, None])
    lse2 = torch.where(unseen, torch.tensor(-math.inf), m + log2_rn(ell))
    return o, lse2


# -- backward --------------------------------------------------------------------------------
@step("delta", "backward", "D_i = rowsum(dO_i * O_i)")
def delta(a: Arithmetic, o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """``D = rowsum(dO * O)`` over the head dim, fp32, for ``(..., d)`` inputs.

    The products are exact upcasts multiplied in fp32 (``mul.f32``, RNE, subnormals kept).
    IEEE: summed by ``torch.sum``. Pairwise (:data:`EXACT`, :data:`FAST`): level 0 holds
    the products in ascending column, then ``+0.0`` up to the next power of two; each level
    replaces elements ``2m`` and ``2m + 1`` by their fp32 sum, until one value is left. A
    kernel gets the same bits by halving a zero-padded ``(M, 2^k)`` tile ``k`` times (a sum
    of two is one commutative add; the padding is what makes d = 96 a tile).
    """
    x = do.to(F32) * o.to(F32)
    if a.delta_order == "torch":
        return x.sum(-1)
    width = 1 << (x.shape[-1] - 1).bit_length()
    x = torch.nn.functional.pad(x, (0, width - x.shape[-1]))  # +0.0
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


@step("qk", "backward", "S = Q_i K_j^T (fresh fp32 accumulator)")
def qk(a: Arithmetic, q_i: torch.Tensor, k_j: torch.Tensor) -> torch.Tensor:
    """The scores of one tile pair, ``k = d``."""
    return _matmul(a, q_i, k_j.T)


@step("softmax_p", "backward", "P = exp2(S * c - LSE2_i); masked elements exactly 0")
def softmax_p(a: Arithmetic, s: torch.Tensor, c: torch.Tensor, lse2_i: torch.Tensor,
              visible: torch.Tensor) -> torch.Tensor:
    """The probabilities, recomputed from the forward's base-2 LSE.

    IEEE: the product and the difference each rounded, then a correctly rounded exp2.
    ``fma``: ``exp2_fma(fma(S, c, 0 - LSE2))``: one fused multiply-add (``fma.rn.f32``),
    the negation written ``0 - LSE2`` (``sub.rn.f32``, so ``+0`` stays ``+0``), then
    :func:`~dash_ref.arithmetic.exp2.exp2_fma`. ``mufu``: ``ex2(fma(S, c, -LSE2))`` with the
    MUFU model (:func:`~dash_ref.arithmetic.mufu.ex2_approx_ftz`) and a sign flip.
    Masked elements are selected to ``+0``.
    """
    if a.exp2 == "fma":
        p = exp2_fma(fma_f32(s, c, torch.zeros((), dtype=F32) - lse2_i[:, None]))
    elif a.exp2 == "mufu":
        p = ex2_approx_ftz(fma_f32(s, c, -lse2_i[:, None]))
    else:
        p = exp2_rn(s * c - lse2_i[:, None])
    return torch.where(visible, p, torch.zeros((), dtype=F32))


@step("dv_step", "backward", "dV_j += rnd(P)^T dO_i")
def dv_step(a: Arithmetic, dv: torch.Tensor, p_op: torch.Tensor, do_i: torch.Tensor
            ) -> torch.Tensor:
    """Accumulate ``dV_j``, ``k`` = the tile's query rows (inside the MMA on tensor cores)."""
    return _matmul(a, p_op.T, do_i, dv)


@step("dp", "backward", "dP = dO_i V_j^T (fresh fp32 accumulator)")
def dp(a: Arithmetic, do_i: torch.Tensor, v_j: torch.Tensor) -> torch.Tensor:
    """The gradient of the probabilities, ``k = d``."""
    return _matmul(a, do_i, v_j.T)


@step("ds", "backward", "dS = P * (dP - D_i)")
def ds(p: torch.Tensor, dp_: torch.Tensor, delta_i: torch.Tensor) -> torch.Tensor:
    """The score gradient: an fp32 subtraction, then a multiplication, each rounded."""
    return p * (dp_ - delta_i[:, None])


@step("softcap_grad", "backward", "dS = dS' * (1 - t * t), t = tanh(x / softcap) of the "
      "visit's softcap step", feature="softcap")
def softcap_grad(a: Arithmetic, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The gradient of the raw scaled scores from that of the capped ones: ``d(softcap
    tanh(x / softcap)) / dx = 1 - tanh^2``.

    IEEE: ``x`` is ``dS'`` (after :func:`ds`): ``t * t``, ``1 - (t * t)`` and the product
    with ``dS'``, each one fp32 rounding (the epilogue's ``softmax_scale`` then turns the
    gradient of ``x = S * scale`` into that of ``S``, as without softcap).

    Fast and exact (:func:`ratio_softcap`): ``x`` is ``P`` (before :func:`ds`, which then
    takes the result in place of ``P``; the kernels keep no second fp32 tile across the dP
    product) and ``t`` is :func:`softcap`'s ``r``: ``1 - tanh^2 = 4 r (1 - r)`` as ``4 *
    fma.rn(-r, r, r)`` (the multiply by 4 exact), then ``mul.rn.f32`` with ``P``.
    """
    require_feature(a, "softcap")
    if ratio_softcap(a):
        return x * (fma_f32(-t, t, t) * 4.0)
    return x * (1.0 - t * t)


@step("dk_step", "backward", "dK_j += rnd(dS)^T Q_i")
def dk_step(a: Arithmetic, dk: torch.Tensor, ds_op: torch.Tensor, q_i: torch.Tensor
            ) -> torch.Tensor:
    """Accumulate ``dK_j`` (unscaled), ``k`` = the tile's query rows."""
    return _matmul(a, ds_op.T, q_i, dk)


@step("dq_partial", "backward", "dQ_ij = rnd(dS) K_j (fresh fp32 accumulator)")
def dq_partial(a: Arithmetic, ds_op: torch.Tensor, k_j: torch.Tensor) -> torch.Tensor:
    """The visit's fp32 dQ partial, ``k`` = the tile's keys."""
    return _matmul(a, ds_op, k_j)


@step("dq_add", "backward", "dQacc_i += dQ_ij, one fp32 RNE add per partial, in the tile's "
      "dQ order, from +0")
def dq_add(acc: torch.Tensor, partial: torch.Tensor, flush_subnormals: bool = False
           ) -> torch.Tensor:
    """One fp32 round-to-nearest-even addition.

    Subnormals are kept (a plain load-add-store), or with ``flush_subnormals`` flushed in
    the inputs and the result, as a global ``red.add.f32`` does.
    """
    return fp32_add_rne(acc, partial, flush_subnormals=flush_subnormals)


@step("gqa_sum", "backward", "dK, dV of a KV head: ((+0 + X_h0) + X_h1) + ..., query heads "
      "ascending")
def gqa_sum(per_head: torch.Tensor, group: int) -> torch.Tensor:
    """Per-query-head fp32 ``(B, S_k, H, d)`` dK (or dV) summed per KV head.

    With one query head per KV head the accumulator is used as is; otherwise the sum starts
    from ``+0.0``, one fp32 RNE addition (subnormals kept) per query head, ascending.
    """
    if group == 1:
        return per_head.clone()
    b, s, heads, d = per_head.shape
    out = torch.zeros(b, s, heads // group, d, dtype=F32)
    for h in range(heads):
        out[:, :, h // group] = out[:, :, h // group] + per_head[:, :, h]
    return out


@step("epilogue", "backward", "dQ = rnd(dQacc * scale), dK = rnd(dK_acc * scale), "
      "dV = rnd(dV_acc)")
def epilogue(acc: torch.Tensor, scale: float | None, dtype: torch.dtype) -> torch.Tensor:
    """One fp32 multiply by ``scale`` (if any), then an RNE cast to ``dtype``."""
    if scale is not None:
        acc = acc * torch.tensor(scale, dtype=F32)
    return acc.to(dtype)


@step("sink_grad", "backward", "dsink_h = -sum_r t_r, t_r = exp2(s2_h - LSE2_r) * D_r: rows "
      "one by one (IEEE) or the sink kernel's lanes and pairwise tree", feature="sinks")
def sink_grad(a: Arithmetic, sink2: torch.Tensor, lse2: torch.Tensor, delta: torch.Tensor,
              rows_per_batch: int | None = None) -> torch.Tensor:
    """The sink logits' gradient, fp32 ``(H,)``: ``-sum_r P_sink,r D_r`` over every query row.

    ``lse2`` and ``delta`` are ``(R, H)``: the rows in layout order (``(B, S_q, H)`` with
    its first two dims flattened, batch by batch, ``rows_per_batch = S_q``; a packed
    batch's ``(total_q, H)``, one batch of all its rows: None). ``a.sink_order``:

    - ``"rows"`` (IEEE): ``P_sink = exp2(s2 - LSE2)`` (one rounded difference, a correctly
      rounded exp2), one fp32 product ``t = P_sink * D``, then per head one fp32
      subtraction per row from ``+0``, rows ascending. A row without keys has ``O = 0``,
      so ``D = 0`` and it adds ``-0``.
    - ``"lanes"`` (exact and fast: the one kernel every backend runs,
      ``dash_cuda.prepost.dash_sink_grad_kernel``): ``t = exp2_fma(s2 - LSE2) * D``
      (``sub.rn``, :func:`~dash_ref.arithmetic.exp2.exp2_fma`, ``mul.rn``); lane ``l`` of
      :data:`SINK_LANES` adds, from ``+0``, the terms of each batch's rows ``l, l +
      SINK_LANES, ...`` (batch by batch; a lane past a batch's last row adds ``+0``); the
      lanes are then joined by a pairwise tree (neighbours first, as ``D``'s) and the sum
      negated.
    """
    require_feature(a, "sinks")
    if a.sink_order == "lanes":
        terms = exp2_fma(sink2[None, :] - lse2) * delta
        rows, heads = terms.shape
        per_batch = rows_per_batch or rows
        acc = torch.zeros(SINK_LANES, heads, dtype=F32)
        for first in range(0, rows if per_batch else 0, per_batch or 1):
            batch = terms[first:first + per_batch]
            pad = -len(batch) % SINK_LANES  # lanes past the batch's rows add +0
            batch = torch.cat([batch, batch.new_zeros(pad, heads)])
            for chunk in batch.view(-1, SINK_LANES, heads):
                acc = acc + chunk
        while len(acc) > 1:
            acc = acc[0::2] + acc[1::2]
        return -acc[0]
    terms = exp2_rn(sink2[None, :] - lse2) * delta
    acc = torch.zeros(sink2.shape, dtype=F32)
    for r in range(terms.shape[0]):
        acc = acc - terms[r]
    return acc
