"""Bit-level arithmetic: rounding on raw bits, Hopper's tensor cores, and the named steps.

- :mod:`~dash_ref.arithmetic.numerics`: exact rounding (RNE, RTZ), fused multiply-adds,
  subnormal flushing, ulps;
- :mod:`~dash_ref.arithmetic.tensorcore`: the tensor-core MMA model measured on an H200;
- :mod:`~dash_ref.arithmetic.mufu`: the special-function unit's ``ex2.approx.ftz`` and
  ``lg2.approx.ftz``, bit for bit, from tables measured on an H200;
- :mod:`~dash_ref.arithmetic.exp2`: an exp2 a kernel can compute and the CPU replay;
- :mod:`~dash_ref.arithmetic.steps`: the arithmetic contract as code: every floating-point
  step of the forward and backward, one function each, in each :class:`Arithmetic`.
"""
