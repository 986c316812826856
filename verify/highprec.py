"""High-precision attention gradients for small shapes, error metrics, and the accuracy bound.

Reference values (:func:`reference_grads`)
    Given the *same* low-precision inputs a kernel sees (bf16/fp16 ``Q, K, V, dO``, upcast
    exactly), compute the mathematically exact attention forward and backward::

        P  = softmax(scale * Q K^T)  (masked logits excluded)     LSE = log sum exp(scale * Q K^T)
        O  = P V                      dV = P^T dO                  dP  = dO V^T
        D  = rowsum(dO * O)           dS = P * (dP - D)
        dQ = scale * dS K             dK = scale * dS^T Q

    Every input is a binary float, so it is an integer times a power of two; the matrix
    products, ``D``, ``dS`` and the scalings are done in exact integer arithmetic (Python
    integers in NumPy object arrays, one power-of-two exponent per matrix). Only three
    things are not exact: ``exp``/``log``/division for the softmax and the value of
    ``scale`` when it is irrational (``1/sqrt(d)`` for ``d`` not a power of 4); those are
    computed in ``mpmath`` with ``dps`` significant decimal digits (default 50) and then
    carried exactly. ``D`` uses the exact ``O``. The results are rounded once to float64
    (correctly rounded from the exact integer form), far finer than bf16/fp16, so they
    are the "exact" side of every ULP and normwise metric. A kernel that uses ``scale``
    rounded to fp32 differs from ``1/sqrt(d)`` by at most ``2**-24`` relative, inside the fp32
    term of the bound; pass that value as ``softmax_scale`` to take it exactly.

    Masks: ``full`` or ``causal``, bottom-right aligned when ``S_q != S_k`` (query row ``r``
    sees key ``c`` iff ``c <= r + S_k - S_q``). A row that sees no key has ``O = 0``,
    ``LSE = -inf`` and contributes nothing to any gradient (its ``dQ`` is 0). GQA: ``H`` query
    heads share ``H_kv`` key/value heads (query head ``h`` uses KV head ``h // (H // H_kv)``),
    and ``dK, dV`` of a KV head are summed over its query heads. Layout ``(B, S, H, d)``
    (``layout="bshd"``, FlashAttention's) or ``(B, H, S, d)`` (``layout="bhsd"``, SDPA's);
    outputs use the same layout, ``LSE`` is ``(B, H, S_q)`` (natural log, of the scaled
    logits).

    FlashAttention's other features, as :mod:`dash_ref.arithmetic.steps` states them:
    ``window_size=(left, right)`` (the rule of :class:`dash_ref.Mask`); ``v`` with its own
    head dim ``d_v``; ``softcap > 0``: the logits are ``z = softcap * tanh(x / softcap)``,
    ``x = scale * Q K^T`` exact, ``t = tanh(x / softcap)`` in mpmath, and
    ``dS = P (dP - D) (1 - t**2)`` (``t**2`` and the products exact; ``dQ``, ``dK`` then carry
    ``scale`` as before); ``learnable_sink`` (``(H,)``, FlashAttention-4's): one more column
    of logit ``sink_h`` with no value, so ``LSE = log(sum exp(z) + exp(sink))`` (a row that
    sees no key: ``O = 0``, ``LSE = sink``), and ``dsink_h = -sum_{b, r} P_sink D`` with
    ``P_sink = exp(sink - LSE)`` from mpmath, ``D`` exact (``HighPrecResult.dsink``).

Metrics (:func:`error_report`)
    ``max_ulp`` (largest elementwise error in ULPs of the output format, from
    :func:`dash_ref.arithmetic.numerics.ulp_error`; information only: where a gradient cancels to
    almost nothing a correct result can be many ULPs off), ``normwise``
    ``= ||x - exact||_F / ||exact||_F`` (the quantity the bound is about), and ``n_above``,
    the number of elements with ``|x_i - exact_i| > bound * (|exact_i| + rms(exact))``: a
    mixed relative/absolute elementwise reading of the same bound that points at *where*
    an error sits (a missing tile shows up as a block of rows).

The bound (:func:`error_bound`)
    Every schedule executes the arithmetic of ``docs/design.md`` section 5: fp32 products and
    sums, with operands rounded to the storage format (unit roundoff ``u``: ``2**-8`` bf16,
    ``2**-11`` fp16) at fixed points. Schedules differ only in the order of fp32 sums. To
    first order each rounding to the storage format multiplies one value by ``1 + delta``,
    ``|delta| <= u``, and contributes ``delta * term`` to an output:

    - ``O = round(round(P) V)``: terms ``P_rc V_c``; the final rounding.
    - ``dV = round(round(P)^T dO)``: terms ``P_rc dO_r``; the final rounding.
    - ``dQ = round(scale * round(dS) K)``: terms ``scale dS_rc K_c``; the error
      ``dD_r = sum_j dO_rj err(O_rj)`` of ``D = rowsum(dO * O)`` computed from the forward's
      rounded ``O`` (its terms are ``P_rc dP_rc``, from the rounding of ``P``, and
      ``dO_rj O_rj``), which enters every ``dS_rc`` of the row as ``-P_rc dD_r`` and so
      ``dQ_r`` as ``-scale dD_r (P K)_r``; the final rounding.
    - ``dK = round(scale * round(dS)^T Q)``: terms ``scale dS_rc Q_r``; ``-scale P_rc dD_r Q_r``
      summed over ``r``; the final rounding (GQA: the terms of all query heads of the group).
    - softcap: ``dS`` is the capped one times ``g = 1 - t**2`` (``0 < g <= 1``) before it is
      rounded, so the terms above take that ``dS``, and ``dD_r`` enters ``dS_rc`` as
      ``-g_rc P_rc dD_r``: ``P`` becomes ``g P`` in the two ``dD`` terms. The softcap's own
      operations are fp32 (``x``, ``x / softcap``, ``tanh``, ``softcap * t``: a few ``u32``
      relative in each logit, the size of the product's own rounding), so they add no
      term of order ``u``.
    - the sink gradient ``dsink_h = -sum_r P_sink,r D_r``: terms ``P_sink,r dD_r`` (``D`` from
      the rounded ``O``); the sink column itself is never rounded to the storage format
      (it has no value vector); the final rounding (to the sink's dtype). The fp32 sum over
      the ``B S_q`` rows is ``n_acc = d + B S_q`` (:func:`error_bound`'s ``batch``).

    Gradual underflow: a value below the format's normal range (``|x| < tiny``, its
    smallest normal: ``2**-14`` fp16, ``2**-126`` bf16) is rounded with an absolute error
    of up to half the smallest subnormal, ``u * tiny``, whatever its size, so every rounded
    value above counts as ``max(|x|, tiny)`` (an exact zero, such as a masked ``P``, as 0).
    In fp16 this is what a tiny ``P`` takes (a sink logit far above a row's scores puts
    every ``P`` of the row there), and the relative model alone would not cover it.

    The rounding errors are independent with mean zero, so the squared error norm has
    expectation at most ``u**2 * M**2``, ``M**2`` the sum of the squared norms of all terms
    (the final rounding counts ``||exact||**2``). :func:`reference_grads` computes the
    *rounding-error magnification* ``kappa = M / ||exact||_F`` of each output (in float64 from
    the exact intermediates: a magnitude, not part of the exact path;
    ``HighPrecResult.kappa``). It is about 1.4 to 1.9 for zero-mean random inputs and
    grows where the output cancels (keys with a large common offset make ``dS K`` cancel,
    since the rows of ``dS`` sum to zero: ``kappa_dQ`` of 50 and more). The fp32 operations
    (``u32 = 2**-24``: the ``Q K^T`` and ``dO V^T`` products, ``exp2``, the fp32 ``LSE``, sums over
    ``S_k`` for dQ, ``S_q * H/H_kv`` for dK/dV and ``d``) are covered by their worst case
    ``n_acc * u32``, ``n_acc = d + max(S_q * H/H_kv, S_k)``, added without a safety factor
    (below ``0.1 u`` for bf16 at the shapes mpmath can check). The bound is::

        normwise <= safety * kappa * u + n_acc * u32,        safety = 2

    about ``3.5 u`` (1.4 % for bf16, 0.17 % for fp16) on well-conditioned inputs.
    Without ``kappa`` (:func:`error_bound` called on its own) ``kappa = 2`` is assumed,
    which is right only for well-conditioned inputs.

    Why ``safety = 2``: a round-to-nearest relative error of a value with a random
    significand has an rms of about ``0.42 u`` (``E delta**2 = (u**2 / 3) E[1/m**2]``,
    ``m`` in [1, 2)), so the model predicts ``normwise ~ 0.42 kappa u``; measured on random
    and on deliberately ill-conditioned problems (offset keys, values or gradients, peaked
    softmax, causal with ``S_q != S_k``, GQA) it is ``0.3`` to ``0.5 kappa u``
    (``tests/test_highprec.py``). The norm sums many independent errors and concentrates,
    so correct results stay a factor of 4 below the bound; on problems with a handful of
    output elements, where it cannot concentrate, the largest value seen in 9000 random
    draws was ``1.17 kappa u``, still under it. A wrong gradient is wrong by a fraction of
    its own size: dropping ``D``, a wrong scale or a lost dQ tile partial gives normwise
    errors of 10 % to 100 %, 15 to 60 times the bf16 bound and over 100 times the fp16
    one. Because ``kappa`` tracks the conditioning, the bound stays this tight on
    well-conditioned inputs and still holds on ill-conditioned ones, where any fixed
    relative bound either fails or is too loose to catch anything.

    A problem whose exact output is all zero (every row sees at most one key makes
    ``dQ = 0``) has no relative error; its ``kappa`` is inf (0 if no term can be wrong) and
    the bound says nothing: check absolute errors there (``floor`` in :func:`error_report`).
    At long sequences a lost partial is a small part of the whole norm; ``n_above`` then
    still points at the rows it damaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import mpmath
import numpy as np
import torch

from dash_ref._checks import integer, number
from dash_ref.arithmetic.numerics import ulp_error, unit_roundoff
from dash_ref.cpu import single_threaded
from dash_ref.schedules.mask import Mask

__all__ = [
    "GRADS",
    "KAPPA_DEFAULT",
    "SAFETY",
    "ErrorReport",
    "HighPrecResult",
    "error_bound",
    "error_report",
    "grad_error_reports",
    "reference_grads",
]

#: Safety factor of :func:`error_bound` (justified in the module docstring).
SAFETY = 2.0
#: ``kappa`` assumed by :func:`error_bound` when none is given (well-conditioned inputs).
KAPPA_DEFAULT = 2.0
#: Outputs with a bound.
GRADS = ("o", "dq", "dk", "dv")
_U32 = 2.0**-24
LAYOUTS = ("bshd", "bhsd")


# -- exact integer blocks ---------------------------------------------------------------
class _Exact:
    """A matrix of exact binary numbers: ``n * 2**e`` with ``n`` Python ints, one ``e``."""

    __slots__ = ("e", "n")

    def __init__(self, n: np.ndarray, e: int) -> None:
        self.n = n
        self.e = e

    @staticmethod
    def from_pairs(mans: Sequence[int], exps: Sequence[int], shape: tuple[int, ...]) -> _Exact:
        nz = [e for m, e in zip(mans, exps, strict=True) if m]
        base = min(nz) if nz else 0
        vals = [m << (e - base) if m else 0 for m, e in zip(mans, exps, strict=True)]
        arr = np.empty(len(vals), dtype=object)
        arr[:] = vals
        return _Exact(arr.reshape(shape), base)

    @staticmethod
    def from_tensor(t: torch.Tensor) -> _Exact:
        flat = t.detach().to(torch.float64).cpu().reshape(-1).tolist()
        mans, exps = [], []
        for x in flat:
            if not math.isfinite(x):
                raise ValueError("reference_grads needs finite inputs")
            num, den = x.as_integer_ratio()
            e = 1 - den.bit_length()  # den is a power of two
            if num:
                tz = (num & -num).bit_length() - 1
                num >>= tz
                e += tz
            mans.append(num)
            exps.append(e)
        return _Exact.from_pairs(mans, exps, tuple(t.shape))

    @staticmethod
    def from_mpf(x: mpmath.mpf) -> _Exact:
        m, e = x.man_exp
        arr = np.empty((), dtype=object)
        arr[()] = int(m)
        return _Exact(arr, int(e))

    def _shifted(self, e: int) -> np.ndarray:
        return self.n if e == self.e else self.n * (1 << (self.e - e))

    def __add__(self, other: _Exact) -> _Exact:
        e = min(self.e, other.e)
        return _Exact(self._shifted(e) + other._shifted(e), e)

    def __sub__(self, other: _Exact) -> _Exact:
        e = min(self.e, other.e)
        return _Exact(self._shifted(e) - other._shifted(e), e)

    def __mul__(self, other: _Exact) -> _Exact:
        return _Exact(self.n * other.n, self.e + other.e)

    def __matmul__(self, other: _Exact) -> _Exact:
        return _Exact(self.n @ other.n, self.e + other.e)

    @property
    def T(self) -> _Exact:  # noqa: N802
        return _Exact(self.n.T, self.e)

    def rowsum(self) -> _Exact:
        return _Exact(self.n.sum(axis=-1), self.e)

    def column(self) -> _Exact:
        return _Exact(self.n[:, None], self.e)

    def to_f64(self) -> np.ndarray:
        """Correctly rounded float64 values (CPython's int true division is exact-rounding)."""
        e = self.e
        if e >= 0:
            vals = [float(int(v) << e) for v in self.n.reshape(-1)]
        else:
            d = 1 << -e
            vals = [int(v) / d for v in self.n.reshape(-1)]
        return np.array(vals, dtype=np.float64).reshape(self.n.shape)


def _zeros(shape: tuple[int, ...]) -> _Exact:
    arr = np.empty(shape, dtype=object)
    arr.fill(0)
    return _Exact(arr, 0)


# -- reference ------------------------------------------------------------------------------
@dataclass(frozen=True)
class HighPrecResult:
    """Exact attention outputs rounded to float64, in the layout of the inputs."""

    o: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    layout: str = "bshd"
    kappa: dict[str, float] = field(default_factory=dict)
    dsink: torch.Tensor | None = None  # (H,), with learnable_sink


def _visible(causal: bool, s_q: int, s_k: int,
             window_size: tuple[int, int] | None = (-1, -1)) -> list[range]:
    """The keys each query row sees (:meth:`dash_ref.schedules.mask.Mask.keys`)."""
    mask = Mask.of(causal, window_size)
    return [mask.keys(r, s_q, s_k) for r in range(s_q)]


@single_threaded
def reference_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    dps: int = 50,
    layout: str = "bshd",
    *,
    window_size: tuple[int, int] | None = (-1, -1),
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> HighPrecResult:
    """Exact O, LSE, dQ, dK, dV of softmax attention (see the module docstring), as float64.

    ``q, do``: ``(B, S_q, H, d)`` / ``(B, S_q, H, d_v)``; ``k, v``: ``(B, S_k, H_kv, d)`` /
    ``(B, S_k, H_kv, d_v)`` (``layout="bhsd"`` swaps the S and H axes). Any float dtype;
    values are taken exactly. ``softmax_scale`` defaults to ``1/sqrt(d)``; ``dps`` is the
    mpmath precision (decimal digits) of exp, log, division, tanh and an irrational scale.
    ``window_size``, ``softcap`` and ``learnable_sink`` (``(H,)``; its exact gradient is
    ``HighPrecResult.dsink``) as in the module docstring. ``kappa`` takes ``q``'s dtype as
    the storage format (its smallest normal: gradual underflow).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if dps < 30:
        raise ValueError(f"dps must be at least 30, got {dps}")
    if layout == "bhsd":
        q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or do.dim() != 4:
        raise ValueError("q, k, v, do must be 4-D")
    bsz, s_q, heads, d = q.shape
    s_k, heads_kv, d_v = k.shape[1], k.shape[2], v.shape[3]
    if k.shape != (bsz, s_k, heads_kv, d) or v.shape[:3] != (bsz, s_k, heads_kv):
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if do.shape != (bsz, s_q, heads, d_v):
        raise ValueError(f"do must have shape {(bsz, s_q, heads, d_v)}, got {tuple(do.shape)}")
    if heads_kv < 1 or heads % heads_kv:
        raise ValueError(f"H ({heads}) must be a multiple of H_kv ({heads_kv})")
    group = heads // heads_kv
    rows = _visible(causal, s_q, s_k, window_size)
    cap = number("softcap", softcap, minimum=0.0)
    if learnable_sink is not None and tuple(learnable_sink.shape) != (heads,):
        raise ValueError(f"learnable_sink must have shape ({heads},), got "
                         f"{tuple(learnable_sink.shape)}")
    sinks = (None if learnable_sink is None
             else [float(x) for x in learnable_sink.detach().double().tolist()])
    dsink = None if sinks is None else [_zeros((1,)) for _ in range(heads)]

    o = np.zeros((bsz, s_q, heads, d_v))
    lse = np.full((bsz, heads, s_q), -np.inf)
    dq = np.zeros((bsz, s_q, heads, d))
    dk = np.zeros((bsz, s_k, heads_kv, d))
    dv = np.zeros((bsz, s_k, heads_kv, d_v))

    with mpmath.workdps(dps):
        if softmax_scale is None:
            scale_mp = 1 / mpmath.sqrt(d) if d > 0 else mpmath.mpf(1)
        else:
            scale_mp = mpmath.mpf(float(softmax_scale))
        scale = _Exact.from_mpf(scale_mp)
        scale2 = float(scale_mp) ** 2
        cap_mp = mpmath.mpf(cap) if cap else None
        mag = dict.fromkeys(GRADS + (("dsink",) if sinks else ()), 0.0)  # squared terms
        tiny = storage_tiny(q.dtype)
        for b in range(bsz):
            kk = [_Exact.from_tensor(k[b, :, g]) for g in range(heads_kv)]
            vv = [_Exact.from_tensor(v[b, :, g]) for g in range(heads_kv)]
            dk_acc = [_zeros((s_k, d)) for _ in range(heads_kv)]
            dv_acc = [_zeros((s_k, d_v)) for _ in range(heads_kv)]
            for h in range(heads):
                g = h // group
                qh = _Exact.from_tensor(q[b, :, h])
                doh = _Exact.from_tensor(do[b, :, h])
                p, lse_h, t, p_sink = _softmax(qh @ kk[g].T * scale, rows, cap_mp,
                                               None if sinks is None else sinks[h])
                lse[b, h] = lse_h
                oh = p @ vv[g]
                dp = doh @ vv[g].T
                delta = (doh * oh).rowsum().column()
                ds = p * (dp - delta)
                factor = None
                if t is not None:  # d(softcap tanh(x / softcap)) / dx = 1 - t^2, exactly
                    factor = _ones(t.n.shape) - t * t
                    ds = ds * factor
                if p_sink is not None:
                    terms = p_sink * delta  # (S_q, 1): P_sink D per row, exact
                    total = np.empty(1, dtype=object)
                    total[0] = terms.n.sum()
                    dsink[h] = dsink[h] - _Exact(total, terms.e)
                o[b, :, h] = oh.to_f64()
                dq[b, :, h] = ((ds @ kk[g]) * scale).to_f64()
                add_rounding_magnitudes(
                    mag, scale2, p.to_f64(), ds.to_f64(), dp.to_f64(), o[b, :, h],
                    *(t.detach().to(torch.float64).numpy()
                      for t in (q[b, :, h], k[b, :, g], v[b, :, g], do[b, :, h])),
                    g=None if factor is None else factor.to_f64(),
                    p_sink=None if p_sink is None else p_sink.to_f64()[:, 0], tiny=tiny,
                )
                dk_acc[g] = dk_acc[g] + ds.T @ qh
                dv_acc[g] = dv_acc[g] + p.T @ doh
            for g in range(heads_kv):
                dk[b, :, g] = (dk_acc[g] * scale).to_f64()
                dv[b, :, g] = dv_acc[g].to_f64()

    out = [torch.from_numpy(t) for t in (o, dq, dk, dv)]
    if layout == "bhsd":
        out = [t.transpose(1, 2).contiguous() for t in out]
    o_t, dq_t, dk_t, dv_t = out
    outputs = {"o": o, "dq": dq, "dk": dk, "dv": dv}
    dsink_t = None
    if dsink is not None:
        outputs["dsink"] = np.array([float(x.to_f64()[0]) for x in dsink])
        dsink_t = torch.from_numpy(outputs["dsink"])
    kappa = kappas(mag, outputs, tiny)
    return HighPrecResult(o_t, torch.from_numpy(lse), dq_t, dk_t, dv_t, layout, kappa,
                          dsink_t)


def add_rounding_magnitudes(
    mag: dict[str, float],
    scale2: float,
    p: np.ndarray,
    ds: np.ndarray,
    dp: np.ndarray,
    o: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    g: np.ndarray | None = None,
    p_sink: np.ndarray | None = None,
    tiny: float = 0.0,
) -> None:
    """Add one head's squared rounding-term magnitudes (model in the module docstring).

    All arguments are float64 arrays of one (batch, head): ``p, ds, dp`` are ``(S_q, S_k)``,
    ``o, q, do`` are ``(S_q, d)`` (``o``, ``do``: ``d_v``) and ``k, v`` are ``(S_k, d)``.
    With softcap, ``ds`` is the gradient of the uncapped scores and ``g`` the factor
    ``1 - t**2`` it took (``(S_q, S_k)``); with a sink, ``p_sink`` is its probability per
    row (``(S_q,)``) and ``mag["dsink"]`` grows. ``tiny``: the storage format's smallest
    normal (:func:`rounded_size`; 0: no underflow). Magnitudes only need a few digits, so
    float64 copies of the exact values (or a float64 computation) serve.
    """
    pr, dsr, orr = (rounded_size(t, tiny) for t in (p, ds, o))  # the rounded values
    p2, ds2 = pr * pr, dsr * dsr
    pg = p if g is None else p * g  # how the error of D reaches dS
    pg2 = p * p if g is None else pg * pg
    qn, kn, vn, don = ((t * t).sum(axis=1) for t in (q, k, v, do))
    w = (p2 * dp * dp).sum(axis=1) + (do * do * orr * orr).sum(axis=1)  # E dD_r^2 / u^2
    pk = pg @ k
    mag["o"] += float((p2 @ vn).sum())
    mag["dv"] += float(p2.sum(axis=1) @ don)
    mag["dq"] += scale2 * float((ds2 @ kn).sum() + (w * (pk * pk).sum(axis=1)).sum())
    mag["dk"] += scale2 * float(ds2.sum(axis=1) @ qn + (pg2.sum(axis=1) * w) @ qn)
    if p_sink is not None:
        mag["dsink"] = mag.get("dsink", 0.0) + float((p_sink * p_sink) @ w)


def rounded_size(x: np.ndarray, tiny: float) -> np.ndarray:
    """What the error of rounding ``x`` scales with: ``max(|x|, tiny)``, ``tiny`` the
    format's smallest normal (gradual underflow, module docstring), and 0 where ``x`` is an
    exact zero (its rounding is exact)."""
    return np.where(x != 0, np.maximum(np.abs(x), tiny), 0.0)


def final_rounding(name: str, exact: np.ndarray, tiny: float) -> float:
    """The squared magnitude of output ``name``'s final rounding: to the storage format of
    smallest normal ``tiny``, ``dsink`` to fp32 (its underflow left out)."""
    size = rounded_size(exact, tiny if name in GRADS else 0.0)
    return float(np.sum(size * size))


def storage_tiny(dtype: torch.dtype) -> float:
    """The smallest normal of the storage format ``dtype`` (:func:`rounded_size`)."""
    return float(torch.finfo(dtype).smallest_normal)


def kappas(mag: dict[str, float], outputs: dict[str, np.ndarray], tiny: float = 0.0
           ) -> dict[str, float]:
    """``kappa = M / ||exact||`` per output, ``M**2`` the magnitudes plus the final rounding
    (:func:`final_rounding`)."""
    kappa = {}
    for name, t in outputs.items():
        norm2 = float(np.sum(t * t))
        total = mag[name] + final_rounding(name, t, tiny)
        kappa[name] = math.sqrt(total / norm2) if norm2 > 0 else (math.inf if total else 0.0)
    return kappa


def _ones(shape: tuple[int, ...]) -> _Exact:
    arr = np.empty(shape, dtype=object)
    arr.fill(1)
    return _Exact(arr, 0)


def _softmax(logits: _Exact, rows: list[range], cap: mpmath.mpf | None = None,
             sink: float | None = None
             ) -> tuple[_Exact, list[float], _Exact | None, _Exact | None]:
    """Row softmax of exact logits over the visible keys, in mpf; masked entries exactly 0.

    ``cap``: the logits become ``cap * tanh(x / cap)``, and ``t = tanh(x / cap)`` is returned
    (exact binary values of the mpf results; 0 where masked), else None. ``sink``: one more
    column of that logit and no value; its probability per row is returned as an
    ``(S_q, 1)`` block, else None. Returns ``(P, LSE per row, t, P_sink)``.
    """
    s_q, s_k = logits.n.shape
    mans: list[int] = [0] * (s_q * s_k)
    exps: list[int] = [0] * (s_q * s_k)
    t_mans: list[int] = [0] * (s_q * s_k)
    t_exps: list[int] = [0] * (s_q * s_k)
    sink_mans: list[int] = [0] * s_q
    sink_exps: list[int] = [0] * s_q
    lse: list[float] = []
    e = logits.e
    sink_mp = None if sink is None else mpmath.mpf(sink)
    for r, cols in enumerate(rows):
        if not cols and sink_mp is None:
            lse.append(-math.inf)
            continue
        z = [mpmath.mpf((int(logits.n[r, c]), e)) for c in cols]
        if cap is not None:
            tz = [mpmath.tanh(x / cap) for x in z]
            for c, x in zip(cols, tz, strict=True):
                m, ex = x.man_exp
                t_mans[r * s_k + c], t_exps[r * s_k + c] = int(m), int(ex)
            z = [cap * x for x in tz]
        zmax = max(z + ([sink_mp] if sink_mp is not None else []))
        ez = [mpmath.exp(x - zmax) for x in z]
        total = mpmath.fsum(ez + ([mpmath.exp(sink_mp - zmax)] if sink_mp is not None else []))
        for c, x in zip(cols, ez, strict=True):
            m, ex = (x / total).man_exp
            mans[r * s_k + c] = int(m)
            exps[r * s_k + c] = int(ex)
        if sink_mp is not None:
            m, ex = (mpmath.exp(sink_mp - zmax) / total).man_exp
            sink_mans[r], sink_exps[r] = int(m), int(ex)
        lse.append(float(zmax + mpmath.log(total)))
    t = None if cap is None else _Exact.from_pairs(t_mans, t_exps, (s_q, s_k))
    p_sink = None if sink_mp is None else _Exact.from_pairs(sink_mans, sink_exps, (s_q, 1))
    return _Exact.from_pairs(mans, exps, (s_q, s_k)), lse, t, p_sink


# -- metrics and bound ---------------------------------------------------------------------
@dataclass(frozen=True)
class ErrorReport:
    """Accuracy of one output against the exact values (see the module docstring)."""

    max_ulp: float
    normwise: float
    bound: float
    n_above: int
    numel: int

    @property
    def passed(self) -> bool:
        """True if the normwise error meets the bound."""
        return self.normwise <= self.bound


def _kappa(value: object) -> float:
    """A magnification: a number >= 0, inf allowed (an exact output of zero), NaN not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"kappa must be a number, got {value!r} ({type(value).__name__})")
    if math.isnan(value) or value < 0:
        raise ValueError(f"kappa must be >= 0 (inf allowed), got {value}")
    return float(value)


