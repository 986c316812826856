"""The CuTe backend: warp-specialized Hopper kernels in CuTe DSL (``nvidia-cutlass-dsl``).

- :mod:`.fwd_kernel`: the persistent forward. A loader warp streams Q per tile and K/V per
  KV tile through TMA and mbarrier pipelines; two math warpgroups run the online softmax
  with wgmma; O leaves by TMA stores, LSE2 in the convention both backwards read;
- :mod:`.bwd_kernel`: the persistent backward. A loader warp streams K/V per chain and
  Q/dO/LSE2/D per visit; two MMA warpgroups compute every step of a visit with wgmma; a dQ
  writer warp adds each staged partial into dQacc in its tile's dQ order, overlapped with
  the next visit's MMAs;
- :mod:`.ptx`, :mod:`.layouts`: the contract's inline instructions, the shared layouts;
- :mod:`.launch`: compiled kernels (in memory, or exported ahead of time), buffers, launch;
- :mod:`.finish_dq`: the dQ epilogue from the staged tiles (a Triton kernel: this backend
  needs Triton too);
- :mod:`.contract`: which instruction each step of the arithmetic contract becomes;
- :mod:`.inspect_ptx`: compiles every variant for sm_90a on any machine and checks the PTX.

It runs head dims 64, 96, 128, 192 (also with d_v = 128) and 256 in the fast arithmetic
(at 192 and 256 the backward's warpgroups split the head dims), every mask (full, causal, sliding
windows: :mod:`.mask`), rectangular and packed batches (:data:`PACKED_BACKWARD`), with or
without learnable sinks (folded into the forward's rows: step ``fwd_sink``).
Importing this package imports no CuTe DSL; :data:`BACKEND` loads it on first use.
"""

from __future__ import annotations

import importlib.util

import torch

from ...backends import FEATURES, Case, Launch
from .config import (
    HEAD_DIMS,
    SOFTCAP_HEAD_DIMS,
    VALUE_HEAD_DIMS,
    value_head_dims,
)

#: packed batches (cu_seqlens) run on this backend, forward and backward; False refuses
#: them (``backend="auto"`` then runs them on Triton): the one switch for packed calls
PACKED_BACKWARD = True


class CuteBackend:
    """The CuTe DSL kernels behind the :class:`dash_cuda.backends.Backend` interface."""

    name = "cute"
    #: the dQ hand-off is a TMA bulk reduce-add: RNE, subnormals kept (measured on an H200)
    dq_add_flushes_subnormals = False
    #: its default arithmetic is reproduced by ``dash_ref``'s ``FAST`` (MUFU models, pairwise
    #: ``D``, dQ adds that keep subnormals): the L2 level holds for default runs
    default_arithmetic = "fast"
    #: learnable sinks in its forward (the backward needs nothing more); a softcap in both
    features: frozenset[str] = frozenset(FEATURES)

    def missing(self) -> str | None:
        for module, package in (("cutlass", "nvidia-cutlass-dsl"),
                                ("cuda.bindings", "nvidia-cutlass-dsl"),
                                ("tvm_ffi", "apache-tvm-ffi"),
                                ("triton", "triton")):  # finish_dq and the shared prepost
            if importlib.util.find_spec(module) is None:
                return (f"{module} is not importable: install {package} "
                        "(pip install 'dash-attention[gpu]')")
        return None

    def unsupported(self, case: Case) -> str | None:
        if case.exact:
            return "exact=True runs on the Triton backend only"
        if case.packed and not PACKED_BACKWARD:
            return ("packed batches (cu_seqlens) run on the Triton backend only: this "
                    "backend's packed backward is switched off (PACKED_BACKWARD)")
        if case.head_dim not in HEAD_DIMS:
            return f"head dim {case.head_dim} (supported: {HEAD_DIMS})"
        if case.head_dim_v not in (case.head_dim, *value_head_dims(case.head_dim)):
            return (f"value head dim {case.head_dim_v} at head dim {case.head_dim} "
                    f"(supported: d_v = d, or {VALUE_HEAD_DIMS})")
        if case.dtype not in (torch.bfloat16, torch.float16):
            return f"dtype {case.dtype}"
        if case.softcap and case.head_dim not in SOFTCAP_HEAD_DIMS:
            return (f"softcap at head dim {case.head_dim} (supported: {SOFTCAP_HEAD_DIMS}: "
                    "at 64 the backward's registers would serialize its wgmmas)")
        return None

    def backward_tiles(self, head_dim: int, mask: str, head_dim_v: int | None = None
                       ) -> tuple[int, int]:
        from .config import backward_config

        cfg = backward_config(head_dim, mask, head_dim_v=head_dim_v)
        return cfg.block_m, cfg.block_n

    def forward_block_n(self, head_dim: int) -> int:
        """Keys per KV tile of the forward: its bits depend on it (``dash_ref``'s fast
        forward takes it), not on the query tile."""
        from .config import forward_block_n

        return forward_block_n(head_dim)

    def forward(self, q, k, v, mask, softmax_scale, poison, softcap=0.0, sink2=None):
        from .launch import run_forward

        return run_forward(q, k, v, mask, softmax_scale, poison, sink2=sink2, softcap=softcap)

    def bind_forward(self, q, k, v, o, mask, softmax_scale, sinks=False):
        from .launch import bind_forward

        return bind_forward(q, k, v, o, mask, softmax_scale, sinks)

    def forward_varlen(self, q, k, v, packing, mask, softmax_scale, poison, softcap=0.0,
                       sink2=None):
        from .launch import run_forward_varlen

        return run_forward_varlen(q, k, v, packing, mask, softmax_scale, poison, sink2=sink2,
                                  softcap=softcap)

    def dq_acc_shape(self, problem):
        from .launch import dq_acc_shape

        return dq_acc_shape(problem)

    def dq_acc_rows(self, dq_acc, problem):
        from .launch import dq_acc_rows

        return dq_acc_rows(dq_acc, problem)

    def finish_dq(self, dq_acc, dq, problem, softmax_scale):
        from .finish_dq import finish_dq_packed, finish_dq_tiles

        if problem.is_packed:
            finish_dq_packed(dq_acc, dq, softmax_scale, problem)
        else:
            finish_dq_tiles(dq_acc, dq, softmax_scale, problem.block_m)

    def new_partials(self, num_visits, problem, device):
        return torch.empty(num_visits, problem.block_m * problem.head_dim, device=device,
                           dtype=torch.float32)

    def partials_rows(self, partials, problem):
        from .launch import tiles_to_rows

        return tiles_to_rows(partials, problem.block_m, problem.head_dim)

    def max_workers(self, launch: Launch) -> int:
        from .launch import max_workers

        return max_workers(launch)

    def run_schedule(self, launch: Launch) -> None:
        from .launch import run_schedule

        run_schedule(launch)

    def bind_schedule(self, launch: Launch):
        from .launch import bind_schedule

        return bind_schedule(launch)

    def bind_finish_dq(self, dq_acc, dq, problem, softmax_scale):
        """:meth:`finish_dq` of a rectangular problem as a bound launch taking ``(dq_acc,
        dq)``, or None (packed problems)."""
        from ...triton_launch import bind
        from .finish_dq import finish_dq_launch

        if problem.is_packed:
            return None
        kernel, grid, args, named, options = finish_dq_launch(dq_acc, dq, softmax_scale,
                                                              problem.block_m)
        return bind(kernel, grid, args, named, (dq_acc, dq), **options)


BACKEND = CuteBackend()
