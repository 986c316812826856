"""FlashAttention's logit softcap in the Triton kernels, written once for both passes.

The scores become ``softcap * tanh(S * softmax_scale / softcap)`` (natural-log units; the
softmax then takes ``log2(e)`` alone), the order of
:func:`dash_ref.arithmetic.steps.softcap`: one fp32 multiply by the scale, a correctly
rounded division by the cap, ``tanh``, one multiply by the cap. The kernels take the cap as
``SOFTCAP``, a runtime fp32 value or None; None (no softcap) drops every use at compile
time, so those kernels compile exactly as they did before softcap existed.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


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