def error_bound(
    dtype: torch.dtype,
    grad: str = "dq",
    kappa: float | None = None,
    *,
    seqlen_q: int = 0,
    seqlen_k: int = 0,
    head_dim: int = 0,
    group: int = 1,
    batch: int = 1,
    safety: float = SAFETY,
) -> float:
    """Normwise relative error bound ``safety * kappa * u + n_acc * 2**-24`` for one output.

    ``grad`` is ``"o"``, ``"dq"``, ``"dk"``, ``"dv"`` or ``"dsink"`` (the learnable sinks'
    gradient); ``u = unit_roundoff(dtype)``, ``dtype`` the inputs' (for ``"dsink"`` too: its
    errors come from the rounded ``O``); ``kappa`` is ``HighPrecResult.kappa[grad]``
    (default :data:`KAPPA_DEFAULT`); the shape arguments give
    ``n_acc = head_dim + max(seqlen_q * group, seqlen_k)`` (0 if left out), for
    ``"dsink"`` ``head_dim + batch * seqlen_q`` (its sum runs over every query row).
    """
    if grad not in (*GRADS, "dsink"):
        raise ValueError(f"grad must be one of {(*GRADS, 'dsink')}, got {grad!r}")
    kappa = KAPPA_DEFAULT if kappa is None else _kappa(kappa)
    safety = number("safety", safety, minimum=0)
    seqlen_q, seqlen_k, head_dim = (integer(n, x, minimum=0) for n, x in (
        ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k), ("head_dim", head_dim)))
    group = integer("group", group, minimum=1)
    batch = integer("batch", batch, minimum=1)
    n_acc = (head_dim + batch * seqlen_q if grad == "dsink"
             else head_dim + max(seqlen_q * group, seqlen_k))
    return safety * kappa * unit_roundoff(dtype) + n_acc * _U32


