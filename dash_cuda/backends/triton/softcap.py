"""FlashAttention's logit softcap in the Triton kernels, written once for both passes.

The scores become ``softcap * tanh(S * softmax_scale / softcap)`` (natural-log units; the
softmax then takes ``log2(e)`` alone), the order of
:func:`dash_ref.arithmetic.steps.softcap`: one fp32 multiply by the scale, a correctly
rounded division by the cap, ``tanh``, one multiply by the cap. The kernels take the cap as
``SOFTCAP``, a runtime fp32 value or None; None (no softcap) drops every use at compile
time, so those kernels compile exactly as they did before softcap existed.

The backward with ``exact=True`` caps in the ratio form instead (:func:`softcap_ratio`),
whose every step the CPU reproduces, as ``dash_ref``'s exact ``softcap`` step writes it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from dash_cuda.exp2 import exp2_fma


@triton.jit
def softcap_scores(s, softmax_scale, SOFTCAP):
    """[softcap] ``(softcap * t, t)`` with ``t = tanh(s * softmax_scale / softcap)`` for raw
    fp32 products ``s``; the backward keeps ``t`` for ``1 - t^2``.

    ``tanh`` is libdevice's ``__nv_tanhf`` (within 2 ulp), not ``tanh.approx.f32``: the
    approximation's relative error of about 2^-11 times the cap (30 to 50 in practice) is
    an absolute score error as large as a bf16 rounding of the probabilities, which would
    leave the float64 reference's bound (``verify.highprec``) no room for the rest.
    The division is ``div.rn`` (correctly rounded), as the contract step writes it.
    """
    t = libdevice.tanh(tl.math.div_rn(s * softmax_scale, SOFTCAP))
    return SOFTCAP * t, t


@triton.jit
def softcap_ratio(s, SOFTCAP_K, SOFTCAP):
    """[softcap] exact: ``(softcap * (1 - 2 r), r)`` with ``r = 1 / (1 + 2^(s k))``, ``k =
    SOFTCAP_K = fp32(2 softmax_scale log2(e) / softcap)`` (``tanh(y) = 1 - 2 / (1 +
    e^(2y))``): ``mul.rn``, the software :func:`dash_cuda.exp2.exp2_fma`, ``add.rn``, ``div.rn`` and
    one ``fma.rn``, each a rounding the CPU reproduces (the kernel is built with fp fusion
    off, so nothing else fuses). The backward keeps ``r`` for the slope ``4 r (1 - r)``."""
    r = tl.math.div_rn(1.0, exp2_fma(s * SOFTCAP_K) + 1.0)
    return tl.fma(r, -2.0 * SOFTCAP, SOFTCAP), r


@triton.jit
def softcap_slope(p, r):
    """[softcap_grad] exact: ``P * 4 fma.rn(-r, r, r)``, ``4 r (1 - r) = 1 - tanh^2`` folded
    into ``P`` before [ds] (the multiply by 4 is exact)."""
    return p * (tl.fma(-r, r, r) * 4.0)
