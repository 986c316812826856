"""What a compiled CuTe kernel is specialized on, and the one list of every shipped variant.

A variant is a value: the dtype, the head dim, the mask's kind (``"full"``, ``"causal"``,
``"window"``), the flags that change the kernel's code (deterministic, audit, per-head
dK/dV), and the configuration (:mod:`.config`) chosen for them. Shapes, strides and a
window's extents are run-time arguments. Its ``name``
says all of it, so an exported kernel (``DIR/<name>.o``) can only be loaded by the variant
it was compiled for. :func:`shipped_variants` is what warm-up exports, what the instruction
checks compile and what the tests parametrize over.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import cutlass
import torch
from cutlass import Float32

from . import arguments, bwd_kernel, fwd_kernel
from .config import (
    HEAD_DIMS,
    SOFTCAP_HEAD_DIMS,
    BackwardConfig,
    ForwardConfig,
    backward_config,
    forward_configs,
    value_head_dims,
)
from .mask import KINDS as MASK_KINDS

DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}


def _dtype_name(dtype: torch.dtype) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp16"


def _dims_name(head_dim: int, head_dim_v: int | None) -> str:
    return f"d{head_dim}" + (f"v{head_dim_v}" if head_dim_v else "")


@dataclass(frozen=True)
class Variant:
    """Everything a compiled backward is specialized on."""

    dtype: torch.dtype
    head_dim: int
    mask: str
    deterministic: bool
    audit: bool
    per_head: bool
    config: BackwardConfig
    probe: bool = False  # the timing-probe diagnostic variant (never chosen by the API)
    packed: bool = False  # a packed batch of variable lengths (cu_seqlens)
    softcap: bool = False  # a logit softcap ([softcap], [softcap_grad])
    head_dim_v: int | None = None  # the values' head dim where it is not ``head_dim``

    @property
    def name(self) -> str:
        flags = [_dtype_name(self.dtype), _dims_name(self.head_dim, self.head_dim_v), self.mask,
                 "det" if self.deterministic else "atomic"]
        flags += ["audit"] if self.audit else []
        flags += ["perhead"] if self.per_head else []
        flags += ["probe"] if self.probe else []
        flags += ["varlen"] if self.packed else []
        flags += ["cap"] if self.softcap else []
        return "_".join(["dash_bwd", *flags, self.config.name])

    def kernel_object(self) -> bwd_kernel.DashBackwardSm90:
        return bwd_kernel.DashBackwardSm90(
            DTYPES[self.dtype], self.head_dim, mask=self.mask, config=self.config,
            deterministic=self.deterministic, audit=self.audit, per_head=self.per_head,
            probe=self.probe, packed=self.packed, softcap=self.softcap,
            head_dim_v=self.head_dim_v)

    def placeholder_args(self) -> list:
        """Arguments of the right types for ``cute.compile`` (their values are never used)."""
        out = Float32 if self.per_head else DTYPES[self.dtype]
        return arguments.placeholders(bwd_kernel.LAUNCH_ARGS, DTYPES[self.dtype], out)


@dataclass(frozen=True)
class ForwardVariant:
    """Everything a compiled forward is specialized on."""

    dtype: torch.dtype
    head_dim: int
    mask: str
    config: ForwardConfig
    packed: bool = False  # a packed batch of variable lengths (cu_seqlens)
    sinks: bool = False  # learnable sinks ([fwd_sink]; LSE2 includes them)
    softcap: bool = False  # a logit softcap ([softcap] before the mask)
    head_dim_v: int | None = None  # the values' head dim where it is not ``head_dim``

    @property
    def block_m(self) -> int:
        return self.config.block_m

    @property
    def name(self) -> str:
        flags = [_dtype_name(self.dtype), _dims_name(self.head_dim, self.head_dim_v), self.mask]
        flags += ["varlen"] if self.packed else []
        flags += ["sink"] if self.sinks else []
        flags += ["cap"] if self.softcap else []
        return "_".join(["dash_fwd", *flags, self.config.name])

    def kernel_object(self) -> fwd_kernel.DashForwardSm90:
        return fwd_kernel.DashForwardSm90(DTYPES[self.dtype], self.head_dim, mask=self.mask,
                                          config=self.config, packed=self.packed,
                                          sinks=self.sinks, softcap=self.softcap,
                                          head_dim_v=self.head_dim_v)

    def placeholder_args(self) -> list:
        """Arguments of the right types for ``cute.compile`` (their values are never used)."""
        dt = DTYPES[self.dtype]
        return arguments.placeholders(fwd_kernel.LAUNCH_ARGS, dt, dt)


def backward_variant(dtype: torch.dtype, head_dim: int, mask: str, deterministic: bool,
                     audit: bool, per_head: bool, probe: bool = False,
                     packed: bool = False, softcap: bool = False,
                     head_dim_v: int | None = None) -> Variant:
    """The backward variant of a call, with the configuration :func:`.config.backward_config`
    chooses for it (a packed batch's is the rectangular one's: the tiles are the problem's;
    ``head_dim_v``: the values' head dim, None where it is ``head_dim``)."""
    head_dim_v = None if head_dim_v == head_dim else head_dim_v
    return Variant(dtype, head_dim, mask, deterministic, audit, per_head,
                   backward_config(head_dim, mask, dtype, head_dim_v), probe, packed, softcap,
                   head_dim_v)


def shipped_variants(dtypes=tuple(DTYPES), head_dims=HEAD_DIMS) -> list[Variant | ForwardVariant]:
    """Every variant a call can run: the forwards (each configuration the forward's rule can
    pick; rectangular, then packed; without, then with sinks; without, then with a softcap),
    then the backwards (deterministic and atomic; dK/dV rounded, per-head for GQA, and
    per-head with audit; rectangular, then packed; without, then with a softcap), each at
    every value head dim of its head dim (d_v = d first)."""
    out: list[Variant | ForwardVariant] = [
        ForwardVariant(dtype, d, mask, config, head_dim_v=dv)
        for dtype, d, mask in itertools.product(dtypes, head_dims, MASK_KINDS)
        for dv in value_head_dims(d) for config in forward_configs(d, mask, dv)]
    # packed batches: the same forwards, reading cu_seqlens (run_forward_varlen)
    out += [replace(v, packed=True) for v in out]
    # learnable sinks: the same forwards, folding each head's sink in after the last KV tile
    # (the backward needs nothing more: LSE2 includes the sinks)
    out += [replace(v, sinks=True) for v in out]
    # a softcap: the same forwards, capping every raw score before the mask
    out += [replace(v, softcap=True) for v in out if v.head_dim in SOFTCAP_HEAD_DIMS]
    for dtype, d, mask, det in itertools.product(dtypes, head_dims, MASK_KINDS, (True, False)):
        for dv in value_head_dims(d):
            out += [backward_variant(dtype, d, mask, det, audit=False, per_head=False,
                                     head_dim_v=dv),
                    backward_variant(dtype, d, mask, det, audit=False, per_head=True,
                                     head_dim_v=dv),
                    backward_variant(dtype, d, mask, det, audit=True, per_head=True,
                                     head_dim_v=dv)]
    # packed batches: the same backwards, reading cu_seqlens and q_tile_base (run_schedule)
    out += [replace(v, packed=True) for v in out if isinstance(v, Variant)]
    # a softcap: the same backwards, recomputing the capped scores and their slope
    out += [replace(v, softcap=True) for v in out
            if isinstance(v, Variant) and v.head_dim in SOFTCAP_HEAD_DIMS]
    return out


__all__ = ["DTYPES", "MASK_KINDS", "ForwardVariant", "Variant", "backward_variant",
           "shipped_variants"]