def error_report(
    x: torch.Tensor,
    exact: torch.Tensor,
    dtype: torch.dtype | None = None,
    bound: float | None = None,
    floor: float = 0.0,
) -> ErrorReport:
    """Max ULP error, normwise relative error and elements above ``bound`` of ``x`` vs ``exact``.

    ``dtype`` (the output format whose ULPs are counted) defaults to ``x.dtype``; ``bound``
    defaults to ``error_bound(dtype, "dq")``. The normwise error divides by
    ``max(||exact||_F, floor)``; with both zero it is 0 if ``x`` is all zero, else inf.
    """
    dtype = x.dtype if dtype is None else dtype
    bound = error_bound(dtype) if bound is None else float(bound)
    if x.shape != exact.shape:
        raise ValueError(f"shape mismatch: {tuple(x.shape)} vs {tuple(exact.shape)}")
    xe = x.detach().to(torch.float64)
    ex = exact.detach().to(torch.float64)
    err = (xe - ex).abs()
    numel = ex.numel()
    if numel == 0:
        return ErrorReport(0.0, 0.0, bound, 0, 0)
    max_ulp = float(ulp_error(xe, ex, dtype).max())
    num = float(torch.linalg.vector_norm(err))
    den = max(float(torch.linalg.vector_norm(ex)), floor)
    normwise = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    rms = float(torch.linalg.vector_norm(ex)) / math.sqrt(numel)
    n_above = int((err > bound * (ex.abs() + rms)).sum())
    return ErrorReport(max_ulp, normwise, bound, n_above, numel)


def grad_error_reports(
    exact: HighPrecResult,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    dtype: torch.dtype | None = None,
) -> dict[str, ErrorReport]:
    """:func:`error_report` of dQ, dK, dV against ``exact``, each with its own bound.

    The bounds use ``exact.kappa`` and the shape of the problem (:func:`error_bound`).
    """
    dtype = dq.dtype if dtype is None else dtype
    s_ax, h_ax = (1, 2) if exact.layout == "bshd" else (2, 1)
    shape = {
        "seqlen_q": exact.dq.shape[s_ax],
        "seqlen_k": exact.dk.shape[s_ax],
        "head_dim": max(exact.dq.shape[3], exact.dv.shape[3]),
        "group": exact.dq.shape[h_ax] // exact.dk.shape[h_ax],
    }
    got = {"dq": dq, "dk": dk, "dv": dv}
    return {
        name: error_report(
            got[name],
            getattr(exact, name),
            dtype,
            error_bound(dtype, name, exact.kappa.get(name), **shape),
        )
        for name in ("dq", "dk", "dv")
    }
